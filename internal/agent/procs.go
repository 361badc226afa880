package agent

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/den-dev/den/api"
	"golang.org/x/sys/unix"
)

// MaxFinished bounds how many finished processes (with their output) the
// agent keeps for ps, logs and wait; the oldest finished go first.
const MaxFinished = 256

// track adds p to the process table, forgetting the oldest finished
// processes beyond MaxFinished.
func (a *Agent) track(p *Process) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.order = append(a.order, p)
	finished := 0
	for _, q := range a.order {
		if isDone(q) {
			finished++
		}
	}
	if finished <= MaxFinished {
		return
	}
	kept := a.order[:0]
	for _, q := range a.order {
		if finished > MaxFinished && isDone(q) {
			finished--
			continue
		}
		kept = append(kept, q)
	}
	a.order = kept
}

// live reports whether p runs, or is a service that will run again.
func live(p *Process) bool {
	return !isDone(p) || p.service != nil && !p.service.isStopped()
}

func isDone(p *Process) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (a *Agent) proc(w http.ResponseWriter, r *http.Request) *Process {
	ref := r.PathValue("id")
	var p *Process
	a.mu.Lock()
	if i := ResolveProc(ref, len(a.order), func(i int) (string, string, bool) {
		q := a.order[i]
		return q.ID, q.name, live(q)
	}); i >= 0 {
		p = a.order[i]
	}
	a.mu.Unlock()
	if p == nil {
		WriteError(w, api.Errorf(api.KindNotFound, "no process %q in this sandbox: name one by its id (p12) or its --name, see den ps (finished processes are kept until %d newer ones finish)", ref, MaxFinished))
	}
	return p
}

// handleStart starts a background process: its stdin stays open until
// closed through /stdin, and its output is kept in its rings for /output.
func (a *Agent) handleStart(w http.ResponseWriter, r *http.Request) {
	var spec ExecSpec
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		WriteError(w, api.Errorf(api.KindInvalid, "bad process request: %v", err))
		return
	}
	spec.StdinOpen = true
	if !validRestart(spec.Restart) {
		WriteError(w, api.FieldError("restart", "%q: use no, always or on-failure", spec.Restart))
		return
	}
	if spec.Name != "" {
		if !ValidProcName(spec.Name) {
			WriteError(w, api.FieldError("name", "%q: use 1-64 letters, digits, '-', '_' or '.', not shaped like a process id (p12)", spec.Name))
			return
		}
		a.mu.Lock()
		for _, q := range a.order {
			if q.name == spec.Name && live(q) {
				a.mu.Unlock()
				WriteError(w, api.Errorf(api.KindExists, "a process named %q is running (%s)", spec.Name, q.ID))
				return
			}
		}
		a.mu.Unlock()
	}
	res, err := a.resolve(&spec)
	if err != nil {
		var se *startError
		if errors.As(err, &se) {
			err = api.FieldError("cmd", "%s", se.msg)
		}
		WriteError(w, err)
		return
	}
	var svc *service
	if spec.Restart == "always" || spec.Restart == "on-failure" {
		res.stdoutRing, res.stderrRing = newRing(a.opts.OutputLimit), newRing(a.opts.OutputLimit)
		res.keepRings = true
		res.stdinOpen = false // each run gets /dev/null; there is no one stdin across runs
		res.stdin = nil
		svc = &service{res: res, policy: spec.Restart}
	}
	p, err := a.spawn(res)
	if err != nil {
		WriteError(w, api.Errorf(api.KindInvalid, "start %q: %v", spec.Argv[0], err))
		return
	}
	p.name = spec.Name
	res.name, res.id = spec.Name, p.ID
	if svc != nil {
		svc.id = p.ID
		p.service = svc
		go a.supervise(svc, p)
	}
	a.track(p)
	writeJSON(w, 201, p.Info())
}

func (a *Agent) handleProcs(w http.ResponseWriter, r *http.Request) {
	t := readProcs()
	a.mu.Lock()
	out := make([]api.ProcessInfo, 0, len(a.order))
	for _, p := range a.order {
		info := p.Info()
		info.Descendants = t.tree(p)
		out = append(out, info)
	}
	a.mu.Unlock()
	writeJSON(w, 200, out)
}

func (a *Agent) handleProc(w http.ResponseWriter, r *http.Request) {
	if p := a.proc(w, r); p != nil {
		info := p.Info()
		info.Descendants = readProcs().tree(p)
		writeJSON(w, 200, info)
	}
}

// handleOutput replays a process's retained output and, with follow=true,
// streams what comes next until the process ends. Readers never hold the
// process back: one that falls behind the bounded ring sees a dropped frame.
func (a *Agent) handleOutput(w http.ResponseWriter, r *http.Request) {
	p := a.proc(w, r)
	if p == nil {
		return
	}
	q := r.URL.Query()
	follow := q.Get("follow") == "true"
	tail := -1
	if v := q.Get("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			WriteError(w, api.FieldError("tail", "%q is not a non-negative number of lines", v))
			return
		}
		tail = n
	}
	var since time.Time
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			WriteError(w, api.FieldError("since", "%q is not an RFC 3339 time", v))
			return
		}
		since = t
	}
	type stream struct {
		rg  *ring
		typ byte
		c   *cursor
		end int64
	}
	streams := []*stream{{rg: p.stdout, typ: api.FrameStdout}, {rg: p.stderr, typ: api.FrameStderr}}
	for _, s := range streams {
		from := int64(0)
		switch {
		case tail >= 0:
			from = s.rg.OffsetTail(tail)
		case !since.IsZero():
			from = s.rg.OffsetSince(since)
		}
		s.c = s.rg.Attach(from, false)
		s.end = s.rg.End()
		defer s.rg.Detach(s.c)
	}
	w.Header().Set("Content-Type", api.StreamContentType)
	fl, _ := w.(http.Flusher)
	var wmu sync.Mutex
	failed := false
	send := func(typ byte, b []byte) bool {
		wmu.Lock()
		defer wmu.Unlock()
		if failed || api.WriteFrame(w, typ, b) != nil {
			failed = true
			return false
		}
		if fl != nil {
			fl.Flush()
		}
		return true
	}
	go func() {
		<-r.Context().Done()
		for _, s := range streams {
			s.rg.Detach(s.c)
		}
	}()
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Add(1)
		go func(s *stream) {
			defer wg.Done()
			buf := make([]byte, 32<<10)
			for follow || s.c.off < s.end {
				lim := buf
				if !follow {
					lim = buf[:min(int64(len(buf)), s.end-s.c.off)]
				}
				n, dropped, done, err := s.rg.Read(s.c, lim)
				if err != nil {
					return
				}
				if dropped > 0 {
					d, _ := json.Marshal(api.DroppedOutput{Bytes: dropped})
					if !send(api.FrameDropped, d) {
						return
					}
				}
				if n > 0 && !send(s.typ, buf[:n]) {
					return
				}
				if done {
					return
				}
			}
		}(s)
	}
	wg.Wait()
	if failed || r.Context().Err() != nil {
		return
	}
	if isDone(p) {
		b, _ := json.Marshal(p.Status())
		send(api.FrameExit, b)
	}
}

// ParseSignal accepts "TERM", "SIGTERM", "sigterm" or "15".
func ParseSignal(s string) (syscall.Signal, error) {
	if s == "" {
		return syscall.SIGKILL, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, api.FieldError("signal", "%d is not a signal number", n)
		}
		return syscall.Signal(n), nil
	}
	name := s
	if len(name) < 3 || (name[:3] != "SIG" && name[:3] != "sig") {
		name = "SIG" + name
	}
	b := []byte(name)
	for i := range b {
		if b[i] >= 'a' && b[i] <= 'z' {
			b[i] -= 'a' - 'A'
		}
	}
	if sig := unix.SignalNum(string(b)); sig != 0 {
		return sig, nil
	}
	return 0, api.FieldError("signal", "unknown signal %q (try TERM, KILL, INT, HUP or a number)", s)
}

func (a *Agent) handleSignal(w http.ResponseWriter, r *http.Request) {
	p := a.proc(w, r)
	if p == nil {
		return
	}
	var req api.SignalRequest
	if r.ContentLength != 0 {
		if err := decodeBody(r, &req); err != nil {
			WriteError(w, err)
			return
		}
	}
	sig, err := ParseSignal(req.Signal)
	if err != nil {
		WriteError(w, err)
		return
	}
	// A signal never ends a service's restart policy (the rule, and
	// unlike docker kill): a service the signal ends is started again.
	// A finished process's signal goes to what it left running (its tree).
	if isDone(p) && p.service == nil && !leftAlive(p) {
		WriteError(w, api.Errorf(api.KindConflict, "process %s has already exited and left no process running", p.ID))
		return
	}
	if err := p.Signal(sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		WriteError(w, api.Errorf(api.KindInternal, "signal %s: %v", p.ID, err))
		return
	}
	w.WriteHeader(204)
}

// stdinTimeout bounds how long one write may wait for a process that does
// not read its stdin.
const stdinTimeout = 30 * time.Second

func (a *Agent) handleStdin(w http.ResponseWriter, r *http.Request) {
	p := a.proc(w, r)
	if p == nil {
		return
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdinW == nil || p.stdinClosed.Load() || isDone(p) {
		WriteError(w, api.Errorf(api.KindConflict, "process %s has no open stdin (closed, exited, or started without one)", p.ID))
		return
	}
	p.stdinW.SetWriteDeadline(time.Now().Add(stdinTimeout))
	if _, err := io.Copy(p.stdinW, r.Body); err != nil {
		WriteError(w, api.Errorf(api.KindConflict, "write to the stdin of %s: %v", p.ID, err))
		return
	}
	if r.URL.Query().Get("close") == "true" {
		p.stdinClosed.Store(true)
		p.stdinW.Close()
	}
	w.WriteHeader(204)
}

func (a *Agent) handleWait(w http.ResponseWriter, r *http.Request) {
	p := a.proc(w, r)
	if p == nil {
		return
	}
	select {
	case <-p.done:
		writeJSON(w, 200, p.Status())
	case <-r.Context().Done():
	}
}
