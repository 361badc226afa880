package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/den-dev/den/api"
)

// A session is a long-lived shell in which an agent's commands run one after
// another, so the working directory, variables and shell functions one
// command sets are there for the next. Each command runs as a brace group
// in the shell itself, with stdin from /dev/null, followed by a marker line
// carrying its exit code; the marker ends the command's output.
type session struct {
	name    string
	proc    *Process
	out     *cursor
	errc    *cursor
	mu      sync.Mutex // one command at a time
	started time.Time
	busy    bool
}

const maxSessions = 64

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func validSessionName(n string) bool {
	if n == "" || len(n) > 64 {
		return false
	}
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// session returns the named session, starting its shell on first use with
// the user, environment and directory of spec.
func (a *Agent) session(spec *ExecSpec) (*session, error) {
	if !validSessionName(spec.Session) {
		return nil, api.FieldError("session", "%q: use 1-64 letters, digits, '-', '_' or '.'", spec.Session)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.sessions[spec.Session]; s != nil && !isDone(s.proc) {
		return s, nil
	}
	if len(a.sessions) >= maxSessions {
		return nil, api.Errorf(api.KindConflict, "%d sessions are open: close one first", maxSessions)
	}
	shell := []string{"/bin/sh"}
	if st, err := os.Stat("/bin/bash"); err == nil && !st.IsDir() {
		shell = []string{"/bin/bash", "--noprofile", "--norc"}
	}
	res, err := a.resolve(&ExecSpec{Argv: shell, Env: spec.Env, Dir: spec.Dir, User: spec.User, Image: spec.Image})
	if err != nil {
		return nil, err
	}
	res.stdinOpen = true
	p, err := a.spawn(res)
	if err != nil {
		return nil, api.Errorf(api.KindInternal, "start session shell: %v", err)
	}
	s := &session{name: spec.Session, proc: p, started: time.Now(),
		out: p.stdout.Attach(0, true), errc: p.stderr.Attach(0, true)}
	a.sessions[spec.Session] = s
	return s, nil
}

// execInSession runs spec.Argv's shell string in a session, sending output
// frames through send, and returns the command's exit status.
func (a *Agent) execInSession(ctx context.Context, spec *ExecSpec, send func(byte, []byte) error) (api.ExitStatus, error) {
	s, err := a.session(spec)
	if err != nil {
		return api.ExitStatus{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.busy = true
	defer func() { s.busy = false }()
	var nonce [8]byte
	rand.Read(nonce[:])
	tag := "__den_" + hex.EncodeToString(nonce[:]) + "_"
	var script strings.Builder
	for _, kv := range spec.Env {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&script, "export %s=%s\n", k, shellQuote(v))
	}
	cmd := spec.Shell
	if cmd == "" {
		quoted := make([]string, len(spec.Argv))
		for i, a := range spec.Argv {
			quoted[i] = shellQuote(a)
		}
		cmd = strings.Join(quoted, " ")
	}
	if spec.Dir != "" {
		fmt.Fprintf(&script, "cd %s && ", shellQuote(spec.Dir))
	}
	fmt.Fprintf(&script, "{ %s\n} </dev/null\nprintf '\\n%s%%d\\n' $?; printf '\\n%s\\n' >&2\n", cmd, tag, tag)
	start := time.Now()
	s.proc.stdinMu.Lock()
	_, err = s.proc.stdinW.Write([]byte(script.String()))
	s.proc.stdinMu.Unlock()
	if err != nil {
		return api.ExitStatus{}, api.Errorf(api.KindConflict, "session %s: its shell is gone: %v", s.name, err)
	}
	var timer *time.Timer
	var timedOut atomic.Bool
	if spec.Timeout > 0 {
		timer = time.AfterFunc(spec.Timeout, func() {
			timedOut.Store(true)
			s.proc.Signal(9) // the session ends with its command
		})
		defer timer.Stop()
	}
	var wg sync.WaitGroup
	var code string
	read := func(rg *ring, c *cursor, typ byte, wantCode bool) {
		defer wg.Done()
		marker := []byte("\n" + tag)
		var pending []byte
		buf := make([]byte, 32<<10)
		for {
			n, _, done, err := rg.Read(c, buf)
			if err != nil {
				return
			}
			pending = append(pending, buf[:n]...)
			if i := bytes.Index(pending, marker); i >= 0 {
				rest := pending[i+len(marker):]
				if wantCode {
					if j := bytes.IndexByte(rest, '\n'); j >= 0 {
						code = string(rest[:j])
					} else {
						// the code is still coming: keep reading
						if done {
							return
						}
						continue
					}
				}
				if i > 0 {
					send(typ, pending[:i])
				}
				return
			}
			// Pass on all but what could be the start of a marker.
			keep := min(len(pending), len(marker))
			if out := pending[:len(pending)-keep]; len(out) > 0 {
				send(typ, out)
				pending = append(pending[:0], pending[len(pending)-keep:]...)
			}
			if done {
				if len(pending) > 0 {
					send(typ, pending)
				}
				return
			}
		}
	}
	wg.Add(2)
	go read(s.proc.stdout, s.out, api.FrameStdout, true)
	go read(s.proc.stderr, s.errc, api.FrameStderr, false)
	wg.Wait()
	st := api.ExitStatus{Reason: api.ReasonExited, Duration: api.Duration(time.Since(start))}
	if n, err := strconv.Atoi(code); err == nil {
		st.ExitCode = n
		return st, nil
	}
	// No marker: the shell itself ended (exit, a kill, the timeout).
	<-s.proc.Done()
	st = s.proc.Status()
	if timedOut.Load() {
		st.Reason, st.ExitCode = api.ReasonTimeout, 124
	}
	a.closeSession(s.name)
	return st, nil
}

func (a *Agent) closeSession(name string) bool {
	a.mu.Lock()
	s := a.sessions[name]
	delete(a.sessions, name)
	a.mu.Unlock()
	if s == nil {
		return false
	}
	s.proc.Signal(9)
	s.proc.stdout.Detach(s.out)
	s.proc.stderr.Detach(s.errc)
	return true
}

func (a *Agent) handleSessions(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	out := []api.Session{}
	for _, s := range a.sessions {
		if !isDone(s.proc) {
			out = append(out, api.Session{Name: s.name, Pid: s.proc.Pid, Started: s.started.UTC(), Busy: s.busy})
		}
	}
	a.mu.Unlock()
	writeJSON(w, 200, out)
}

func (a *Agent) handleCloseSession(w http.ResponseWriter, r *http.Request) {
	if !a.closeSession(r.PathValue("name")) {
		WriteError(w, api.Errorf(api.KindNotFound, "no session %q", r.PathValue("name")))
		return
	}
	w.WriteHeader(204)
}
