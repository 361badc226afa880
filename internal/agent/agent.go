// Package agent is den's in-sandbox agent: the process that runs as PID 1 in
// every sandbox, whatever its isolation tier. It reaps zombies, starts
// commands from a confined launcher thread, keeps their output in bounded
// buffers, and serves exec and file requests over HTTP on a unix socket
// whose other end only the daemon can reach. Because the agent lives in the
// sandbox's own mount namespace and root, every path it touches is resolved
// inside the sandbox. The package also holds the daemon's client of that
// protocol.
package agent

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/confine"
)

// Options configure an agent.
type Options struct {
	// OutputLimit bounds the retained output of each stream of each process.
	OutputLimit int
	// Confine runs on the launcher thread before any command is started;
	// it applies the sandbox's capability, seccomp and namespace confinement.
	Confine func() error
	// SetPids changes the commands' pids limit (0: none) where the agent
	// enforces it itself (gVisor); nil where the tier does.
	SetPids func(limit int) error
	Log     *slog.Logger
}

// Agent serves one sandbox.
type Agent struct {
	opts   Options
	launch *launcher
	mu     sync.Mutex
	order  []*Process // in start order, for listing and retention

	sessions map[string]*session
}

// New starts the reaper and the confined launcher thread.
func New(opts Options) (*Agent, error) {
	if opts.OutputLimit <= 0 {
		opts.OutputLimit = 10 << 20
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	// Commands get only the descriptors spawn hands them (0, 1 and 2),
	// whatever the agent inherited, on every tier.
	if err := confine.InheritNothing(); err != nil {
		return nil, err
	}
	if err := limitFiles(); err != nil {
		return nil, err
	}
	startReaper()
	l, err := startLauncher(opts.Confine)
	if err != nil {
		return nil, err
	}
	return &Agent{opts: opts, launch: l, sessions: map[string]*session{}}, nil
}

func (a *Agent) hostname() string {
	h, _ := os.Hostname()
	return h
}

// Serve answers requests on ln until it fails.
func (a *Agent) Serve(ln net.Listener) error {
	srv := &http.Server{Handler: a.Handler(), MaxHeaderBytes: 64 << 10}
	return srv.Serve(ln)
}

// Handler is the agent's HTTP API.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	a.routes(mux)
	return mux
}

// router is what the agent's routes are added to: its http.ServeMux, or a
// test's recorder of them.
type router interface {
	HandleFunc(pattern string, handler func(http.ResponseWriter, *http.Request))
}

// routes adds the agent's routes, each named by protocol.go's paths.
func (a *Agent) routes(mux router) {
	mux.HandleFunc("GET "+PathHealth, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"ok": true, "pid": os.Getpid()})
	})
	mux.HandleFunc("POST "+PathExec, a.handleExec)
	mux.HandleFunc("GET "+PathFiles, a.handleRead)
	mux.HandleFunc("PUT "+PathFiles, a.handleWrite)
	mux.HandleFunc("DELETE "+PathFiles, a.handleRemove)
	mux.HandleFunc("GET "+PathList, a.handleList)
	mux.HandleFunc("GET "+PathStat, a.handleStat)
	mux.HandleFunc("POST "+PathMkdir, a.handleMkdir)
	mux.HandleFunc("POST "+PathRename, a.handleRename)
	a.searchRoutes(mux)
	mux.HandleFunc("GET "+PathArchive, a.handleDownload)
	mux.HandleFunc("PUT "+PathArchive, a.handleUpload)
	mux.HandleFunc("POST "+PathHostname, a.handleHostname)
	mux.HandleFunc("POST "+PathLimits, a.handleLimits)
	mux.HandleFunc("GET "+PathSessions, a.handleSessions)
	mux.HandleFunc("DELETE "+SessionPath("{name}"), a.handleCloseSession)
	mux.HandleFunc("POST "+PathProcs, a.handleStart)
	mux.HandleFunc("GET "+PathProcs, a.handleProcs)
	mux.HandleFunc("GET "+ProcPath("{id}", ""), a.handleProc)
	mux.HandleFunc("GET "+ProcPath("{id}", ProcOutput), a.handleOutput)
	mux.HandleFunc("POST "+ProcPath("{id}", ProcSignal), a.handleSignal)
	mux.HandleFunc("POST "+ProcPath("{id}", ProcStdin), a.handleStdin)
	mux.HandleFunc("GET "+ProcPath("{id}", ProcWait), a.handleWait)
	mux.HandleFunc("GET "+ProcPath("{id}", ProcTTY), a.handleTTY)
	mux.HandleFunc("GET "+PathDial, a.handleDial)
	mux.HandleFunc("POST "+PathStop, a.handleStop)
	mux.HandleFunc("POST "+PathSync, func(w http.ResponseWriter, r *http.Request) {
		// Writes cached by the sandbox's own kernel (gVisor's sentry, a
		// microVM's guest) reach the files the daemon snapshots.
		syscall.Sync()
		writeJSON(w, 200, struct{}{})
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// WriteError writes err as den's JSON error document.
func WriteError(w http.ResponseWriter, err error) {
	var ae *api.Error
	if !errors.As(err, &ae) {
		ae = &api.Error{Kind: api.KindInternal, Message: err.Error()}
	}
	writeJSON(w, api.HTTPStatus(ae.Kind), api.ErrorDoc{Error: ae})
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return api.Errorf(api.KindInvalid, "bad JSON body: %v", err)
	}
	return nil
}

func (a *Agent) handleExec(w http.ResponseWriter, r *http.Request) {
	var spec ExecSpec
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		WriteError(w, api.Errorf(api.KindInvalid, "bad exec request: %v", err))
		return
	}
	w.Header().Set("Content-Type", api.StreamContentType)
	fl, _ := w.(http.Flusher)
	var wmu sync.Mutex
	send := func(typ byte, payload []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		if err := api.WriteFrame(w, typ, payload); err != nil {
			return err
		}
		if fl != nil {
			fl.Flush()
		}
		return nil
	}
	if spec.Session != "" {
		st, err := a.execInSession(r.Context(), &spec, send)
		if err != nil {
			WriteError(w, err)
			return
		}
		b, _ := json.Marshal(st)
		send(api.FrameExit, b)
		return
	}
	res, err := a.resolve(&spec)
	var p *Process
	if err == nil {
		p, err = a.spawn(res)
	}
	if err != nil {
		var se *startError
		if errors.As(err, &se) {
			st := api.ExitStatus{ExitCode: se.code, Reason: api.ReasonFailed, Error: se.msg}
			b, _ := json.Marshal(st)
			send(api.FrameExit, b)
			return
		}
		if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOEXEC) {
			st := api.ExitStatus{ExitCode: 126, Reason: api.ReasonFailed, Error: "exec " + strconv.Quote(spec.Argv[0]) + ": " + err.Error()}
			b, _ := json.Marshal(st)
			send(api.FrameExit, b)
			return
		}
		var ae *api.Error
		if !errors.As(err, &ae) {
			ae = api.Errorf(api.KindInternal, "start: %v", err)
		}
		WriteError(w, ae)
		return
	}
	a.track(p)
	b, _ := json.Marshal(api.Process{ID: p.ID, Pid: p.Pid})
	if send(api.FrameStarted, b) != nil {
		return
	}
	// Follow both streams with backpressure until the client goes away.
	outC := p.stdout.Attach(0, true)
	errC := p.stderr.Attach(0, true)
	defer p.stdout.Detach(outC)
	defer p.stderr.Detach(errC)
	stop := r.Context().Done()
	go func() {
		<-stop
		p.stdout.Detach(outC)
		p.stderr.Detach(errC)
	}()
	var wg sync.WaitGroup
	failed := make(chan struct{}, 2)
	follow := func(rg *ring, c *cursor, typ byte) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, dropped, done, err := rg.Read(c, buf)
			if err != nil {
				return
			}
			if dropped > 0 {
				d, _ := json.Marshal(api.DroppedOutput{Bytes: dropped})
				if send(api.FrameDropped, d) != nil {
					failed <- struct{}{}
					return
				}
			}
			if n > 0 && send(typ, buf[:n]) != nil {
				failed <- struct{}{}
				rg.Detach(c)
				return
			}
			if done {
				return
			}
		}
	}
	wg.Add(2)
	go follow(p.stdout, outC, api.FrameStdout)
	go follow(p.stderr, errC, api.FrameStderr)
	wg.Wait()
	select {
	case <-failed:
		return // client gone; the process runs on
	case <-stop:
		return
	default:
	}
	<-p.Done()
	b, _ = json.Marshal(p.Status())
	send(api.FrameExit, b)
}

func (a *Agent) pathParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	p, err := cleanPath(r.URL.Query().Get("path"))
	if err != nil {
		WriteError(w, err)
		return "", false
	}
	return p, true
}

func (a *Agent) handleRead(w http.ResponseWriter, r *http.Request) {
	p, ok := a.pathParam(w, r)
	if !ok {
		return
	}
	f, err := openFile(p, syscall.O_RDONLY, 0)
	if err != nil {
		WriteError(w, fileError(err))
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		WriteError(w, fileError(err))
		return
	}
	if st.IsDir() {
		WriteError(w, api.Errorf(api.KindInvalid, "%s is a directory: use files/list or archive", p))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if st.Mode().IsRegular() {
		w.Header().Set("Content-Length", strconv.FormatInt(st.Size(), 10))
		io.CopyN(w, f, st.Size())
		return
	}
	io.Copy(w, f)
}

func parseMode(s string) (uint32, error) {
	if s == "" {
		return 0, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, api.FieldError("mode", "%q is not an octal permission mode like 0644", s)
	}
	return uint32(m), nil
}

func (a *Agent) handleWrite(w http.ResponseWriter, r *http.Request) {
	p, ok := a.pathParam(w, r)
	if !ok {
		return
	}
	mode, err := parseMode(r.URL.Query().Get("mode"))
	if err != nil {
		WriteError(w, err)
		return
	}
	fi, err := writeFile(p, r.Body, mode)
	if err != nil {
		WriteError(w, err)
		return
	}
	writeJSON(w, 200, fi)
}

func (a *Agent) handleRemove(w http.ResponseWriter, r *http.Request) {
	p, ok := a.pathParam(w, r)
	if !ok {
		return
	}
	if err := removeFile(p, r.URL.Query().Get("recursive") == "true"); err != nil {
		WriteError(w, err)
		return
	}
	w.WriteHeader(204)
}

func (a *Agent) handleList(w http.ResponseWriter, r *http.Request) {
	p, ok := a.pathParam(w, r)
	if !ok {
		return
	}
	v, err := listDir(p)
	if err != nil {
		WriteError(w, err)
		return
	}
	writeJSON(w, 200, v)
}

func (a *Agent) handleStat(w http.ResponseWriter, r *http.Request) {
	p, ok := a.pathParam(w, r)
	if !ok {
		return
	}
	v, err := statFile(p)
	if err != nil {
		WriteError(w, err)
		return
	}
	writeJSON(w, 200, v)
}

func (a *Agent) handleMkdir(w http.ResponseWriter, r *http.Request) {
	var req api.MkdirRequest
	if err := decodeBody(r, &req); err != nil {
		WriteError(w, err)
		return
	}
	p, err := cleanPath(req.Path)
	if err != nil {
		WriteError(w, err)
		return
	}
	fi, err := mkdir(p, req.Mode, req.Parents)
	if err != nil {
		WriteError(w, err)
		return
	}
	writeJSON(w, 200, fi)
}

func (a *Agent) handleRename(w http.ResponseWriter, r *http.Request) {
	var req api.RenameRequest
	if err := decodeBody(r, &req); err != nil {
		WriteError(w, err)
		return
	}
	from, err := cleanPath(req.From)
	if err != nil {
		WriteError(w, api.FieldError("from", "%v", err))
		return
	}
	to, err := cleanPath(req.To)
	if err != nil {
		WriteError(w, api.FieldError("to", "%v", err))
		return
	}
	fi, err := rename(from, to)
	if err != nil {
		WriteError(w, err)
		return
	}
	writeJSON(w, 200, fi)
}

func (a *Agent) handleDownload(w http.ResponseWriter, r *http.Request) {
	p, ok := a.pathParam(w, r)
	if !ok {
		return
	}
	if _, err := os.Lstat(p); err != nil {
		WriteError(w, fileError(err))
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	if err := writeTar(w, p); err != nil {
		a.opts.Log.Warn("archive", "path", p, "err", err)
		// Headers are gone; abort the connection so the client sees a broken stream.
		panic(http.ErrAbortHandler)
	}
}

func (a *Agent) handleUpload(w http.ResponseWriter, r *http.Request) {
	p, ok := a.pathParam(w, r)
	if !ok {
		return
	}
	// ?owner=USER (as lookupUser takes it; "" is root): every entry
	// belongs to that user; without it entries keep the archive's owners.
	var owner *user
	if spec, ok := r.URL.Query()["owner"]; ok {
		u, err := lookupUser(spec[0], "")
		if err != nil {
			WriteError(w, err)
			return
		}
		owner = u
	}
	if err := extractTar(r.Body, p, owner); err != nil {
		WriteError(w, err)
		return
	}
	w.WriteHeader(204)
}

func (a *Agent) handleHostname(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Hostname string `json:"hostname"`
	}
	if err := decodeBody(r, &req); err != nil {
		WriteError(w, err)
		return
	}
	if err := SetHostname(req.Hostname, "/"); err != nil {
		WriteError(w, api.Errorf(api.KindInvalid, "%v", err))
		return
	}
	w.WriteHeader(204)
}

// handleLimits sets the limits the agent enforces itself (Options.SetPids).
func (a *Agent) handleLimits(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Pids int `json:"pids"`
	}
	if err := decodeBody(r, &req); err != nil {
		WriteError(w, err)
		return
	}
	if req.Pids < 0 {
		WriteError(w, api.FieldError("pids", "%d: want 0 (no limit) or more", req.Pids))
		return
	}
	if a.opts.SetPids == nil {
		WriteError(w, api.Errorf(api.KindUnsupported, "this sandbox's tier enforces its pids limit outside the agent"))
		return
	}
	if err := a.opts.SetPids(req.Pids); err != nil {
		WriteError(w, api.Errorf(api.KindInternal, "%v", err))
		return
	}
	w.WriteHeader(204)
}
