package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/store"
)

func validateExec(req *api.ExecRequest) error {
	switch req.Restart {
	case "", "no", "always", "on-failure":
	default:
		return api.FieldError("restart", "%q: use no, always or on-failure", req.Restart)
	}
	if req.Session != "" && (req.Restart != "" || req.Name != "") {
		return api.FieldError("session", "a session command cannot be a named or restarted background process")
	}
	switch {
	case len(req.Cmd) == 0 && req.Shell == "":
		return api.FieldError("cmd", "give a command (cmd) or a shell string (shell)")
	case len(req.Cmd) > 0 && req.Shell != "":
		return api.FieldError("shell", "give either cmd or shell, not both")
	case len(req.Cmd) > 0 && req.Cmd[0] == "":
		return api.FieldError("cmd", "the program name is empty")
	}
	field, args := "cmd", req.Cmd
	if req.Shell != "" {
		field, args = "shell", []string{"/bin/sh", "-c", req.Shell}
	}
	for i, a := range args {
		if strings.ContainsRune(a, 0) {
			return api.FieldError(field, "an argument contains a NUL byte")
		}
		if len(a) > api.MaxArgLen {
			return api.FieldError(field, "argument %d is %d bytes; Linux takes at most %d per argument (MAX_ARG_STRLEN): pass large data as stdin or a file", i, len(a), api.MaxArgLen)
		}
	}
	if err := validateEnv("env", req.Env); err != nil {
		return err
	}
	if n := api.ArgBytes(args...); n > api.MaxArgTotal {
		return api.FieldError(field, "the arguments take %d bytes; Linux takes at most %d for arguments and environment together (ARG_MAX): pass large data as stdin or a file", n, api.MaxArgTotal)
	}
	if n := api.ArgBytes(args...) + api.ArgBytes(req.Env...); n > api.MaxArgTotal {
		return api.FieldError("env", "arguments and environment take %d bytes; Linux takes at most %d for both together (ARG_MAX): pass large data as stdin or a file", n, api.MaxArgTotal)
	}
	if req.Workdir != "" && !strings.HasPrefix(req.Workdir, "/") {
		return api.FieldError("workdir", "%q is not an absolute path", req.Workdir)
	}
	if req.Session != "" && len(req.Stdin) > 0 {
		return api.FieldError("stdin", "commands in a session read no stdin")
	}
	if len(req.Stdin) > api.MaxExecStdin {
		return api.FieldError("stdin", "%d bytes; at most %d go in the request: stream larger input to a background process (POST .../processes, then .../processes/{proc}/stdin; den exec -i does this) or upload a file", len(req.Stdin), api.MaxExecStdin)
	}
	return nil
}

// Exec runs a command in a sandbox. Output frames (started, stdout,
// stderr, dropped) go to out as they come; the exit status is returned.
// An error returned by out (the client went away) ends the exec early and
// leaves the command running.
func (m *Manager) Exec(ctx context.Context, id string, req api.ExecRequest, out func(typ byte, payload []byte) error) (*api.ExitStatus, error) {
	if err := validateExec(&req); err != nil {
		return nil, err
	}
	if req.Restart != "" || req.Name != "" || req.TTY {
		return nil, api.FieldError("restart", "restart, name and tty apply to background processes (POST .../processes, den exec -d or -it)")
	}
	ag, sb, err := m.Agent(ctx, id)
	if err != nil {
		return nil, err
	}
	b := m.box(sb.ID)
	if b == nil {
		return nil, api.Errorf(api.KindConflict, "sandbox %s stopped", sb.ID[:12])
	}
	spec, argv, user := m.execSpec(ctx, sb, &req)
	defer m.hold(sb.ID)()
	oomBefore := b.OOMKills()
	w := m.watchDenials(sb.ID)
	defer m.stopDenials(w)
	rc, err := ag.Exec(ctx, spec)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	proc := ""
	var outErr error
	st, err := api.ReadExecStream(rc, func(f *api.ExecFrame) error {
		if f.Type == api.FrameStarted && f.Started.ID != "" {
			proc = f.Started.ID
			// Recorded first, so an exec cut off by a daemon crash is
			// still accounted for when the next daemon starts.
			m.event(sb.ID, "exec.start", map[string]any{"process": proc, "cmd": argv, "user": user})
		}
		outErr = out(f.Type, f.Payload)
		return outErr
	})
	if err != nil {
		var ae *api.Error
		switch {
		case outErr != nil || errors.As(err, &ae):
			return nil, err // out's, or an error frame's
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err == io.EOF:
			err = fmt.Errorf("output stream ended without an exit status: %w", io.ErrUnexpectedEOF)
		}
		return nil, fmt.Errorf("sandbox %s: exec %w", sb.ID[:12], err)
	}
	if st.Signal == "SIGKILL" && st.Reason != api.ReasonTimeout && b.OOMKills() > oomBefore {
		st.Reason, st.ExitCode = api.ReasonOOM, 137
	}
	st.Denied = m.endDenials(w, proc, time.Now())
	m.event(sb.ID, "exec.end", execEnd(proc, argv, user, st))
	if state, ok := m.stops.stopping(sb.ID); ok {
		// The command ended on the stop signal of a graceful stop: the
		// answer is the one a request cut off by the stop gets.
		return nil, api.Errorf(api.KindConflict, "sandbox %s %s while the request ran", sb.ID[:12], state)
	}
	return st, nil
}

func execEnd(proc string, argv []string, user string, st *api.ExitStatus) map[string]any {
	return map[string]any{
		"process": proc, "cmd": argv, "user": user, "exit_code": st.ExitCode, "reason": st.Reason,
		"signal": st.Signal, "duration": st.Duration, "cpu": st.CPU, "max_rss": st.MaxRSS,
	}
}

// settleExecs records the end of every exec whose stream a previous daemon
// lost: an exec.start without an exec.end whose process the agent reports
// (finished, or still running, in which case a watcher records it later).
func (m *Manager) settleExecs(ctx context.Context, id string, ag *agent.Client) {
	evs, err := m.db.Events(ctx, store.EventFilter{Sandbox: id, Type: "exec."})
	if err != nil {
		return
	}
	open := map[string][]string{}
	for _, e := range evs {
		var d struct {
			Process string   `json:"process"`
			Cmd     []string `json:"cmd"`
		}
		if json.Unmarshal(e.Data, &d) != nil || d.Process == "" {
			continue
		}
		if e.Type == "exec.start" {
			open[d.Process] = d.Cmd
		} else if e.Type == "exec.end" {
			delete(open, d.Process)
		}
	}
	for proc, argv := range open {
		var info api.ProcessInfo
		if err := ag.JSON(ctx, "GET", agent.ProcPath(proc, ""), nil, nil, &info); err != nil {
			continue // forgotten by the agent: nothing more to learn
		}
		go func(proc string, argv []string) {
			var st api.ExitStatus
			if err := ag.JSON(context.Background(), "GET", agent.ProcPath(proc, agent.ProcWait), nil, nil, &st); err != nil {
				return
			}
			d := execEnd(proc, argv, "", &st)
			d["recovered"] = true
			m.event(id, "exec.end", d)
		}(proc, argv)
	}
}

// execSpec merges the image's and the sandbox's defaults into a request.
func (m *Manager) execSpec(ctx context.Context, sb *api.Sandbox, req *api.ExecRequest) (spec *agent.ExecSpec, argv []string, user string) {
	argv = req.Cmd
	if req.Shell != "" {
		argv = []string{"/bin/sh", "-c", req.Shell}
	}
	env, dir, user := sb.Env, sb.Workdir, sb.User
	if sb.Image != HostImage {
		if img, err := m.Image(ctx, sb.Image); err == nil {
			env = append(append([]string{}, img.Config.Env...), env...)
			if dir == "" {
				dir = img.Config.Workdir
			}
			if user == "" {
				user = img.Config.User
			}
		}
	}
	if req.Workdir != "" {
		dir = req.Workdir
	}
	if req.User != "" {
		user = req.User
	}
	spec = &agent.ExecSpec{
		Argv: argv, Env: append(append(m.proxyEnv(sb.Network), env...), req.Env...), Dir: dir, User: user,
		Stdin: req.Stdin, Timeout: req.Timeout.D(), Session: req.Session,
		Restart: req.Restart, Name: req.Name, TTY: req.TTY, Rows: req.Rows, Cols: req.Cols,
		Image: sb.Image,
	}
	if req.Session != "" {
		spec.Shell = req.Shell
	}
	return spec, argv, user
}

// StartProcess starts a background process that outlives the request.
func (m *Manager) StartProcess(ctx context.Context, id string, req api.ExecRequest) (*api.ProcessInfo, error) {
	if err := validateExec(&req); err != nil {
		return nil, err
	}
	ag, sb, err := m.Agent(ctx, id)
	if err != nil {
		return nil, err
	}
	spec, argv, user := m.execSpec(ctx, sb, &req)
	var info api.ProcessInfo
	if err := ag.JSON(ctx, "POST", agent.PathProcs, nil, spec, &info); err != nil {
		return nil, err
	}
	m.event(sb.ID, "process.start", map[string]any{"process": info.ID, "cmd": argv, "user": user, "restart": req.Restart})
	if req.Restart == "always" || req.Restart == "on-failure" {
		// Remember the service so it starts again with the sandbox.
		unlock := m.lock(sb.ID)
		defer unlock()
		rec, err := m.get(ctx, sb.ID)
		if err != nil {
			return nil, err
		}
		rec.Services = append(rec.Services, service{Req: req, Proc: info.ID})
		if err := m.put(ctx, rec); err != nil {
			return nil, err
		}
	}
	return &info, nil
}

// service is a background process with a restart policy, kept in the
// sandbox's record so it starts again when the sandbox does.
type service struct {
	Req  api.ExecRequest `json:"req"`
	Proc string          `json:"proc"` // its process id in the current run of the sandbox
}

// startServices starts a booted sandbox's services again. Call with the
// sandbox locked.
func (m *Manager) startServices(ctx context.Context, rec *record, ag *agent.Client) {
	sb := rec.Sandbox
	for i := range rec.Services {
		s := &rec.Services[i]
		spec, _, _ := m.execSpec(ctx, &sb, &s.Req)
		var info api.ProcessInfo
		if err := ag.JSON(ctx, "POST", agent.PathProcs, nil, spec, &info); err != nil {
			m.log.Warn("start service", "sandbox", rec.ID, "name", s.Req.Name, "err", err)
			continue
		}
		s.Proc = info.ID
		m.event(rec.ID, "process.start", map[string]any{"process": info.ID, "cmd": spec.Argv, "restart": s.Req.Restart, "service": true})
	}
	if len(rec.Services) > 0 {
		m.put(ctx, rec)
	}
}
