// Package server is den's HTTP API: routing, request validation and
// decoding, the one mapping from errors to HTTP statuses, bearer-token
// authentication for TCP listeners, and streaming of command output and
// file transfers between clients and sandbox agents.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/sandbox"
	"github.com/den-dev/den/internal/store"
)

// MaxCapture bounds each of stdout and stderr in a non-streaming exec.
const MaxCapture = 1 << 20

// Server serves den's API for one Manager.
type Server struct {
	m       *sandbox.Manager
	db      *store.DB
	creds   *sandbox.Credentials
	log     *slog.Logger
	version string
	cgroup  string
	info    api.Info
	mux     *http.ServeMux
	bodies  bodyBudget
	live    live
}

// SetInfo sets what GET /v1/info answers (its version is the server's).
func (s *Server) SetInfo(i api.Info) { s.info = i }

// New builds the API handler.
func New(m *sandbox.Manager, db *store.DB, log *slog.Logger, version, cgroup string) *Server {
	s := &Server{m: m, db: db, creds: sandbox.NewCredentials(db, log), log: log, version: version, cgroup: cgroup, mux: http.NewServeMux()}
	s.routes()
	return s
}

// ServeHTTP serves a request for the Principal its context carries (see
// AsAdmin, Authenticate, InProcess): the principal becomes the scope every
// sandbox, snapshot, volume and secret lookup is checked against, so the
// same checks hold whichever front end the request came through. A request
// without a principal is refused, except previews (their own tokens).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/preview/") {
		s.mux.ServeHTTP(w, r)
		return
	}
	p := PrincipalFrom(r.Context())
	ctx := r.Context()
	if p != nil && p.TokenID != "" {
		var done func()
		ctx, done = s.live.track(ctx, p.TokenID) // before the check: see live
		defer done()
	}
	sc, err := s.scopeFor(ctx, p)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, hold := s.bodies.hold(ctx, p)
	defer hold.release()
	s.mux.ServeHTTP(w, r.WithContext(sandbox.WithScope(ctx, sc)))
}

func (s *Server) routes() {
	h := s.mux.HandleFunc
	h("GET /v1/version", s.version_)
	h("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		i := s.info
		i.Version = s.version
		if i.Runtimes == nil {
			i.Runtimes = []api.RuntimeInfo{}
			for n, name := range s.m.Runtimes() {
				i.Runtimes = append(i.Runtimes, api.RuntimeInfo{Name: name, Available: true, Default: n == 0})
			}
		}
		if i.Cgroup == "" {
			i.Cgroup = s.cgroup
		}
		writeJSON(w, 200, i)
	})
	h("GET /v1/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(api.OpenAPI)
	})
	h("POST /v1/sandboxes", s.create)
	h("GET /v1/sandboxes", s.list)
	h("GET /v1/sandboxes/{id}", byID(s.m.Get))
	h("POST /v1/sandboxes/{id}/stop", s.stop)
	h("POST /v1/sandboxes/{id}/start", byID(s.m.Start))
	h("POST /v1/sandboxes/{id}/pause", byID(s.m.Pause))
	h("POST /v1/sandboxes/{id}/resume", byID(s.m.Resume))
	h("POST /v1/sandboxes/{id}/hibernate", byID(s.m.Hibernate))
	h("POST /v1/sandboxes/{id}/escalate", withBody(200, s.m.Escalate))
	h("DELETE /v1/sandboxes/{id}", s.remove)
	h("POST /v1/sandboxes/{id}/exec", s.exec)
	h("GET /v1/sandboxes/{id}/files", s.proxy("GET", agent.PathFiles, true))
	h("PUT /v1/sandboxes/{id}/files", s.proxy("PUT", agent.PathFiles, true))
	h("DELETE /v1/sandboxes/{id}/files", s.proxy("DELETE", agent.PathFiles, true))
	h("GET /v1/sandboxes/{id}/files/list", s.proxy("GET", agent.PathList, true))
	h("GET /v1/sandboxes/{id}/files/stat", s.proxy("GET", agent.PathStat, true))
	h("GET /v1/sandboxes/{id}/files/glob", s.proxy("GET", agent.PathGlob, false))
	h("GET /v1/sandboxes/{id}/files/grep", s.proxy("GET", agent.PathGrep, false))
	h("POST /v1/sandboxes/{id}/files/mkdir", s.proxyJSON(agent.PathMkdir, func() any { return new(api.MkdirRequest) }))
	h("POST /v1/sandboxes/{id}/files/rename", s.proxyJSON(agent.PathRename, func() any { return new(api.RenameRequest) }))
	h("GET /v1/sandboxes/{id}/archive", s.proxy("GET", agent.PathArchive, true))
	h("PUT /v1/sandboxes/{id}/archive", s.upload)
	h("POST /v1/sandboxes/{id}/processes", s.startProcess)
	h("GET /v1/sandboxes/{id}/processes", s.procProxy("GET", ""))
	h("GET /v1/sandboxes/{id}/processes/{proc}", s.procProxy("GET", ""))
	h("GET /v1/sandboxes/{id}/processes/{proc}/logs", s.procProxy("GET", agent.ProcOutput))
	h("POST /v1/sandboxes/{id}/processes/{proc}/kill", s.procProxy("POST", agent.ProcSignal))
	h("POST /v1/sandboxes/{id}/processes/{proc}/stdin", s.procProxy("POST", agent.ProcStdin))
	h("GET /v1/sandboxes/{id}/processes/{proc}/wait", s.procProxy("GET", agent.ProcWait))
	h("GET /v1/sandboxes/{id}/processes/{proc}/tty", s.tty)
	h("GET /v1/sandboxes/{id}/sessions", s.sessionProxy("GET"))
	h("DELETE /v1/sandboxes/{id}/sessions/{name}", s.sessionProxy("DELETE"))
	h("GET /v1/sandboxes/{id}/stats", byID(s.m.Stats))
	h("PUT /v1/sandboxes/{id}/network", s.setNetwork)
	h("POST /v1/sandboxes/{id}/ports", s.sharePort)
	h("GET /v1/sandboxes/{id}/ports", byID(s.m.Ports))
	h("DELETE /v1/sandboxes/{id}/ports/{port}", s.unsharePort)
	h("GET /v1/sandboxes/{id}/ports/{port}/tcp", s.tcp)
	h("/preview/{id}/{port}/{rest...}", s.preview)
	h("GET /metrics", adminOnly(s.metrics))
	h("PUT /v1/secrets/{name}", s.putSecret)
	h("GET /v1/secrets", s.listSecrets)
	h("DELETE /v1/secrets/{name}", s.deleteSecret)
	h("GET /v1/images", s.images)
	h("GET /v1/images/{name...}", s.image)
	h("DELETE /v1/images/{name...}", adminOnly(s.removeImage))
	h("POST /v1/images/import", s.importImage)
	h("POST /v1/images/pull", adminOnly(s.pullImage))
	h("POST /v1/images/build", s.buildImage)
	h("GET /v1/images/save", s.saveImages)
	h("POST /v1/images/prune", adminOnly(s.pruneImages))
	h("POST /v1/sandboxes/{id}/commit", s.commit)
	h("GET /v1/events", s.events)
	s.snapshotRoutes()
	s.tokenRoutes()
	s.gitRoutes()
	s.sshKeyRoutes()
	h("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, api.Errorf(api.KindNotFound, "no route %s %s: see GET /v1/openapi.json", r.Method, r.URL.Path))
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	var ae *api.Error
	if !errors.As(err, &ae) {
		switch {
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			ae = api.Errorf(api.KindConflict, "request cancelled: %v", err)
		default:
			ae = api.Errorf(api.KindInternal, "%v", err)
		}
	}
	writeJSON(w, api.HTTPStatus(ae.Kind), api.ErrorDoc{Error: ae})
}

func (s *Server) version_(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, 200, api.VersionInfo{Version: s.version, Go: runtime.Version(), Runtimes: s.m.Runtimes(), Cgroup: s.cgroup})
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req api.CreateRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Git != nil {
		s.createGit(w, r, req)
		return
	}
	sb, err := s.m.Create(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	if sb.From != "" {
		if err := s.carryWorkspace(r.Context(), sb.From, sb.ID); err != nil {
			s.m.Remove(context.WithoutCancel(r.Context()), sb.ID, true)
			s.gitStore().Remove(sb.ID)
			writeError(w, fmt.Errorf("create from %s: copy the git workspace: %w", sb.From, err))
			return
		}
	}
	writeJSON(w, 201, sb)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	labels := map[string]string{}
	for _, l := range r.URL.Query()["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			writeError(w, api.FieldError("label", "%q is not key=value", l))
			return
		}
		labels[k] = v
	}
	v, err := s.m.List(r.Context(), labels)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, v)
}

func boolParam(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, api.FieldError(name, "%q is not true or false", v)
	}
	return b, nil
}

// stop stops a sandbox; ?timeout= (a duration, or seconds) overrides its
// stop timeout for this stop, as docker stop -t.
func (s *Server) stop(w http.ResponseWriter, r *http.Request) {
	var timeout *api.Duration
	if v := r.URL.Query().Get("timeout"); v != "" {
		d, err := api.ParseDuration(v)
		if err != nil {
			writeError(w, api.FieldError("timeout", "%q is not a duration like 30s or a number of seconds", v))
			return
		}
		timeout = &d
	}
	sb, err := s.m.StopWithin(r.Context(), r.PathValue("id"), timeout)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, sb)
}

func (s *Server) remove(w http.ResponseWriter, r *http.Request) {
	force, err := boolParam(r, "force")
	if err != nil {
		writeError(w, err)
		return
	}
	if err := s.m.Remove(r.Context(), r.PathValue("id"), force); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}

func wantsStream(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), api.StreamContentType)
}

// capture keeps at most MaxCapture bytes.
type capture struct {
	buf       bytes.Buffer
	truncated bool
}

func (c *capture) write(p []byte) {
	if room := MaxCapture - c.buf.Len(); room < len(p) {
		p = p[:max(room, 0)]
		c.truncated = true
	}
	c.buf.Write(p)
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	// Arguments, environment and stdin travel in the body, so allow more
	// than MaxBody here; each has its own bound (sandbox.validateExec).
	if err := decodeLimit(r, &req, api.MaxExecBody); err != nil {
		writeError(w, err)
		return
	}
	if wantsStream(r) {
		s.execStream(w, r, req)
		return
	}
	var out, errb capture
	st, err := s.m.Exec(r.Context(), r.PathValue("id"), req, func(typ byte, p []byte) error {
		switch typ {
		case api.FrameStdout:
			out.write(p)
		case api.FrameStderr:
			errb.write(p)
		}
		return nil
	})
	if err != nil {
		writeError(w, reqErr(r, err))
		return
	}
	writeJSON(w, 200, api.ExecResult{ExitStatus: *st, Stdout: out.buf.Bytes(), Stderr: errb.buf.Bytes(), Truncated: out.truncated || errb.truncated})
}

func (s *Server) execStream(w http.ResponseWriter, r *http.Request, req api.ExecRequest) {
	var mu sync.Mutex
	started := false
	fl, _ := w.(http.Flusher)
	begin := func() {
		if !started {
			started = true
			w.Header().Set("Content-Type", api.StreamContentType)
			w.WriteHeader(200)
		}
	}
	st, err := s.m.Exec(r.Context(), r.PathValue("id"), req, func(typ byte, p []byte) error {
		mu.Lock()
		defer mu.Unlock()
		begin()
		if err := api.WriteFrame(w, typ, p); err != nil {
			return err
		}
		if fl != nil {
			fl.Flush()
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	err = reqErr(r, err)
	if err != nil && !started {
		writeError(w, err)
		return
	}
	begin()
	if err != nil {
		var ae *api.Error
		if !errors.As(err, &ae) {
			ae = api.Errorf(api.KindInternal, "%v", err)
		}
		api.WriteJSONFrame(w, api.FrameError, ae)
		return
	}
	api.WriteJSONFrame(w, api.FrameExit, st)
}

// proxy forwards a file request to the sandbox's agent, which resolves
// every path inside the sandbox. Only the parameters the agent knows pass.
func (s *Server) proxy(method, path string, needPath bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := url.Values{}
		in := r.URL.Query()
		for _, k := range []string{"path", "mode", "recursive", "pattern", "glob", "ignore_case", "limit"} {
			if v, ok := in[k]; ok {
				q[k] = v[:1]
			}
		}
		if needPath && q.Get("path") == "" {
			writeError(w, api.FieldError("path", "missing: add ?path=/some/file"))
			return
		}
		if _, err := boolParam(r, "recursive"); err != nil {
			writeError(w, err)
			return
		}
		var body io.Reader
		if method == "PUT" {
			body = r.Body
		}
		s.forward(w, r, method, path, q, body)
	}
}

// upload unpacks a tar into the sandbox. Its files belong to the
// sandbox's user (its default user, root without one), as an agent
// working there as that user expects; ?keep_owners=true keeps the
// archive's uid/gid instead (den cp -a).
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	if p == "" {
		writeError(w, api.FieldError("path", "missing: add ?path=/some/dir"))
		return
	}
	keep, err := boolParam(r, "keep_owners")
	if err != nil {
		writeError(w, err)
		return
	}
	q := url.Values{"path": {p}}
	// The owner is the sandbox's, known once forwardTo has looked it up
	// (and before it sends q to the agent).
	agentOf := func(ctx context.Context, id string) (*agent.Client, *api.Sandbox, error) {
		ag, sb, err := s.m.Agent(ctx, id)
		if err == nil && !keep {
			q.Set("owner", sb.User)
		}
		return ag, sb, err
	}
	s.forwardTo(w, r, agentOf, "PUT", agent.PathArchive, q, r.Body)
}

func (s *Server) proxyJSON(path string, newReq func() any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req := newReq()
		if err := decode(r, req); err != nil {
			writeError(w, err)
			return
		}
		b, _ := json.Marshal(req)
		s.forward(w, r, "POST", path, nil, bytes.NewReader(b))
	}
}

func (s *Server) forward(w http.ResponseWriter, r *http.Request, method, path string, q url.Values, body io.Reader) {
	s.forwardTo(w, r, s.m.Agent, method, path, q, body)
}

// forwardTo is forward with the agent looked up by agentOf: Agent wakes a
// sleeping sandbox, ReadAgent (for read-only calls) leaves it asleep.
func (s *Server) forwardTo(w http.ResponseWriter, r *http.Request, agentOf func(context.Context, string) (*agent.Client, *api.Sandbox, error), method, path string, q url.Values, body io.Reader) {
	ag, _, err := agentOf(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	resp, err := ag.Do(r.Context(), method, path, q, body, nil)
	if err != nil {
		writeError(w, err)
		return
	}
	defer resp.Body.Close()
	for _, h := range []string{"Content-Type", "Content-Length"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	fl, _ := w.(http.Flusher)
	if fl == nil || resp.Header.Get("Content-Type") != api.StreamContentType {
		io.Copy(w, resp.Body)
		return
	}
	buf := make([]byte, 32<<10) // a stream: pass each chunk on as it comes
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			fl.Flush()
		}
		if err != nil {
			if err := reqErr(r, err); r.Context().Err() != nil && api.KindOf(err) != api.KindInternal {
				api.WriteJSONFrame(w, api.FrameError, err) // why the stream was ended
				fl.Flush()
			}
			return
		}
	}
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	info, err := s.m.StartProcess(r.Context(), r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 201, info)
}

// procProxy forwards a process request to the agent's /procs/{proc}{suffix}.
func (s *Server) procProxy(method, suffix string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		path := agent.PathProcs
		if p := r.PathValue("proc"); p != "" {
			if !agent.ValidProcRef(p) {
				writeError(w, noProcess(p))
				return
			}
			path = agent.ProcPath(p, suffix)
		}
		q := url.Values{}
		in := r.URL.Query()
		var body io.Reader
		switch suffix {
		case agent.ProcOutput:
			for _, k := range []string{"follow", "tail"} {
				if v := in.Get(k); v != "" {
					q.Set(k, v)
				}
			}
			if v := in.Get("follow"); v != "" {
				if _, err := boolParam(r, "follow"); err != nil {
					writeError(w, err)
					return
				}
			}
			if v := in.Get("since"); v != "" {
				t, err := time.Parse(time.RFC3339Nano, v)
				if err != nil {
					d, derr := api.ParseDuration(v)
					if derr != nil {
						writeError(w, api.FieldError("since", "%q is neither an RFC 3339 time nor a duration like 10m", v))
						return
					}
					t = time.Now().Add(-d.D())
				}
				q.Set("since", t.UTC().Format(time.RFC3339Nano))
			}
		case agent.ProcSignal:
			var req api.SignalRequest
			if r.ContentLength != 0 {
				if err := decode(r, &req); err != nil {
					writeError(w, err)
					return
				}
			}
			b, _ := json.Marshal(req)
			body = bytes.NewReader(b)
		case agent.ProcStdin:
			if _, err := boolParam(r, "close"); err != nil {
				writeError(w, err)
				return
			}
			if in.Get("close") == "true" {
				q.Set("close", "true")
			}
			body = r.Body
		}
		// Listing processes and reading logs leave a sleeping sandbox
		// asleep (the list is the one it had when it went to sleep);
		// following logs, waiting, signals and stdin wake it.
		if method == "GET" && suffix == "" {
			list, ok, err := s.m.SleepingProcesses(r.Context(), r.PathValue("id"))
			if err != nil {
				writeError(w, err)
				return
			}
			if ok {
				writeSleepingProcs(w, list, r.PathValue("proc"))
				return
			}
		}
		agentOf := s.m.Agent
		if follow, _ := boolParam(r, "follow"); method == "GET" && (suffix == "" || (suffix == agent.ProcOutput && !follow)) {
			agentOf = s.m.ReadAgent
		}
		s.forwardTo(w, r, agentOf, method, path, q, body)
	}
}

// writeSleepingProcs answers a process list, or the process proc of it,
// from the list a sleeping sandbox had.
func writeSleepingProcs(w http.ResponseWriter, list []api.ProcessInfo, proc string) {
	if proc == "" {
		writeJSON(w, 200, list)
		return
	}
	if i := agent.ResolveProc(proc, len(list), func(i int) (string, string, bool) {
		return list[i].ID, list[i].Name, list[i].State == api.ProcRunning
	}); i >= 0 {
		writeJSON(w, 200, list[i])
		return
	}
	writeError(w, noProcess(proc))
}

func noProcess(p string) error {
	return api.Errorf(api.KindNotFound, "no process %q: name a process by its id (p12) or the --name it was started with (see den ps)", p)
}

func (s *Server) images(w http.ResponseWriter, r *http.Request) {
	v, err := s.m.Images(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, v)
}

func (s *Server) image(w http.ResponseWriter, r *http.Request) {
	v, err := s.m.Image(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, v)
}

func (s *Server) removeImage(w http.ResponseWriter, r *http.Request) {
	if err := s.m.RemoveImage(r.Context(), r.PathValue("name")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}

func (s *Server) importImage(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	if !wantsNDJSON(r) {
		v, err := s.m.ImportImage(r.Context(), name, r.Body, nil)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 200, v)
		return
	}
	n := newNDJSON(w)
	v, err := s.m.ImportImage(r.Context(), name, r.Body, n.progress)
	if err != nil {
		n.fail(err)
		return
	}
	n.send(map[string]any{"images": v})
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.EventFilter{Sandbox: q.Get("sandbox"), Type: q.Get("type")}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			d, derr := api.ParseDuration(v)
			if derr != nil {
				writeError(w, api.FieldError("since", "%q is neither an RFC 3339 time nor a duration like 10m", v))
				return
			}
			t = time.Now().Add(-d.D())
		}
		f.Since = t
	}
	for name, dst := range map[string]*int64{"after": &f.AfterSeq} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				writeError(w, api.FieldError(name, "%q is not a non-negative integer", v))
				return
			}
			*dst = n
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, api.FieldError("limit", "%q is not a non-negative integer", v))
			return
		}
		f.Limit = n
	}
	if err := s.scopeEvents(r.Context(), &f); err != nil {
		writeError(w, err)
		return
	}
	if f.Sandboxes != nil && len(f.Sandboxes) == 0 {
		writeJSON(w, 200, []api.Event{})
		return
	}
	evs, err := s.db.Events(r.Context(), f)
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]api.Event, 0, len(evs))
	for _, e := range evs {
		out = append(out, api.Event{Seq: e.Seq, Time: e.Time, Sandbox: e.Sandbox, Type: e.Type, Data: e.Data})
	}
	writeJSON(w, 200, out)
}

// scopeEvents narrows an event filter to what the request may see: the
// admin every event (a ?sandbox= that names no sandbox now is taken as a
// removed sandbox's id), anyone else only the events of the sandboxes it
// sees now (a ?sandbox= it does not see is not_found).
func (s *Server) scopeEvents(ctx context.Context, f *store.EventFilter) error {
	admin := sandbox.ScopeFrom(ctx).IsAdmin()
	if f.Sandbox != "" {
		sb, err := s.m.Get(ctx, f.Sandbox)
		switch {
		case err == nil:
			f.Sandbox = sb.ID
		case !admin:
			return err
		}
		return nil
	}
	if admin {
		return nil
	}
	list, err := s.m.List(ctx, nil)
	if err != nil {
		return err
	}
	f.Sandboxes = []string{}
	for _, sb := range list {
		f.Sandboxes = append(f.Sandboxes, sb.ID)
	}
	return nil
}

func (s *Server) sessionProxy(method string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		path := agent.PathSessions
		if n := r.PathValue("name"); n != "" {
			path = agent.SessionPath(url.PathEscape(n))
		}
		agentOf := s.m.Agent
		if method == "GET" {
			agentOf = s.m.ReadAgent
		}
		s.forwardTo(w, r, agentOf, method, path, nil, nil)
	}
}

// metrics serves Prometheus text format: per-sandbox usage from the latest
// samples, and the daemon's own health.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	var b strings.Builder
	s.m.Metrics(r.Context(), &b)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(&b, "# HELP den_daemon_goroutines Goroutines of the daemon.\n# TYPE den_daemon_goroutines gauge\nden_daemon_goroutines %d\n", runtime.NumGoroutine())
	fmt.Fprintf(&b, "# HELP den_daemon_heap_bytes Heap in use by the daemon.\n# TYPE den_daemon_heap_bytes gauge\nden_daemon_heap_bytes %d\n", ms.HeapInuse)
	if rss := selfRSS(); rss > 0 {
		fmt.Fprintf(&b, "# HELP den_daemon_rss_bytes Resident memory of the daemon.\n# TYPE den_daemon_rss_bytes gauge\nden_daemon_rss_bytes %d\n", rss)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.Write([]byte(b.String()))
}

// selfRSS is this process's resident set size in bytes (0 if unknown).
func selfRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// byID serves a Manager call on the sandbox named in the path as JSON.
func byID[T any](f func(context.Context, string) (T, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := f(r.Context(), r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 200, v)
	}
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) {
	var p api.NetworkPolicy
	if err := decode(r, &p); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.m.SetNetwork(r.Context(), r.PathValue("id"), p)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, sb)
}

func (s *Server) putSecret(w http.ResponseWriter, r *http.Request) {
	v, err := io.ReadAll(io.LimitReader(r.Body, 64<<10+1))
	if err != nil {
		writeError(w, api.Errorf(api.KindInvalid, "read the secret: %v", err))
		return
	}
	if err := s.m.SetSecret(r.Context(), r.PathValue("name"), v); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) {
	names, err := s.m.Secrets(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, names)
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	if err := s.m.DeleteSecret(r.Context(), r.PathValue("name")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}
