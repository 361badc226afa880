package sshgw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// loginShell starts bash -l if there is a bash, else sh -l (as den shell).
var loginShell = []string{"/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"}

// Request payloads (RFC 4254, section 6).
type ptyReq struct {
	Term                      string
	Cols, Rows, Width, Height uint32
	Modes                     string
}

type windowChange struct{ Cols, Rows, Width, Height uint32 }

type envReq struct{ Name, Value string }

type execReq struct{ Command string }

type subsystemReq struct{ Name string }

type signalReq struct{ Signal string }

type exitStatus struct{ Status uint32 }

type exitSignal struct {
	Signal     string
	CoreDumped bool
	Error      string
	Lang       string
}

// session is one session channel: at most one shell, command or subsystem.
type session struct {
	g   *Gateway
	l   *login
	ch  ssh.Channel
	ctx context.Context

	mu      sync.Mutex
	env     []string
	pty     *ptyReq
	started bool
	proc    string      // the process, once started
	tty     *client.TTY // its terminal, with a PTY
	size    *windowChange
}

func (g *Gateway) session(ctx context.Context, l *login, nch ssh.NewChannel) {
	ch, reqs, err := nch.Accept()
	if err != nil {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &session{g: g, l: l, ch: ch, ctx: ctx}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ch.Close()
	go func() { // the connection ended: end the session
		<-ctx.Done()
		ch.Close()
	}()
	for req := range reqs {
		ok := s.request(req, &wg, cancel)
		if req.WantReply {
			req.Reply(ok, nil)
		}
	}
	// The client closed the channel. A process still running loses its
	// terminal like a hung-up login.
	s.mu.Lock()
	proc := s.proc
	s.mu.Unlock()
	if proc != "" {
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 5e9)
		s.l.c.Kill(kctx, s.l.sb.ID, proc, "HUP")
		kcancel()
	}
}

// request handles one channel request and says whether it succeeded.
func (s *session) request(req *ssh.Request, wg *sync.WaitGroup, done func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch req.Type {
	case "pty-req":
		var p ptyReq
		if ssh.Unmarshal(req.Payload, &p) != nil || s.started {
			return false
		}
		s.pty = &p
		return true
	case "env":
		var e envReq
		if ssh.Unmarshal(req.Payload, &e) != nil || e.Name == "" || strings.ContainsAny(e.Name, "=\x00") || s.started {
			return false
		}
		s.env = append(s.env, e.Name+"="+e.Value)
		return true
	case "window-change":
		var w windowChange
		if ssh.Unmarshal(req.Payload, &w) != nil {
			return false
		}
		s.size = &w
		if s.tty != nil {
			s.tty.Resize(clamp(w.Rows), clamp(w.Cols))
		}
		return true
	case "signal":
		var sig signalReq
		if ssh.Unmarshal(req.Payload, &sig) != nil || s.proc == "" {
			return false
		}
		return s.l.c.Kill(s.ctx, s.l.sb.ID, s.proc, sig.Signal) == nil
	case "shell", "exec", "subsystem":
		if s.started {
			return false
		}
		var cmd []string
		switch req.Type {
		case "shell":
			cmd = loginShell
		case "exec":
			var e execReq
			if ssh.Unmarshal(req.Payload, &e) != nil {
				return false
			}
			cmd = []string{"/bin/sh", "-c", e.Command}
		case "subsystem":
			var sub subsystemReq
			if ssh.Unmarshal(req.Payload, &sub) != nil || sub.Name != "sftp" {
				return false
			}
		}
		s.started = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer done()
			if cmd == nil {
				s.finish(nil, s.sftp())
			} else {
				s.finish(s.run(cmd))
			}
		}()
		return true
	}
	return false // x11-req, auth-agent-req@openssh.com, ...
}

// run runs cmd in the sandbox for the channel and returns how it ended.
func (s *session) run(cmd []string) (*api.ExitStatus, error) {
	s.mu.Lock()
	req := api.ExecRequest{Cmd: cmd, Env: s.env}
	pty := s.pty
	if pty != nil {
		rows, cols := clamp(pty.Rows), clamp(pty.Cols)
		if s.size != nil {
			rows, cols = clamp(s.size.Rows), clamp(s.size.Cols)
		}
		req.TTY, req.Rows, req.Cols = true, rows, cols
		if pty.Term != "" {
			req.Env = append(req.Env, "TERM="+pty.Term)
		}
	}
	s.mu.Unlock()
	c, id := s.l.c, s.l.sb.ID
	p, err := c.StartProcess(s.ctx, id, req)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.proc = p.ID
	s.mu.Unlock()
	if pty != nil {
		return s.runTTY(id, p.ID)
	}
	// Standard input streams in until the client's end of file. (Only
	// the channel's reading side: the HTTP transport closes a body that
	// is a Closer, which would close the channel.)
	go func() {
		if err := c.WriteStdin(s.ctx, id, p.ID, struct{ io.Reader }{s.ch}, true); err != nil {
			s.g.cfg.Log.Debug("ssh: stdin", "sandbox", id, "proc", p.ID, "err", err)
		}
	}()
	st, err := c.Logs(s.ctx, id, p.ID, client.LogsOptions{Follow: true}, s.ch, s.ch.Stderr())
	s.ended()
	return st, err
}

func (s *session) runTTY(id, proc string) (*api.ExitStatus, error) {
	t, err := s.l.c.AttachTTY(s.ctx, id, proc)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	s.mu.Lock()
	s.tty = t
	if s.size != nil { // a change that came while attaching
		t.Resize(clamp(s.size.Rows), clamp(s.size.Cols))
	}
	s.mu.Unlock()
	go io.Copy(t, s.ch) // keystrokes; the client's EOF changes nothing
	if _, err := io.Copy(s.ch, t); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	st, err := t.Wait()
	s.ended()
	return st, err
}

// ended records that the process has ended, so a closing client does not
// signal it.
func (s *session) ended() {
	s.mu.Lock()
	s.proc, s.tty = "", nil
	s.mu.Unlock()
}

// finish reports how the session ended and closes the channel: the exit
// status (or signal) of the process, or a den error on stderr with status
// 255, as OpenSSH reports its own failures.
func (s *session) finish(st *api.ExitStatus, err error) {
	ch := s.ch
	switch {
	case err != nil:
		fmt.Fprintf(ch.Stderr(), "den: %v\r\n", err)
		s.g.cfg.Log.Info("ssh: session failed", "sandbox", s.l.sb.ID, "err", err)
		ch.SendRequest("exit-status", false, ssh.Marshal(exitStatus{255}))
	case st == nil:
		ch.SendRequest("exit-status", false, ssh.Marshal(exitStatus{0}))
	case st.Reason == api.ReasonSignaled && st.Signal != "":
		ch.SendRequest("exit-signal", false, ssh.Marshal(exitSignal{Signal: strings.TrimPrefix(st.Signal, "SIG")}))
	default:
		if st.Reason == api.ReasonFailed || st.Reason == api.ReasonTimeout || st.Reason == api.ReasonOOM {
			fmt.Fprintf(ch.Stderr(), "den: the command ended: %s %s\r\n", st.Reason, st.Error)
		}
		code := st.ExitCode
		if code == 0 && st.Reason != api.ReasonExited {
			code = 255
		}
		ch.SendRequest("exit-status", false, ssh.Marshal(exitStatus{uint32(code)}))
	}
	ch.CloseWrite()
	ch.Close()
}

// clamp turns a window dimension into the API's (0 when out of range,
// which the daemon ignores).
func clamp(n uint32) uint16 {
	if n > 0xffff {
		return 0
	}
	return uint16(n)
}
