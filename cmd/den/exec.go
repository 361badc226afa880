package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbExec = &verb{
	name:     "exec",
	summary:  "run a command in a sandbox",
	synopsis: "[flags] ID [--] CMD [ARG...]",
	details: `Output is streamed as it arrives and den exits with the command's exit code
(128+N when killed by signal N, 124 on timeout, 137 when out of memory).
When den's network policy refused connections or DNS queries the command
made, den prints one line on stderr after it ends naming them and the rule
that refused each (see den net log for all of them); --json has them as
"denied". Each argument is one argv entry; for a shell line use: den exec ID -- sh -c '...'

With -it the command runs on a terminal of the size of den's own, which is
put in raw mode while den runs: what is typed goes to the command, window
size changes follow, Ctrl-C interrupts the command's foreground job, and
den exits with the command's exit code. With -t alone the command has a
terminal but no input; Ctrl-C is passed on as SIGINT (a third one leaves
it running). Without a terminal on den's side, input is copied as is and
its end typed as Ctrl-D. See also den shell.

With -d the command starts in the background and den prints its process id
(PROC) at once; the process keeps running after den exits. See den ps,
den logs, den attach, den kill and den wait. With --restart always or
on-failure it is a service: started again, with backoff, when it ends, and
again when the sandbox starts. --name names it (shown by den ps): den logs,
attach, kill and wait then take the name in place of its id (a name shaped
like an id, p12, is refused).

With --session NAME the command runs in the sandbox's long-lived shell of
that name (created on first use), so cd, export and functions persist for
the next command of the session. One argument is a shell line, run by the
session's shell as it is; several are one command, each argument quoted, so
den exec --session s web -- sh -c 'echo "a b"' prints a b. See den sessions.`,
	example: `den exec web -- make test
		echo 'print(1)' | den exec -i web -- python3 -
		den exec -it web -- python3
		den exec -d web -- python3 -m http.server 8000
		den exec -d --restart always --name api web -- ./serve --port 8000
		den exec --session s web -- 'cd src && export MODE=dev'
		den exec --session s web -- 'pwd; echo $MODE'`,
	run: cmdExec,
}

// execOpts are the flags of one command (den exec, den run).
type execOpts struct {
	env           []string
	workdir, user string
	interactive   bool
	tty           bool
	timeout       api.Duration
	jsonOut       *bool

	// exec only
	session       string // run as a line of this shell session
	restart, name string // of a background process
}

func (o *execOpts) define(f *flagSet, withSandbox bool) {
	if !withSandbox { // den run shares these with the sandbox flags
		f.Var(listValue{&o.env, checkEnv}, "env", "e", "K=V", "set an environment variable (repeatable; -e K passes den's own $K)")
		f.Var(stringValue{&o.workdir}, "workdir", "w", "DIR", "working directory of the command")
		f.Var(stringValue{&o.user}, "user", "u", "USER", "user (name or uid[:gid]) to run as")
	}
	f.Var(boolValue{&o.interactive}, "interactive", "i", "", "send standard input to the command (all of it, read first, and over 1 MiB streamed to it; with -t, as it is typed)")
	f.Var(boolValue{&o.tty}, "tty", "t", "", "run the command on a terminal (with -i: an interactive terminal session, like -it in docker)")
	f.Var(durationValue{&o.timeout}, "timeout", "", "DURATION", "kill the command after this long, like 30s (exit code 124)")
	usage := "capture the output and print the result as JSON (stdout, stderr, exit status); with -d, the started process"
	if withSandbox {
		usage = "print JSON: the command's captured result, or the sandbox when there is no command"
	}
	o.jsonOut = f.jsonFlag(usage)
}

// runCommand runs cmd in sandbox id, streaming its output (or printing the
// JSON result with --json), and returns the command's exit code as an
// exitError (nil for 0).
func (c *cli) runCommand(ctx context.Context, cl *client.Client, id string, o *execOpts, cmd []string, stdin []byte) error {
	req := api.ExecRequest{Cmd: cmd, Env: o.env, Workdir: o.workdir, User: o.user, Stdin: stdin, Timeout: o.timeout}
	if o.session != "" {
		req.Session = o.session
		if len(cmd) == 1 {
			req.Cmd, req.Shell = nil, cmd[0]
		}
	}
	if len(stdin) > api.MaxExecStdin && o.session == "" {
		return c.runStreamingStdin(ctx, cl, id, o, req)
	}
	var st *api.ExitStatus
	if *o.jsonOut {
		res, err := cl.Exec(ctx, id, req)
		if err != nil {
			return interrupted(ctx, err)
		}
		if err := c.printJSON(res); err != nil {
			return err
		}
		st = &res.ExitStatus
		return c.statusExit(st, o.timeout, true)
	}
	st, err := cl.ExecStream(ctx, id, req, c.stdout, c.stderr)
	if err != nil {
		return interrupted(ctx, err)
	}
	if line := deniedLine(st.Denied, id); line != "" {
		fmt.Fprintln(c.stderr, line)
	}
	return c.statusExit(st, o.timeout, false)
}

// deniedLine is the one line den exec prints on stderr when den's egress
// refused some of the command's connections or DNS queries, like
// "den: 2 connections denied (example.com:443 name not in allow list;
// 10.0.0.1:80 address not public): see den net log web"; "" for none.
func deniedLine(denied []api.DeniedConn, sandbox string) string {
	if len(denied) == 0 {
		return ""
	}
	const shown = 3
	n := 0
	var parts []string
	for i, d := range denied {
		n += d.Count
		if i >= shown {
			continue
		}
		what := net.JoinHostPort(d.Host, strconv.Itoa(d.Port))
		if d.Proto == "dns" {
			what = "DNS " + d.Host
		}
		if d.Count > 1 {
			what += fmt.Sprintf(" (%d times)", d.Count)
		}
		parts = append(parts, what+" "+d.Rule)
	}
	if len(denied) > shown {
		parts = append(parts, fmt.Sprintf("and %d more", len(denied)-shown))
	}
	noun := "connections"
	if n == 1 {
		noun = "connection"
	}
	return fmt.Sprintf("den: %d %s denied (%s): see den net log %s", n, noun, strings.Join(parts, "; "), sandbox)
}

// runStreamingStdin runs req with more stdin than an exec request carries
// (api.MaxExecStdin): as a background process whose standard input is
// streamed to it, while its output is followed to its end. With --json the
// output is captured (at most 1 MiB of each stream kept) and printed as an
// exec result.
func (c *cli) runStreamingStdin(ctx context.Context, cl *client.Client, id string, o *execOpts, req api.ExecRequest) error {
	stdin := req.Stdin
	req.Stdin = nil
	p, err := cl.StartProcess(ctx, id, req)
	if err != nil {
		return interrupted(ctx, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stdout, stderr := c.stdout, c.stderr
	go func() {
		// A process that has ended takes no more input: not an error.
		err := cl.WriteStdin(wctx, id, p.ID, bytes.NewReader(stdin), true)
		if err != nil && wctx.Err() == nil {
			if pi, perr := cl.Process(wctx, id, p.ID); perr == nil && pi.State == api.ProcRunning {
				fmt.Fprintf(stderr, "den: write to the standard input of %s: %v\n", p.ID, err)
			}
		}
	}()
	var out, errb cappedBuffer
	if *o.jsonOut {
		stdout, stderr = &out, &errb
	}
	st, err := cl.Logs(ctx, id, p.ID, client.LogsOptions{Follow: true}, stdout, stderr)
	if err != nil {
		return interrupted(ctx, err)
	}
	cancel()
	if *o.jsonOut {
		if err := c.printJSON(api.ExecResult{ExitStatus: *st, Stdout: out.b.Bytes(), Stderr: errb.b.Bytes(), Truncated: out.cut || errb.cut}); err != nil {
			return err
		}
	}
	return c.statusExit(st, o.timeout, *o.jsonOut)
}

// cappedBuffer keeps the first MiB written to it.
type cappedBuffer struct {
	b   bytes.Buffer
	cut bool
}

func (w *cappedBuffer) Write(p []byte) (int, error) {
	if room := 1<<20 - w.b.Len(); len(p) > room {
		w.b.Write(p[:max(room, 0)])
		w.cut = true
		return len(p), nil
	}
	return w.b.Write(p)
}

// startCommand starts cmd in the background in sandbox id and prints its
// process id (or, with --json, the process). With -i, stdin is written to
// the process's standard input, which is then closed.
func (c *cli) startCommand(ctx context.Context, cl *client.Client, id string, o *execOpts, cmd []string, stdin []byte) error {
	// stdin goes through the stdin route rather than the request, so that it
	// is written before the input is closed.
	req := api.ExecRequest{Cmd: cmd, Env: o.env, Workdir: o.workdir, User: o.user, Timeout: o.timeout,
		Restart: o.restart, Name: o.name}
	if o.tty {
		req.TTY = true
		req.Rows, req.Cols = termSize(c)
	}
	p, err := cl.StartProcess(ctx, id, req)
	if err != nil {
		return interrupted(ctx, err)
	}
	if o.interactive {
		if err := cl.WriteStdin(ctx, id, p.ID, bytes.NewReader(stdin), true); err != nil {
			return fmt.Errorf("process %s started, but writing its standard input failed: %w", p.ID, interrupted(ctx, err))
		}
	}
	if *o.jsonOut {
		return c.printJSON(p)
	}
	_, err = fmt.Fprintln(c.stdout, p.ID)
	return err
}

// interrupted turns the error of a call cut by Ctrl-C into exit code 130.
func interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return interruptErr
	}
	return err
}

var interruptErr = &interruptError{}

type interruptError struct{}

func (*interruptError) Error() string { return "interrupted" }

// statusExit maps how a command ended to den's exit code, printing a
// one-line reason for anything but a normal exit.
func (c *cli) statusExit(st *api.ExitStatus, timeout api.Duration, quiet bool) error {
	code, why := exitCode(st, timeout)
	if why != "" && !quiet {
		fmt.Fprintf(c.stderr, "den: %s\n", why)
	}
	if code == 0 {
		return nil
	}
	return exitError(code)
}

// exitCode maps how a command ended to den's exit code (128+N when killed
// by signal N, 124 on timeout, 137 when out of memory, 127 or 126 when it
// could not start) and, for anything but a normal exit, a one-line reason.
// timeout, if set, is the timeout the command was given.
func exitCode(st *api.ExitStatus, timeout api.Duration) (code int, why string) {
	code = st.ExitCode
	switch st.Reason {
	case api.ReasonExited, "":
	case api.ReasonSignaled:
		name, n := signalName(st.Signal)
		switch {
		case n > 0:
			code = 128 + n
		case code <= 0:
			code = 128 + int(syscall.SIGKILL)
		}
		why = "command killed by signal " + name
	case api.ReasonTimeout:
		code = 124
		d := timeout.D()
		if d == 0 {
			d = st.Duration.D().Round(time.Millisecond)
		}
		why = "command timed out after " + d.String()
	case api.ReasonOOM:
		code = 137
		why = "command killed: out of memory (see --memory)"
	case api.ReasonFailed:
		code = 127
		if strings.Contains(strings.ToLower(st.Error), "permission denied") {
			code = 126
		}
		why = "cannot run the command: " + st.Error
	default:
		if code == 0 {
			code = 1
		}
		why = "command ended: " + st.Reason
	}
	return code, why
}

// signalName normalizes a signal as the daemon reports it ("SIGKILL",
// "KILL", "9", "killed") to "SIGKILL" and its number.
func signalName(s string) (string, int) {
	t := strings.ToUpper(strings.TrimSpace(s))
	if n, err := strconv.Atoi(t); err == nil && n > 0 && n < 65 {
		if name := signalNames[n]; name != "" {
			return name, n
		}
		return "SIG" + t, n
	}
	t = strings.TrimPrefix(t, "SIG")
	for n, name := range signalNames {
		if name == "SIG"+t || (name != "" && strings.EqualFold(syscall.Signal(n).String(), s)) {
			return name, n
		}
	}
	if s == "" {
		return "(unknown)", 0
	}
	return s, 0
}

// signalNames are Linux's signal numbers.
var signalNames = [...]string{
	1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS",
	8: "SIGFPE", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE",
	14: "SIGALRM", 15: "SIGTERM", 16: "SIGSTKFLT", 17: "SIGCHLD", 18: "SIGCONT", 19: "SIGSTOP",
	20: "SIGTSTP", 21: "SIGTTIN", 22: "SIGTTOU", 23: "SIGURG", 24: "SIGXCPU", 25: "SIGXFSZ",
	26: "SIGVTALRM", 27: "SIGPROF", 28: "SIGWINCH", 29: "SIGIO", 30: "SIGPWR", 31: "SIGSYS",
}

// signalContext is cancelled by Ctrl-C or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// readStdin reads all of standard input for -i.
func (c *cli) readStdin() ([]byte, error) {
	b, err := io.ReadAll(c.stdin)
	if err != nil {
		return nil, fmt.Errorf("read standard input: %w", err)
	}
	return b, nil
}

func cmdExec(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	var o execOpts
	o.define(f, false)
	detach := f.Bool("detach", "d", "start the command in the background and print its process id")
	f.Var(stringValue{&o.session}, "session", "", "NAME", "run the command as a shell line in the sandbox's shell session NAME, which keeps cd, export and functions between commands")
	f.Var(stringValue{&o.restart}, "restart", "", "POLICY", "with -d: restart the process when it ends: always or on-failure (a service)")
	f.Var(stringValue{&o.name}, "name", "", "NAME", "with -d: name the background process, for logs/attach/kill/wait in place of its id")
	pos, cmd, err := f.parse(args, 1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef(v, "exec needs a sandbox ID and a command")
	}
	if len(cmd) == 0 {
		return usagef(v, "exec needs a command after the sandbox ID, like: den exec %s -- ls -l", pos[0])
	}
	switch o.restart {
	case "", "always", "on-failure":
	case "no":
		o.restart = ""
	default:
		return usagef(v, "bad value %q for --restart: want always or on-failure", o.restart)
	}
	switch {
	case (f.isSet("restart") || f.isSet("name")) && !*detach:
		return usagef(v, "--restart and --name are for background processes: add -d, like: den exec -d --restart always %s -- CMD", pos[0])
	case f.isSet("session") && o.session == "":
		return usagef(v, "bad value \"\" for --session: want a session name")
	case o.session != "" && (*detach || o.tty || o.interactive):
		return usagef(v, "--session runs one shell line without input: it does not go with -d, -i or -t")
	case o.tty && *o.jsonOut:
		return usagef(v, "--json does not go with -t")
	case o.tty && *detach && o.interactive:
		return usagef(v, "-d -t starts the command on a terminal with no input sent: drop -i")
	}
	if o.tty && !*detach {
		req := api.ExecRequest{Cmd: cmd, Env: o.env, Workdir: o.workdir, User: o.user, Timeout: o.timeout}
		return c.ttyExit(c.runTTY(c.client(f), pos[0], req, o.interactive))
	}
	var stdin []byte
	if o.interactive {
		if stdin, err = c.readStdin(); err != nil {
			return err
		}
	}
	ctx, stop := signalContext()
	defer stop()
	if *detach {
		err = c.startCommand(ctx, c.client(f), pos[0], &o, cmd, stdin)
	} else {
		err = c.runCommand(ctx, c.client(f), pos[0], &o, cmd, stdin)
	}
	if err == interruptErr {
		fmt.Fprintln(c.stderr, "den: interrupted")
		return exitError(130)
	}
	return err
}

// ttyExit reports an interrupted start of a terminal session.
func (c *cli) ttyExit(err error) error {
	if err == interruptErr {
		fmt.Fprintln(c.stderr, "den: interrupted")
		return exitError(130)
	}
	return err
}
