package main

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/tarball"
)

// fakeDaemon is a small in-memory den daemon speaking the HTTP API of
// docs/api.md on a unix socket. Each sandbox's files live in a temporary
// directory. exec understands a few commands:
//
//	echo ARGS...    print ARGS to stdout
//	err TEXT        print TEXT to stderr
//	exit N          exit with code N
//	cat             copy stdin to stdout
//	env             print the environment, one variable a line
//	pwd             print the working directory
//	die SIGNAL      be killed by SIGNAL
//	timeout, oom    end with that reason
//	nosuch          fail to start
//
// An exec with a session answers "SESSION$ SHELL" (or, for a command,
// "SESSION$ " and the arguments, %q-quoted) and opens the session.
// Processes started with a terminal (tty) run "cat" or "/bin/sh" (echo what is typed,
// answer a resize with "[RxC]", end at Ctrl-D), "sleep" (run until a
// signal) or one of exec's commands; a signal ends them all.
type fakeDaemon struct {
	t    *testing.T
	host string
	dir  string

	mu        sync.Mutex
	sandboxes map[string]*fakeSandbox
	order     []string
	images    map[string]*api.Image
	events    []*api.Event
	log       []string // "METHOD /path?query" of every request
	creates   []api.CreateRequest
	execs     []api.ExecRequest
	lastQuery map[string]string         // route → raw query of its last request
	archive   []byte                    // when set, GET archive answers these bytes
	uploads   [][]string                // entry names of each PUT archive
	procs     []*fakeProc               // background processes, in start order
	procReqs  []api.ExecRequest         // bodies of POST processes
	kills     []string                  // signals of POST kill ("" when none was given)
	sessions  map[string][]*api.Session // sandbox id → its shell sessions
	ttyMsgs   map[string][]string       // proc → the messages its terminal got: "bin:..." or "text:..."
	attached  chan string               // the proc of each terminal connection
	pulls     []api.PullRequest         // bodies of POST images/pull
	builds    []fakeBuild               // POST images/build requests
	commits   []api.CommitRequest       // bodies of POST commit
	netSets   []api.NetworkPolicy       // bodies of PUT network
	ports     map[string][]*api.Preview // sandbox id → its shared ports
	tcpConns  int                       // connections to the raw TCP route
	secrets   map[string][]byte         // den's secret store

	// tcpHost is the same daemon on TCP (tcp://127.0.0.1:N), for commands
	// whose output depends on the transport.
	tcpHost string
	// listeners is what GET /v1/info lists (set before the requests), and
	// previewDomain, if set, gives previews a host (PORT-ID.DOMAIN).
	listeners     []string
	previewDomain string
}

// fakeBuild is one build request: its query and, for a Dockerfile build,
// the entries of the context tar (name → contents; directories end in /,
// symlinks are "-> target").
type fakeBuild struct {
	query   url.Values
	entries map[string]string
	order   []string
}

// fakeProc is a background process. Its command is one of exec's; besides,
// "cat" copies each stdin write to stdout and exits 0 when stdin is closed,
// and "sleep" runs until killed. The others end at once.
type fakeProc struct {
	info        api.ProcessInfo
	sandbox     string
	frames      []fakeFrame
	stdin       [][]byte // each stdin write with bytes
	closes      int      // stdin writes with close=true
	stdinClosed bool
	changed     chan struct{} // closed and replaced on every change
	done        chan struct{} // closed when the process ends
	tty         bool
}

type fakeFrame struct {
	typ  byte
	data []byte
}

type fakeSandbox struct {
	sb   *api.Sandbox
	root string
}

func newFakeDaemon(t *testing.T) *fakeDaemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "dencli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fakeDaemon{t: t, dir: dir, sandboxes: map[string]*fakeSandbox{}, images: map[string]*api.Image{}, lastQuery: map[string]string{},
		sessions: map[string][]*api.Session{}, ttyMsgs: map[string][]string{}, attached: make(chan string, 16), ports: map[string][]*api.Preview{}, secrets: map[string][]byte{}}
	mux := http.NewServeMux()
	handle := func(pattern string, h func(w http.ResponseWriter, r *http.Request) error) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			f.mu.Lock()
			f.log = append(f.log, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
			f.lastQuery[pattern] = r.URL.RawQuery
			f.mu.Unlock()
			if err := h(w, r); err != nil {
				var e *api.Error
				if !errors.As(err, &e) {
					e = &api.Error{Kind: api.KindInternal, Message: err.Error()}
				}
				writeJSON(w, api.HTTPStatus(e.Kind), api.ErrorDoc{Error: e})
			}
		})
	}
	handle("GET /v1/version", func(w http.ResponseWriter, r *http.Request) error {
		return writeJSON(w, 200, api.VersionInfo{Version: "fake-1", Go: "go0", Runtimes: []string{"fake"}})
	})
	handle("GET /v1/info", func(w http.ResponseWriter, r *http.Request) error {
		return writeJSON(w, 200, api.Info{Listeners: f.listeners, PreviewDomain: f.previewDomain})
	})
	handle("POST /v1/sandboxes", f.create)
	handle("GET /v1/sandboxes", f.list)
	handle("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) error {
		s, err := f.find(r)
		if err != nil {
			return err
		}
		return writeJSON(w, 200, s.sb)
	})
	handle("POST /v1/sandboxes/{id}/stop", f.setState(api.StateStopped))
	handle("POST /v1/sandboxes/{id}/start", f.setState(api.StateRunning))
	handle("DELETE /v1/sandboxes/{id}", f.remove)
	handle("POST /v1/sandboxes/{id}/exec", f.exec)
	handle("POST /v1/sandboxes/{id}/processes", f.startProc)
	handle("GET /v1/sandboxes/{id}/processes", f.listProcs)
	handle("GET /v1/sandboxes/{id}/processes/{proc}", func(w http.ResponseWriter, r *http.Request) error {
		p, err := f.findProc(r)
		if err != nil {
			return err
		}
		f.mu.Lock()
		info := p.info
		f.mu.Unlock()
		return writeJSON(w, 200, info)
	})
	handle("GET /v1/sandboxes/{id}/processes/{proc}/logs", f.procLogs)
	handle("POST /v1/sandboxes/{id}/processes/{proc}/kill", f.killProc)
	handle("POST /v1/sandboxes/{id}/processes/{proc}/stdin", f.procStdin)
	handle("GET /v1/sandboxes/{id}/processes/{proc}/wait", func(w http.ResponseWriter, r *http.Request) error {
		p, err := f.findProc(r)
		if err != nil {
			return err
		}
		select {
		case <-p.done:
		case <-r.Context().Done():
			return nil
		}
		f.mu.Lock()
		st := p.info.Exit
		f.mu.Unlock()
		return writeJSON(w, 200, st)
	})
	handle("GET /v1/sandboxes/{id}/processes/{proc}/tty", f.tty)
	handle("GET /v1/sandboxes/{id}/sessions", func(w http.ResponseWriter, r *http.Request) error {
		s, err := f.find(r)
		if err != nil {
			return err
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		list := append([]*api.Session{}, f.sessions[s.sb.ID]...)
		return writeJSON(w, 200, list)
	})
	handle("DELETE /v1/sandboxes/{id}/sessions/{name}", func(w http.ResponseWriter, r *http.Request) error {
		s, err := f.find(r)
		if err != nil {
			return err
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		list := f.sessions[s.sb.ID]
		for i, ss := range list {
			if ss.Name == r.PathValue("name") {
				f.sessions[s.sb.ID] = append(list[:i:i], list[i+1:]...)
				w.WriteHeader(http.StatusNoContent)
				return nil
			}
		}
		return api.Errorf(api.KindNotFound, "no session %q", r.PathValue("name"))
	})
	handle("GET /v1/sandboxes/{id}/stats", func(w http.ResponseWriter, r *http.Request) error {
		s, err := f.find(r)
		if err != nil {
			return err
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if s.sb.State != api.StateRunning {
			return api.Errorf(api.KindConflict, "sandbox %s is %s", s.sb.ID[:12], s.sb.State)
		}
		return writeJSON(w, 200, api.Stats{ID: s.sb.ID, CPU: api.Duration(1500 * time.Millisecond), Memory: 10 << 20,
			MemoryLimit: s.sb.Limits.Memory, Pids: 3, PidsLimit: s.sb.Limits.Pids, Disk: 4096, NetRxBytes: 1000, NetTxBytes: 2 << 20,
			Usage: api.Usage{CPUSeconds: 12.5, MemoryGiBHours: 0.125, AliveSeconds: 3725, ActiveSeconds: 61, EgressBytes: 2 << 20}})
	})
	handle("GET /v1/sandboxes/{id}/files/stat", f.stat)
	handle("GET /v1/sandboxes/{id}/archive", f.download)
	handle("PUT /v1/sandboxes/{id}/archive", f.upload)
	handle("GET /v1/images", func(w http.ResponseWriter, r *http.Request) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		list := []*api.Image{}
		for _, img := range f.images {
			list = append(list, img)
		}
		return writeJSON(w, 200, list)
	})
	handle("GET /v1/images/{name}", func(w http.ResponseWriter, r *http.Request) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		img := f.images[r.PathValue("name")]
		if img == nil {
			return api.Errorf(api.KindNotFound, "no image %q", r.PathValue("name"))
		}
		return writeJSON(w, 200, img)
	})
	handle("DELETE /v1/images/{name}", func(w http.ResponseWriter, r *http.Request) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.images[r.PathValue("name")] == nil {
			return api.Errorf(api.KindNotFound, "no image %q", r.PathValue("name"))
		}
		delete(f.images, r.PathValue("name"))
		w.WriteHeader(204)
		return nil
	})
	handle("POST /v1/images/import", f.importImage)
	handle("POST /v1/images/pull", f.pullImage)
	handle("POST /v1/images/build", f.buildImage)
	handle("POST /v1/sandboxes/{id}/commit", f.commit)
	handle("PUT /v1/sandboxes/{id}/network", f.setNetwork)
	handle("POST /v1/sandboxes/{id}/ports", f.sharePort)
	handle("GET /v1/sandboxes/{id}/ports", func(w http.ResponseWriter, r *http.Request) error {
		s, err := f.find(r)
		if err != nil {
			return err
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		return writeJSON(w, 200, append([]*api.Preview{}, f.ports[s.sb.ID]...))
	})
	handle("DELETE /v1/sandboxes/{id}/ports/{port}", func(w http.ResponseWriter, r *http.Request) error {
		s, err := f.find(r)
		if err != nil {
			return err
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		list := f.ports[s.sb.ID]
		for i, p := range list {
			if strconv.Itoa(p.Port) == r.PathValue("port") {
				f.ports[s.sb.ID] = append(list[:i:i], list[i+1:]...)
				w.WriteHeader(http.StatusNoContent)
				return nil
			}
		}
		return api.Errorf(api.KindNotFound, "port %s of sandbox %s is not shared", r.PathValue("port"), s.sb.ID[:12])
	})
	handle("GET /v1/sandboxes/{id}/ports/{port}/tcp", f.tcp)
	handle("PUT /v1/secrets/{name}", func(w http.ResponseWriter, r *http.Request) error {
		if ct := r.Header.Get("Content-Type"); ct != "application/octet-stream" {
			return api.Errorf(api.KindInvalid, "secret sent as %q", ct)
		}
		v, err := io.ReadAll(io.LimitReader(r.Body, 64<<10+1))
		if err != nil {
			return err
		}
		name := r.PathValue("name")
		if strings.ContainsAny(name, "=- ") || name == "" {
			return api.FieldError("name", "%q: use letters, digits and _ (like an environment variable)", name)
		}
		if len(v) == 0 || len(v) > 64<<10 {
			return api.FieldError("value", "a secret is 1 byte to 64 KiB")
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.secrets[name] = v
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	handle("GET /v1/secrets", func(w http.ResponseWriter, r *http.Request) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		names := []string{}
		for n := range f.secrets {
			names = append(names, n) // unsorted, as a map gives them
		}
		return writeJSON(w, 200, names)
	})
	handle("DELETE /v1/secrets/{name}", func(w http.ResponseWriter, r *http.Request) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.secrets[r.PathValue("name")]; !ok {
			return api.Errorf(api.KindNotFound, "no secret %q", r.PathValue("name"))
		}
		delete(f.secrets, r.PathValue("name"))
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	handle("GET /v1/images/save", f.saveImages)
	handle("POST /v1/images/prune", func(w http.ResponseWriter, r *http.Request) error {
		return writeJSON(w, 200, map[string]any{"images": []string{"den-cache/0123", "den-cache/4567"}, "layers": 3})
	})
	handle("GET /v1/events", func(w http.ResponseWriter, r *http.Request) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		list := []*api.Event{}
		after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
		for _, e := range f.events {
			if e.Seq <= after {
				continue
			}
			if since := r.URL.Query().Get("since"); since != "" {
				t, err := time.Parse(time.RFC3339Nano, since)
				if err != nil {
					return api.FieldError("since", "bad time %q", since)
				}
				if e.Time.Before(t) {
					continue
				}
			}
			if s := r.URL.Query().Get("sandbox"); s != "" && e.Sandbox != s {
				continue
			}
			if !strings.HasPrefix(e.Type, r.URL.Query().Get("type")) {
				continue
			}
			list = append(list, e)
		}
		return writeJSON(w, 200, list)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("request outside the API: %s %s", r.Method, r.URL)
		writeJSON(w, 404, api.ErrorDoc{Error: &api.Error{Kind: api.KindNotFound, Message: "no route"}})
	})

	srv := httptest.NewUnstartedServer(mux)
	sock := filepath.Join(dir, "den.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	f.host = "unix://" + sock
	tsrv := httptest.NewServer(mux)
	t.Cleanup(tsrv.Close)
	f.tcpHost = "tcp://" + tsrv.Listener.Addr().String()
	return f
}

// sharePort shares a port as the daemon does; a private one gets the
// token "tok-PORT", or "tok-PORT-rotated" with rotate.
func (f *fakeDaemon) sharePort(w http.ResponseWriter, r *http.Request) error {
	var req api.PortRequest
	s, err := f.findWith(r, &req)
	if err != nil {
		return err
	}
	if req.Port < 1 || req.Port > 65535 {
		return api.FieldError("port", "%d is not a TCP port (1-65535)", req.Port)
	}
	p := &api.Preview{Port: req.Port, Public: req.Public, Path: "/preview/" + s.sb.ID + "/" + strconv.Itoa(req.Port) + "/"}
	if !req.Public {
		p.Token = "tok-" + strconv.Itoa(req.Port)
	}
	if req.Rotate {
		p.Token += "-rotated"
	}
	if f.previewDomain != "" {
		p.Host = strconv.Itoa(req.Port) + "-" + s.sb.ID + "." + f.previewDomain
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	list := f.ports[s.sb.ID]
	for i, o := range list {
		if o.Port == req.Port {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	f.ports[s.sb.ID] = append(list, p)
	return writeJSON(w, 201, p)
}

// tcp is the raw TCP route: every port echoes what it gets, in upper case
// (so that a test sees the bytes went through), except port 9, where
// nothing listens.
func (f *fakeDaemon) tcp(w http.ResponseWriter, r *http.Request) error {
	s, err := f.find(r)
	if err != nil {
		return err
	}
	if r.PathValue("port") == "9" {
		return api.Errorf(api.KindConflict, "nothing answers on port 9 in sandbox %s", s.sb.ID[:12])
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return nil
	}
	defer c.CloseNow()
	f.mu.Lock()
	f.tcpConns++
	f.mu.Unlock()
	for {
		typ, msg, err := c.Read(r.Context())
		if err != nil {
			return nil
		}
		if typ != websocket.MessageBinary {
			f.t.Errorf("a %v message on the raw TCP route", typ)
		}
		if err := c.Write(r.Context(), websocket.MessageBinary, bytes.ToUpper(msg)); err != nil {
			return nil
		}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

func (f *fakeDaemon) event(sandbox, typ string) {
	f.events = append(f.events, &api.Event{Seq: int64(len(f.events) + 1), Time: time.Now(), Sandbox: sandbox, Type: typ, Data: json.RawMessage(`{"x": 1}`)})
}

// addSandbox makes a sandbox directly, for tests that need one.
func (f *fakeDaemon) addSandbox(req api.CreateRequest) *api.Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.newSandbox(req)
	if err != nil {
		f.t.Fatal(err)
	}
	return s.sb
}

func (f *fakeDaemon) newSandbox(req api.CreateRequest) (*fakeSandbox, error) {
	for _, s := range f.sandboxes {
		if req.Name != "" && s.sb.Name == req.Name {
			return nil, api.Errorf(api.KindExists, "name %q is taken", req.Name)
		}
	}
	b := make([]byte, 32)
	rand.Read(b)
	id := hex.EncodeToString(b)
	root := filepath.Join(f.dir, id[:8])
	if err := os.MkdirAll(filepath.Join(root, "work"), 0o755); err != nil {
		return nil, err
	}
	img := req.Image
	if img == "" {
		img = "host"
	}
	s := &fakeSandbox{root: root, sb: &api.Sandbox{ID: id, Name: req.Name, Image: img, Runtime: "fake", State: api.StateRunning,
		Labels: req.Labels, Env: req.Env, Workdir: req.Workdir, User: req.User, Limits: req.Limits, TTL: req.TTL,
		CreatedAt: time.Now().Add(-3 * time.Minute)}}
	s.sb.Network = api.NetworkPolicy{Mode: api.NetNone}
	if req.Network != nil {
		setNet(s.sb, *req.Network)
	}
	f.sandboxes[id] = s
	f.order = append(f.order, id)
	f.event(id, "sandbox.create")
	return s, nil
}

func (f *fakeDaemon) create(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateRequest
	if err := decodeStrict(r, &req); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creates = append(f.creates, req)
	s, err := f.newSandbox(req)
	if err != nil {
		return err
	}
	return writeJSON(w, 201, s.sb)
}

func (f *fakeDaemon) list(w http.ResponseWriter, r *http.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	list := []*api.Sandbox{}
next:
	for _, id := range f.order {
		s := f.sandboxes[id]
		if s == nil {
			continue
		}
		for _, l := range r.URL.Query()["label"] {
			k, v, _ := strings.Cut(l, "=")
			if got, ok := s.sb.Labels[k]; !ok || got != v {
				continue next
			}
		}
		list = append(list, s.sb)
	}
	return writeJSON(w, 200, list)
}

// find resolves {id}: an id, a prefix of 4 or more, or a name.
func (f *fakeDaemon) find(r *http.Request) (*fakeSandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.findLocked(r.PathValue("id"))
}

func (f *fakeDaemon) findLocked(id string) (*fakeSandbox, error) {
	var found *fakeSandbox
	for sid, s := range f.sandboxes {
		if sid == id || s.sb.Name == id || (len(id) >= 4 && strings.HasPrefix(sid, id)) {
			if found != nil && found != s {
				return nil, api.Errorf(api.KindConflict, "%q is ambiguous", id)
			}
			found = s
		}
	}
	if found == nil {
		return nil, api.Errorf(api.KindNotFound, "no such sandbox %q", id)
	}
	return found, nil
}

func (f *fakeDaemon) setState(state string) func(w http.ResponseWriter, r *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		s, err := f.find(r)
		if err != nil {
			return err
		}
		f.mu.Lock()
		s.sb.State = state
		f.mu.Unlock()
		return writeJSON(w, 200, s.sb)
	}
}

func (f *fakeDaemon) remove(w http.ResponseWriter, r *http.Request) error {
	s, err := f.find(r)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.sb.State == api.StateRunning && r.URL.Query().Get("force") != "true" {
		return api.Errorf(api.KindConflict, "sandbox %s is running", s.sb.ID[:12])
	}
	delete(f.sandboxes, s.sb.ID)
	os.RemoveAll(s.root)
	f.event(s.sb.ID, "sandbox.remove")
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (f *fakeDaemon) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sandboxes)
}

func (f *fakeDaemon) exec(w http.ResponseWriter, r *http.Request) error {
	var req api.ExecRequest
	s, err := f.findWith(r, &req)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.execs = append(f.execs, req)
	f.mu.Unlock()
	var stdout, stderr *bytes.Buffer
	var st api.ExitStatus
	switch {
	case req.Session != "":
		f.mu.Lock()
		found := false
		for _, ss := range f.sessions[s.sb.ID] {
			found = found || ss.Name == req.Session
		}
		if !found {
			f.sessions[s.sb.ID] = append(f.sessions[s.sb.ID], &api.Session{Name: req.Session, Pid: 200 + len(f.sessions[s.sb.ID]),
				Started: time.Now().Add(-5 * time.Minute)})
		}
		f.mu.Unlock()
		line := req.Shell
		if line == "" {
			line = fmt.Sprintf("%q", req.Cmd)
		}
		stdout, stderr = bytes.NewBufferString(req.Session+"$ "+line+"\n"), new(bytes.Buffer)
		st = api.ExitStatus{Reason: api.ReasonExited}
	case len(req.Cmd) == 0:
		return api.FieldError("cmd", "empty")
	default:
		stdout, stderr, st = s.command(req)
	}
	if r.Header.Get("Accept") != api.StreamContentType {
		return writeJSON(w, 200, api.ExecResult{ExitStatus: st, Stdout: stdout.Bytes(), Stderr: stderr.Bytes()})
	}
	w.Header().Set("Content-Type", api.StreamContentType)
	api.WriteJSONFrame(w, api.FrameStarted, api.Process{ID: "p1", Pid: 7})
	if stdout.Len() > 0 {
		api.WriteFrame(w, api.FrameStdout, stdout.Bytes())
	}
	if stderr.Len() > 0 {
		api.WriteFrame(w, api.FrameStderr, stderr.Bytes())
	}
	return api.WriteJSONFrame(w, api.FrameExit, st)
}

// command runs one of the fake's commands (see fakeDaemon).
func (s *fakeSandbox) command(req api.ExecRequest) (stdout, stderr *bytes.Buffer, st api.ExitStatus) {
	stdout, stderr = new(bytes.Buffer), new(bytes.Buffer)
	st = api.ExitStatus{Reason: api.ReasonExited, Duration: api.Duration(time.Millisecond)}
	switch args := req.Cmd[1:]; req.Cmd[0] {
	case "echo":
		fmt.Fprintln(stdout, strings.Join(args, " "))
	case "err":
		fmt.Fprintln(stderr, strings.Join(args, " "))
	case "exit":
		st.ExitCode, _ = strconv.Atoi(args[0])
	case "cat":
		stdout.Write(req.Stdin)
	case "env":
		for _, e := range append(append([]string{}, s.sb.Env...), req.Env...) {
			fmt.Fprintln(stdout, e)
		}
	case "pwd":
		fmt.Fprintln(stdout, req.Workdir)
	case "die":
		st.Reason, st.Signal, st.ExitCode = api.ReasonSignaled, args[0], -1
	case "timeout":
		st.Reason, st.ExitCode = api.ReasonTimeout, -1
	case "oom":
		st.Reason, st.ExitCode, st.Signal = api.ReasonOOM, -1, "SIGKILL"
	default:
		st.Reason, st.ExitCode, st.Error = api.ReasonFailed, -1, `exec: "`+req.Cmd[0]+`": executable file not found in $PATH`
	}
	return stdout, stderr, st
}

func (f *fakeDaemon) startProc(w http.ResponseWriter, r *http.Request) error {
	var req api.ExecRequest
	s, err := f.findWith(r, &req)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.procReqs = append(f.procReqs, req)
	if len(req.Cmd) == 0 {
		return api.FieldError("cmd", "empty")
	}
	if s.sb.State != api.StateRunning {
		return api.Errorf(api.KindConflict, "sandbox %s is %s", s.sb.ID[:12], s.sb.State)
	}
	n := len(f.procs) + 1
	p := &fakeProc{sandbox: s.sb.ID, changed: make(chan struct{}), done: make(chan struct{}),
		info: api.ProcessInfo{ID: "p" + strconv.Itoa(n), Pid: 100 + n, Cmd: req.Cmd, State: api.ProcRunning,
			Started: time.Now().Add(-2 * time.Minute), Name: req.Name, Restart: req.Restart}, tty: req.TTY}
	if req.Restart != "" {
		p.info.Restarts = 2
	}
	f.procs = append(f.procs, p)
	if req.TTY {
		return writeJSON(w, 201, p.info) // it runs when attached
	}
	switch req.Cmd[0] {
	case "sleep":
	case "daemons": // runs on with processes it started: daemons N
		k, _ := strconv.Atoi(req.Cmd[1])
		for i := range k {
			p.info.Descendants = append(p.info.Descendants, 200+i)
		}
	case "cat":
		if req.Stdin != nil {
			f.procOutput(p, api.FrameStdout, req.Stdin)
			f.procEnd(p, api.ExitStatus{Reason: api.ReasonExited})
		}
	default:
		stdout, stderr, st := s.command(req)
		if stdout.Len() > 0 {
			f.procOutput(p, api.FrameStdout, stdout.Bytes())
		}
		if stderr.Len() > 0 {
			f.procOutput(p, api.FrameStderr, stderr.Bytes())
		}
		f.procEnd(p, st)
	}
	return writeJSON(w, 201, p.info)
}

// procOutput adds output to p. f.mu is held.
func (f *fakeDaemon) procOutput(p *fakeProc, typ byte, b []byte) {
	p.frames = append(p.frames, fakeFrame{typ, append([]byte(nil), b...)})
	p.info.Output += int64(len(b))
	close(p.changed)
	p.changed = make(chan struct{})
}

// procEnd ends p. f.mu is held.
func (f *fakeDaemon) procEnd(p *fakeProc, st api.ExitStatus) {
	st.Duration = api.Duration(2 * time.Minute)
	p.info.State, p.info.Ended, p.info.Exit = api.ProcExited, time.Now(), &st
	close(p.done)
	close(p.changed)
	p.changed = make(chan struct{})
}

func (f *fakeDaemon) findProc(r *http.Request) (*fakeProc, error) {
	s, err := f.find(r)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.procs {
		if p.sandbox == s.sb.ID && p.info.ID == r.PathValue("proc") {
			return p, nil
		}
	}
	return nil, api.Errorf(api.KindNotFound, "no process %q", r.PathValue("proc"))
}

// proc returns the process with id proc, for tests.
func (f *fakeDaemon) proc(proc string) *fakeProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.procs {
		if p.info.ID == proc {
			return p
		}
	}
	f.t.Fatalf("no process %s", proc)
	return nil
}

func (f *fakeDaemon) listProcs(w http.ResponseWriter, r *http.Request) error {
	s, err := f.find(r)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	list := []api.ProcessInfo{}
	for _, p := range f.procs {
		if p.sandbox == s.sb.ID {
			list = append(list, p.info)
		}
	}
	return writeJSON(w, 200, list)
}

// procLogs answers the retained output (the last tail frames with tail=N),
// then with follow=true new output until the process ends, and an exit frame
// if it has.
func (f *fakeDaemon) procLogs(w http.ResponseWriter, r *http.Request) error {
	p, err := f.findProc(r)
	if err != nil {
		return err
	}
	follow := r.URL.Query().Get("follow") == "true"
	tail, _ := strconv.Atoi(r.URL.Query().Get("tail"))
	w.Header().Set("Content-Type", api.StreamContentType)
	api.WriteJSONFrame(w, api.FrameStarted, api.Process{ID: p.info.ID, Pid: p.info.Pid})
	sent := 0
	f.mu.Lock()
	if tail > 0 && len(p.frames) > tail {
		sent = len(p.frames) - tail
	}
	f.mu.Unlock()
	for {
		f.mu.Lock()
		frames := p.frames[sent:]
		sent = len(p.frames)
		st, changed := p.info.Exit, p.changed
		f.mu.Unlock()
		for _, fr := range frames {
			api.WriteFrame(w, fr.typ, fr.data)
		}
		if st != nil {
			return api.WriteJSONFrame(w, api.FrameExit, st)
		}
		if !follow {
			return nil
		}
		w.(http.Flusher).Flush()
		select {
		case <-changed:
		case <-r.Context().Done():
			return nil
		}
	}
}

func (f *fakeDaemon) killProc(w http.ResponseWriter, r *http.Request) error {
	p, err := f.findProc(r)
	if err != nil {
		return err
	}
	var req api.SignalRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		return api.Errorf(api.KindInvalid, "bad body: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kills = append(f.kills, req.Signal)
	if p.info.State != api.ProcRunning {
		return api.Errorf(api.KindConflict, "process %s has ended", p.info.ID)
	}
	sig := strings.TrimPrefix(strings.ToUpper(req.Signal), "SIG")
	if sig == "" {
		sig = "KILL"
	}
	f.procEnd(p, api.ExitStatus{Reason: api.ReasonSignaled, Signal: "SIG" + sig, ExitCode: -1})
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (f *fakeDaemon) procStdin(w http.ResponseWriter, r *http.Request) error {
	p, err := f.findProc(r)
	if err != nil {
		return err
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/octet-stream" {
		return api.Errorf(api.KindInvalid, "stdin Content-Type %q", ct)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if p.info.State != api.ProcRunning || p.stdinClosed {
		return api.Errorf(api.KindConflict, "the standard input of process %s is closed", p.info.ID)
	}
	if len(body) > 0 {
		p.stdin = append(p.stdin, body)
		if p.info.Cmd[0] == "cat" {
			f.procOutput(p, api.FrameStdout, body)
		}
	}
	if r.URL.Query().Get("close") == "true" {
		p.closes++
		p.stdinClosed = true
		if p.info.Cmd[0] == "cat" {
			f.procEnd(p, api.ExitStatus{Reason: api.ReasonExited})
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// hostPath maps a sandbox path to the fake's directory.
func (s *fakeSandbox) hostPath(p string) string {
	return filepath.Join(s.root, filepath.FromSlash(path.Clean("/"+p)))
}

func (f *fakeDaemon) stat(w http.ResponseWriter, r *http.Request) error {
	s, err := f.find(r)
	if err != nil {
		return err
	}
	p := r.URL.Query().Get("path")
	fi, err := os.Lstat(s.hostPath(p))
	if err != nil {
		return api.Errorf(api.KindNotFound, "%s: no such file or directory", p)
	}
	typ := "file"
	switch {
	case fi.IsDir():
		typ = "dir"
	case fi.Mode()&fs.ModeSymlink != 0:
		typ = "symlink"
	}
	return writeJSON(w, 200, api.FileInfo{Name: fi.Name(), Path: p, Type: typ, Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), ModTime: fi.ModTime()})
}

func (f *fakeDaemon) download(w http.ResponseWriter, r *http.Request) error {
	s, err := f.find(r)
	if err != nil {
		return err
	}
	f.mu.Lock()
	canned := f.archive
	f.mu.Unlock()
	if canned != nil {
		w.Header().Set("Content-Type", "application/x-tar")
		w.Write(canned)
		return nil
	}
	p := path.Clean("/" + r.URL.Query().Get("path"))
	top := s.hostPath(p)
	if _, err := os.Lstat(top); err != nil {
		return api.Errorf(api.KindNotFound, "%s: no such file or directory", p)
	}
	base := path.Base(p)
	if p == "/" {
		base = "."
	}
	w.Header().Set("Content-Type", "application/x-tar")
	tw := tarball.NewWriter(w)
	tw.KeepOwner, tw.HardLinks = true, true // as the agent writes it
	err = filepath.Walk(top, func(full string, fi fs.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(top, full)
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			link, _ = os.Readlink(full)
		}
		err = tw.Add(path.Join(base, filepath.ToSlash(rel)), fi, link, func() (io.ReadCloser, error) { return os.Open(full) })
		if errors.Is(err, tarball.ErrSkipped) {
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func (f *fakeDaemon) upload(w http.ResponseWriter, r *http.Request) error {
	s, err := f.find(r)
	if err != nil {
		return err
	}
	dir := s.hostPath(r.URL.Query().Get("path"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tr := tar.NewReader(r.Body)
	var names []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return api.Errorf(api.KindInvalid, "read tar: %v", err)
		}
		names = append(names, hdr.Name)
		if strings.HasPrefix(hdr.Name, "/") || strings.Contains("/"+hdr.Name+"/", "/../") {
			return api.Errorf(api.KindInvalid, "entry %q escapes", hdr.Name)
		}
		full := filepath.Join(dir, filepath.FromSlash(hdr.Name))
		os.MkdirAll(filepath.Dir(full), 0o755)
		switch hdr.Typeflag {
		case tar.TypeDir:
			os.MkdirAll(full, 0o755)
			os.Chmod(full, os.FileMode(hdr.Mode).Perm())
		case tar.TypeReg:
			os.Remove(full)
			b, _ := io.ReadAll(tr)
			if err := os.WriteFile(full, b, os.FileMode(hdr.Mode).Perm()); err != nil {
				return err
			}
			os.Chmod(full, os.FileMode(hdr.Mode).Perm())
		case tar.TypeSymlink:
			os.Remove(full)
			if err := os.Symlink(hdr.Linkname, full); err != nil {
				return err
			}
		case tar.TypeLink:
			os.Remove(full)
			if err := os.Link(filepath.Join(dir, filepath.FromSlash(hdr.Linkname)), full); err != nil {
				return err
			}
		}
	}
	f.mu.Lock()
	f.uploads = append(f.uploads, names)
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (f *fakeDaemon) importImage(w http.ResponseWriter, r *http.Request) error {
	body, _ := io.ReadAll(r.Body)
	if !bytes.HasPrefix(body, []byte("OCI")) {
		return api.Errorf(api.KindInvalid, "not an OCI archive")
	}
	name := r.URL.Query().Get("name")
	if name == "" {
		name = "imported:latest"
	}
	img := &api.Image{Name: name, ID: "sha256:0123456789abcdef0123", Size: int64(len(body)) << 20, CreatedAt: time.Now().Add(-2 * time.Hour)}
	f.mu.Lock()
	f.images[name] = img
	f.mu.Unlock()
	if r.Header.Get("Accept") != "application/x-ndjson" {
		return writeJSON(w, 200, []*api.Image{img})
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	total := int64(len(body))
	for _, done := range []int64{0, total / 2, total} {
		enc.Encode(map[string]any{"progress": map[string]any{"done": done, "total": total, "what": "layer sha256:aaaa"}})
	}
	enc.Encode(map[string]any{"progress": map[string]any{"done": 1, "total": 1, "what": "config"}})
	return enc.Encode(map[string]any{"images": []*api.Image{img}})
}

// setNetwork replaces a sandbox's policy as the daemon does; a mode it
// does not know is invalid.
func (f *fakeDaemon) setNetwork(w http.ResponseWriter, r *http.Request) error {
	var p api.NetworkPolicy
	s, err := f.findWith(r, &p)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.netSets = append(f.netSets, p)
	switch p.Mode {
	case "", api.NetNone, api.NetAllow, api.NetOpen:
	default:
		return api.FieldError("network.mode", "bad mode %q", p.Mode)
	}
	setNet(s.sb, p)
	return writeJSON(w, 200, s.sb)
}

// setNet gives sb policy p and, when networked, an address.
func setNet(sb *api.Sandbox, p api.NetworkPolicy) {
	if p.Mode == "" {
		p.Mode = api.NetNone
	}
	sb.Network, sb.Address = p, ""
	if p.Mode != api.NetNone {
		sb.Address = "10.89.0.2"
	}
}

// netEvent logs a net.KIND event with data d (an egress.Event's JSON).
func (f *fakeDaemon) netEvent(sandbox, kind string, d map[string]any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, _ := json.Marshal(d)
	f.events = append(f.events, &api.Event{Seq: int64(len(f.events) + 1), Time: time.Now(), Sandbox: sandbox, Type: "net." + kind, Data: b})
}

// decodeStrict decodes a JSON request body, refusing unknown fields as
// the daemon does.
// findWith is find, then decodeStrict of the request's body into v.
func (f *fakeDaemon) findWith(r *http.Request, v any) (*fakeSandbox, error) {
	s, err := f.find(r)
	if err == nil {
		err = decodeStrict(r, v)
	}
	return s, err
}

func decodeStrict(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return api.Errorf(api.KindInvalid, "bad body: %v", err)
	}
	return nil
}

// pullImage pulls anything but a reference starting with "nosuch", which
// fails after the first progress line.
func (f *fakeDaemon) pullImage(w http.ResponseWriter, r *http.Request) error {
	var req api.PullRequest
	if err := decodeStrict(r, &req); err != nil {
		return err
	}
	if req.Ref == "" {
		return api.FieldError("ref", "missing")
	}
	f.mu.Lock()
	f.pulls = append(f.pulls, req)
	f.mu.Unlock()
	name := req.Name
	if name == "" {
		name = req.Ref
	}
	img := &api.Image{Name: name, ID: "sha256:feedfacefeedface", Layers: []string{"sha256:aaaa"}, Size: 3 << 20, CreatedAt: time.Now()}
	fail := strings.HasPrefix(req.Ref, "nosuch")
	if r.Header.Get("Accept") != "application/x-ndjson" {
		if fail {
			return api.Errorf(api.KindInvalid, "pull %s: manifest unknown", req.Ref)
		}
	} else {
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(map[string]any{"progress": map[string]any{"done": 1 << 20, "total": 3 << 20, "what": "layer sha256:aaaa"}})
		if fail {
			return enc.Encode(api.ErrorDoc{Error: api.Errorf(api.KindInvalid, "pull %s: manifest unknown", req.Ref)})
		}
		enc.Encode(map[string]any{"progress": map[string]any{"done": 3 << 20, "total": 3 << 20, "what": "layer sha256:aaaa"}})
	}
	f.mu.Lock()
	f.images[name] = img
	f.mu.Unlock()
	if r.Header.Get("Accept") != "application/x-ndjson" {
		return writeJSON(w, 200, img)
	}
	return json.NewEncoder(w).Encode(map[string]any{"image": img})
}

// buildImage reads the context tar and "runs" the Dockerfile: each line is
// a step; a line "RUN false" fails the build, naming the line.
func (f *fakeDaemon) buildImage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	b := fakeBuild{query: q, entries: map[string]string{}}
	if q.Get("t") == "" {
		return api.FieldError("t", "missing: name the image (?t=NAME)")
	}
	var lines []string
	if suite := q.Get("debian"); suite != "" {
		if body, _ := io.ReadAll(r.Body); len(body) > 0 {
			return api.Errorf(api.KindInvalid, "a debian build takes no body")
		}
		lines = []string{"Running mmdebstrap " + suite}
	} else {
		tr := tar.NewReader(r.Body)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return api.Errorf(api.KindInvalid, "build context: %v", err)
			}
			body, _ := io.ReadAll(tr)
			switch hdr.Typeflag {
			case tar.TypeSymlink:
				body = []byte("-> " + hdr.Linkname)
			case tar.TypeDir:
				if !strings.HasSuffix(hdr.Name, "/") {
					hdr.Name += "/"
				}
			}
			b.entries[hdr.Name] = string(body)
			b.order = append(b.order, hdr.Name)
		}
		df := q.Get("dockerfile")
		if df == "" {
			df = "Dockerfile"
		}
		text, ok := b.entries[df]
		if !ok {
			f.mu.Lock()
			f.builds = append(f.builds, b)
			f.mu.Unlock()
			return api.FieldError("dockerfile", "no %s in the build context", df)
		}
		lines = strings.Split(strings.TrimSpace(text), "\n")
	}
	f.mu.Lock()
	f.builds = append(f.builds, b)
	f.mu.Unlock()
	img := &api.Image{Name: q.Get("t"), ID: "sha256:b0b0b0b0b0b0b0b0", Size: 1 << 20, CreatedAt: time.Now()}
	if r.Header.Get("Accept") != "application/x-ndjson" {
		return api.Errorf(api.KindInvalid, "the fake builds with ndjson only")
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for i, l := range lines {
		enc.Encode(map[string]string{"stream": fmt.Sprintf("Step %d/%d : %s\n", i+1, len(lines), l)})
		if l == "RUN false" {
			return enc.Encode(api.ErrorDoc{Error: api.Errorf(api.KindInvalid, "Dockerfile line %d: RUN false: exit code 1", i+1)})
		}
	}
	enc.Encode(map[string]string{"stream": "Successfully built b0b0b0b0b0b0 as " + img.Name + "\n"})
	f.mu.Lock()
	f.images[img.Name] = img
	f.mu.Unlock()
	return enc.Encode(map[string]any{"image": img})
}

func (f *fakeDaemon) commit(w http.ResponseWriter, r *http.Request) error {
	var req api.CommitRequest
	s, err := f.findWith(r, &req)
	if err != nil {
		return err
	}
	if req.Name == "" || req.Name == "host" {
		return api.FieldError("name", "%q is not a usable image name", req.Name)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commits = append(f.commits, req)
	img := &api.Image{Name: req.Name, ID: "sha256:c0c0c0c0c0c0c0c0", Layers: []string{"sha256:cccc"}, Size: 4096, CreatedAt: time.Now()}
	if s.sb.Image == "" || s.sb.Image == "host" {
		img.Base = "host"
		img.MountLayers = map[string][]string{"/usr": {"sha256:dddd"}}
	}
	f.images[req.Name] = img
	return writeJSON(w, 201, img)
}

// saveImages answers "OCI:" and the names; an image on the host base
// cannot be saved.
func (f *fakeDaemon) saveImages(w http.ResponseWriter, r *http.Request) error {
	names := r.URL.Query()["name"]
	if len(names) == 0 {
		return api.FieldError("name", "missing")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range names {
		img := f.images[n]
		if img == nil {
			return api.Errorf(api.KindNotFound, "no image %q", n)
		}
		if img.Base == "host" {
			return api.Errorf(api.KindUnsupported, "image %q is built on this host's own files (the host image) and cannot be saved", n)
		}
	}
	w.Header().Set("Content-Type", "application/x-tar")
	_, err := io.WriteString(w, "OCI:"+strings.Join(names, ","))
	return err
}

// tty serves the terminal of a process started with tty (see fakeDaemon).
func (f *fakeDaemon) tty(w http.ResponseWriter, r *http.Request) error {
	p, err := f.findProc(r)
	if err != nil {
		return err
	}
	if !p.tty {
		return api.Errorf(api.KindConflict, "attach to %s: process %s was not started with a terminal (tty)", p.info.ID, p.info.ID)
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return nil
	}
	defer c.CloseNow()
	ctx := r.Context()
	id := p.info.ID
	select {
	case f.attached <- id:
	default:
	}
	end := func(st api.ExitStatus) error {
		f.mu.Lock()
		if p.info.Exit == nil {
			f.procEnd(p, st)
		}
		f.mu.Unlock()
		b, _ := json.Marshal(api.TTYControl{Exit: &st})
		c.Write(ctx, websocket.MessageText, b)
		return c.Close(websocket.StatusNormalClosure, "exited")
	}
	c.Write(ctx, websocket.MessageBinary, []byte("started\r\n"))
	switch cmd := p.info.Cmd[0]; cmd {
	case "cat", "sleep", "/bin/sh":
	default:
		s, err := f.find(r)
		if err != nil {
			return err
		}
		stdout, stderr, st := s.command(api.ExecRequest{Cmd: p.info.Cmd})
		c.Write(ctx, websocket.MessageBinary, append(stdout.Bytes(), stderr.Bytes()...))
		end(st)
		return nil
	}
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			return nil
		}
		f.mu.Lock()
		if typ == websocket.MessageBinary {
			f.ttyMsgs[id] = append(f.ttyMsgs[id], "bin:"+string(msg))
		} else {
			f.ttyMsgs[id] = append(f.ttyMsgs[id], "text:"+string(msg))
		}
		f.mu.Unlock()
		if typ == websocket.MessageText {
			var ctl api.TTYControl
			json.Unmarshal(msg, &ctl)
			if ctl.Resize != nil {
				c.Write(ctx, websocket.MessageBinary, fmt.Appendf(nil, "[%dx%d]", ctl.Resize.Rows, ctl.Resize.Cols))
			}
			if ctl.Signal != "" {
				end(api.ExitStatus{Reason: api.ReasonSignaled, Signal: "SIG" + ctl.Signal, ExitCode: -1})
				return nil
			}
			continue
		}
		if cmd := p.info.Cmd[0]; cmd != "cat" && cmd != "/bin/sh" {
			continue
		}
		before, _, eof := bytes.Cut(msg, []byte{4})
		if len(before) > 0 {
			c.Write(ctx, websocket.MessageBinary, before)
		}
		if eof {
			end(api.ExitStatus{Reason: api.ReasonExited})
			return nil
		}
	}
}

// ttyLog returns the messages the terminal of proc got.
func (f *fakeDaemon) ttyLog(proc string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ttyMsgs[proc]...)
}
