package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/den-dev/den/api"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// background runs den in a goroutine; the exit code arrives on the channel.
func background(f *fakeDaemon, stdin io.Reader, args ...string) (stdout, stderr *syncBuffer, code chan int) {
	stdout, stderr, code = new(syncBuffer), new(syncBuffer), make(chan int, 1)
	args = append([]string{"--host", f.host}, args...)
	go func() { code <- run(args, stdin, stdout, stderr) }()
	return stdout, stderr, code
}

// eventually waits until cond holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func waitCode(t *testing.T, code chan int) int {
	t.Helper()
	select {
	case c := <-code:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("den did not end")
		return -1
	}
}

func TestExecTTY(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})
	t.Setenv("TERM", "xterm-256color")

	// Input that is not a terminal is copied as it is, its end typed as Ctrl-D.
	r := den(t, f, "hello\n", "exec", "-it", "-e", "A=1", "-w", "/work", "-u", "nobody", "--timeout", "1m", "box", "--", "cat")
	if r.code != 0 || r.stdout != "started\r\nhello\n" || r.stderr != "" {
		t.Fatalf("exec -it cat: %+v", r)
	}
	want := api.ExecRequest{Cmd: []string{"cat"}, Env: []string{"TERM=xterm-256color", "A=1"}, Workdir: "/work", User: "nobody",
		Timeout: api.Duration(time.Minute), TTY: true, Rows: 24, Cols: 80}
	if got := f.procReqs[0]; !reflect.DeepEqual(got, want) {
		t.Errorf("exec -it sent %+v\nwant %+v", got, want)
	}
	if got := f.ttyLog("p1"); !reflect.DeepEqual(got, []string{"bin:hello\n", "bin:\x04"}) {
		t.Errorf("the terminal got %q", got)
	}
	if len(f.execs) != 0 {
		t.Errorf("exec -it ran a plain exec: %+v", f.execs)
	}

	// The exit code is the command's; -t alone sends no input; TERM given
	// with -e wins.
	r = den(t, f, "ignored", "exec", "-t", "-e", "TERM=vt100", "box", "--", "exit", "3")
	if r.code != 3 || r.stdout != "started\r\n" {
		t.Errorf("exec -t exit 3: %+v", r)
	}
	if got := f.procReqs[1]; !got.TTY || !reflect.DeepEqual(got.Env, []string{"TERM=vt100"}) {
		t.Errorf("exec -t sent %+v", got)
	}
	if got := f.ttyLog("p2"); len(got) != 0 {
		t.Errorf("exec -t typed %q", got)
	}
	r = den(t, f, "", "exec", "--tty", "--interactive", "box", "--", "die", "TERM")
	if r.code != 143 || r.stderr != "den: command killed by signal SIGTERM\n" {
		t.Errorf("exec -it of a killed command: %+v", r)
	}
	r = den(t, f, "", "exec", "-it", "box", "--", "echo", "a", "b")
	if r.code != 0 || r.stdout != "started\r\na b\n" {
		t.Errorf("exec -it echo: %+v", r)
	}

	// -d -t starts a terminal process in the background.
	r = den(t, f, "", "exec", "-dt", "box", "--", "sleep")
	if r.code != 0 || r.stdout != "p5\n" {
		t.Errorf("exec -dt: %+v", r)
	}
	if got := f.procReqs[4]; !got.TTY || got.Rows != 24 || got.Cols != 80 {
		t.Errorf("exec -dt sent %+v", got)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "-t", "--json", "box", "--", "cat"}, "--json"},
		{[]string{"exec", "-dit", "box", "--", "cat"}, "drop -i"},
		{[]string{"exec", "-it", "box"}, "needs a command"},
	} {
		if r := den(t, f, "", tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: %+v", tc.args, r)
		}
	}
	r = den(t, f, "", "exec", "-it", "nope", "--", "cat")
	if r.code != 1 || !strings.Contains(r.stderr, `no such sandbox "nope"`) {
		t.Errorf("exec -it on a missing sandbox: %+v", r)
	}
}

func TestExecTTYResizeAndSignals(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})
	var size atomic.Uint32
	size.Store(30<<16 | 100)
	old := termSize
	termSize = func(*cli) (uint16, uint16) { s := size.Load(); return uint16(s >> 16), uint16(s) }
	defer func() { termSize = old }()

	// Typed input as it comes; SIGWINCH becomes a resize.
	pr, pw := io.Pipe()
	stdout, _, code := background(f, pr, "exec", "-it", "box", "--", "cat")
	proc := <-f.attached
	eventually(t, "den to attach", func() bool { return stdout.String() == "started\r\n" })
	if _, err := io.WriteString(pw, "one\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the echo", func() bool { return strings.Contains(stdout.String(), "one\n") })
	size.Store(50<<16 | 132)
	syscall.Kill(os.Getpid(), syscall.SIGWINCH)
	eventually(t, "the resize", func() bool { return strings.Contains(stdout.String(), "[50x132]") })
	io.WriteString(pw, "two\n")
	pw.Close()
	if c := waitCode(t, code); c != 0 {
		t.Errorf("exec -it cat: exit %d", c)
	}
	if got := stdout.String(); got != "started\r\none\n[50x132]two\n" {
		t.Errorf("output %q", got)
	}
	if got := f.ttyLog(proc); !reflect.DeepEqual(got, []string{"bin:one\n", `text:{"resize":{"rows":50,"cols":132}}`, "bin:two\n", "bin:\x04"}) {
		t.Errorf("the terminal got %q", got)
	}
	if got := f.procReqs[0]; got.Rows != 30 || got.Cols != 100 {
		t.Errorf("started at %dx%d, want 30x100", got.Rows, got.Cols)
	}

	// Not in raw mode, Ctrl-C is passed on as SIGINT.
	stdout, stderr, code := background(f, strings.NewReader(""), "exec", "-t", "box", "--", "sleep")
	proc = <-f.attached
	eventually(t, "den to attach", func() bool { return stdout.String() == "started\r\n" })
	syscall.Kill(os.Getpid(), syscall.SIGINT)
	if c := waitCode(t, code); c != 130 || stderr.String() != "den: command killed by signal SIGINT\n" {
		t.Errorf("exec -t after Ctrl-C: exit %d, stderr %q, stdout %q", c, stderr.String(), stdout.String())
	}
	if got := f.ttyLog(proc); !reflect.DeepEqual(got, []string{`text:{"signal":"INT"}`}) {
		t.Errorf("the terminal got %q", got)
	}
}

func TestShell(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})
	t.Setenv("TERM", "")
	r := den(t, f, "exit\n", "shell", "-u", "nobody", "box")
	if r.code != 0 || r.stdout != "started\r\nexit\n" {
		t.Fatalf("shell: %+v", r)
	}
	want := api.ExecRequest{Cmd: loginShell, Env: []string{"TERM=xterm"}, User: "nobody", TTY: true, Rows: 24, Cols: 80}
	if got := f.procReqs[0]; !reflect.DeepEqual(got, want) {
		t.Errorf("shell sent %+v\nwant %+v", got, want)
	}
	if r := den(t, f, "", "shell"); r.code != 2 || !strings.Contains(r.stderr, "shell needs one sandbox ID") {
		t.Errorf("shell without an ID: %+v", r)
	}
	if r := den(t, f, "", "shell", "nope"); r.code != 1 || !strings.Contains(r.stderr, "den ls") {
		t.Errorf("shell of a missing sandbox: %+v", r)
	}
}

func TestSessions(t *testing.T) {
	f := newFakeDaemon(t)
	sb := f.addSandbox(api.CreateRequest{Name: "box"})
	r := den(t, f, "", "exec", "--session", "s1", "box", "--", "cd src && export X=1")
	if r.code != 0 || r.stdout != "s1$ cd src && export X=1\n" {
		t.Fatalf("exec --session: %+v", r)
	}
	want := api.ExecRequest{Shell: "cd src && export X=1", Session: "s1"}
	if got := f.execs[0]; !reflect.DeepEqual(got, want) {
		t.Errorf("exec --session sent %+v, want %+v", got, want)
	}
	// Several arguments are one command, each argument its own (the
	// daemon quotes them); exec flags still apply.
	r = den(t, f, "", "exec", "--session", "s2", "-e", "A=1", "box", "sh", "-c", `echo "a b"`)
	if got := f.execs[1]; r.code != 0 || got.Shell != "" || got.Session != "s2" || !reflect.DeepEqual(got.Cmd, []string{"sh", "-c", `echo "a b"`}) || !reflect.DeepEqual(got.Env, []string{"A=1"}) {
		t.Errorf("exec --session with arguments: %+v, sent %+v", r, got)
	}
	r = den(t, f, "", "exec", "--json", "--session", "s1", "box", "--", "pwd")
	var res api.ExecResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || string(res.Stdout) != "s1$ pwd\n" {
		t.Errorf("exec --json --session: %+v", r)
	}

	r = den(t, f, "", "sessions", "box")
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != 3 ||
		!regexp.MustCompile(`^NAME\s+PID\s+STARTED\s+BUSY$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^s1\s+200\s+5 minutes ago\s+false$`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^s2\s+201\s+5 minutes ago\s+false$`).MatchString(lines[2]) {
		t.Errorf("sessions:\n%+v", r)
	}
	r = den(t, f, "", "sessions", "--json", sb.ID[:8])
	var list []*api.Session
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 2 || list[0].Name != "s1" {
		t.Errorf("sessions --json: %+v", r)
	}
	if r := den(t, f, "", "sessions", "rm", "box", "s1"); r.code != 0 || r.stdout != "s1\n" {
		t.Errorf("sessions rm: %+v", r)
	}
	if !logHas(f, "DELETE /v1/sandboxes/box/sessions/s1", "") {
		t.Errorf("no DELETE of the session in %q", f.log)
	}
	r = den(t, f, "", "sessions", "rm", "box", "s2", "nope")
	if r.code != 1 || r.stdout != "s2\n" || !strings.Contains(r.stderr, `no session "nope"`) || !strings.Contains(r.stderr, "den sessions ID") {
		t.Errorf("sessions rm of a missing one: %+v", r)
	}
	if r := den(t, f, "", "sessions", "--json", "box"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("sessions --json of none: %+v", r)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sessions"}, "sessions needs one sandbox ID"},
		{[]string{"sessions", "rm", "box"}, "sessions rm needs a sandbox ID and a session NAME"},
		{[]string{"exec", "--session", "s", "-d", "box", "--", "ls"}, "--session"},
		{[]string{"exec", "--session", "s", "-i", "box", "--", "ls"}, "--session"},
		{[]string{"exec", "--session", "", "box", "--", "ls"}, "--session"},
	} {
		if r := den(t, f, "", tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: %+v", tc.args, r)
		}
	}
}

func TestServices(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})
	r := den(t, f, "", "exec", "-d", "--restart", "always", "--name", "api", "box", "--", "sleep", "1")
	if r.code != 0 || r.stdout != "p1\n" {
		t.Fatalf("exec -d --restart: %+v", r)
	}
	want := api.ExecRequest{Cmd: []string{"sleep", "1"}, Restart: "always", Name: "api"}
	if got := f.procReqs[0]; !reflect.DeepEqual(got, want) {
		t.Errorf("exec -d --restart sent %+v, want %+v", got, want)
	}
	den(t, f, "", "exec", "-d", "--restart=on-failure", "box", "--", "sleep")
	den(t, f, "", "exec", "-d", "--restart", "no", "--name", "plain", "box", "--", "exit", "0")
	if got := f.procReqs[2]; got.Restart != "" || got.Name != "plain" {
		t.Errorf("--restart no sent %+v", got)
	}

	r = den(t, f, "", "ps", "box")
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	for i, want := range []string{
		`^PROC\s+NAME\s+PID\s+STATE\s+EXIT\s+RESTARTS\s+STARTED\s+ENDED\s+DESCENDANTS\s+COMMAND$`,
		`^p1\s+api\s+101\s+running\s+2 \(always\)\s+2 minutes ago\s+sleep 1$`,
		`^p2\s+102\s+running\s+2 \(on-failure\)\s+2 minutes ago\s+sleep$`,
		`^p3\s+plain\s+103\s+exited\s+0\s+2 minutes ago\s+Less than a second ago\s+exit 0$`,
	} {
		if i >= len(lines) || !regexp.MustCompile(want).MatchString(lines[i]) {
			t.Errorf("ps line %d does not match %s:\n%s", i, want, r.stdout)
		}
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "-d", "--restart", "sometimes", "box", "--", "ls"}, "--restart"},
		{[]string{"exec", "--restart", "always", "box", "--", "ls"}, "add -d"},
		{[]string{"exec", "--name", "x", "box", "--", "ls"}, "add -d"},
	} {
		if r := den(t, f, "", tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: %+v", tc.args, r)
		}
	}
}

func TestStats(t *testing.T) {
	f := newFakeDaemon(t)
	a := f.addSandbox(api.CreateRequest{Name: "alpha", Limits: api.Limits{Memory: 512 << 20, Pids: 100}})
	b := f.addSandbox(api.CreateRequest{Name: "beta"})
	r := den(t, f, "", "stats", "alpha")
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != 2 ||
		!regexp.MustCompile(`^ID\s+CPU\s+MEM / LIMIT\s+PIDS / LIMIT\s+DISK\s+NET RX / TX\s+CPU-S\s+GIB-H\s+ALIVE\s+ACTIVE$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^`+a.ID[:12]+`\s+1\.50s\s+10\.0MiB / 512\.0MiB\s+3 / 100\s+4\.00KiB\s+1000B / 2\.00MiB\s+12\.50\s+0\.1250\s+1h2m5s\s+1m1s$`).MatchString(lines[1]) {
		t.Errorf("stats:\n%s%s", r.stdout, r.stderr)
	}
	// All running sandboxes without an ID; "-" for no limit.
	den(t, f, "", "stop", "alpha")
	r = den(t, f, "", "stats")
	if r.code != 0 || strings.Contains(r.stdout, a.ID[:12]) ||
		!regexp.MustCompile(`(?m)^`+b.ID[:12]+`\s+1\.50s\s+10\.0MiB / -\s+3 / -\s`).MatchString(r.stdout) {
		t.Errorf("stats of all:\n%+v", r)
	}
	r = den(t, f, "", "stats", "--json", "--no-stream", "beta", "alpha")
	var list []*api.Stats
	if r.code != 1 || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list) != 1 || list[0].ID != b.ID || list[0].Usage.CPUSeconds != 12.5 ||
		!strings.Contains(r.stderr, "is stopped") || !strings.Contains(r.stderr, "den start ID") {
		t.Errorf("stats --json with a stopped sandbox: %+v", r)
	}
	if r := den(t, f, "", "stats", "-f", "--no-stream"); r.code != 2 {
		t.Errorf("stats -f --no-stream: %+v", r)
	}

	// -f prints again until Ctrl-C.
	old := statsInterval
	statsInterval = 10 * time.Millisecond
	defer func() { statsInterval = old }()
	stdout, _, code := background(f, nil, "stats", "-f", "--json", "beta")
	eventually(t, "three rounds", func() bool { return strings.Count(stdout.String(), "\n") >= 3 })
	syscall.Kill(os.Getpid(), syscall.SIGINT)
	if c := waitCode(t, code); c != 130 {
		t.Errorf("stats -f: exit %d", c)
	}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var st api.Stats
		if err := json.Unmarshal([]byte(line), &st); err != nil || st.ID != b.ID {
			t.Errorf("stats -f --json line %q: %v", line, err)
		}
	}
	stdout, _, code = background(f, nil, "stats", "-f", "beta")
	eventually(t, "two tables", func() bool { return strings.Count(stdout.String(), "ID ") >= 2 })
	syscall.Kill(os.Getpid(), syscall.SIGINT)
	waitCode(t, code)
	if !strings.Contains(stdout.String(), "\n\nID ") {
		t.Errorf("stats -f tables are not apart:\n%s", stdout.String())
	}
}

func TestIdleTimeout(t *testing.T) {
	f := newFakeDaemon(t)
	if r := den(t, f, "", "create", "--idle-timeout", "30m"); r.code != 0 {
		t.Fatalf("create --idle-timeout: %+v", r)
	}
	if r := den(t, f, "", "run", "--rm", "--idle-timeout", "90", "--", "exit", "0"); r.code != 0 {
		t.Fatalf("run --idle-timeout: %+v", r)
	}
	if f.creates[0].IdleTimeout != api.Duration(30*time.Minute) || f.creates[1].IdleTimeout != api.Duration(90*time.Second) {
		t.Errorf("idle timeouts sent: %+v", f.creates)
	}
	if r := den(t, f, "", "create", "--idle-timeout", "soon"); r.code != 2 || !strings.Contains(r.stderr, "--idle-timeout") {
		t.Errorf("bad --idle-timeout: %+v", r)
	}
}

func TestEventsFollow(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "old"}) // before: not printed
	old := eventsPoll
	eventsPoll = 5 * time.Millisecond
	defer func() { eventsPoll = old }()

	stdout, _, code := background(f, nil, "events", "-f", "--json")
	eventually(t, "the first poll", func() bool { return logHas(f, "GET /v1/events", "since=") })
	time.Sleep(10 * time.Millisecond)
	sb := f.addSandbox(api.CreateRequest{Name: "new"})
	eventually(t, "the first event", func() bool { return strings.Count(stdout.String(), "\n") >= 1 })
	f.mu.Lock()
	f.event(sb.ID, "exec.start")
	f.mu.Unlock()
	eventually(t, "the second event", func() bool { return strings.Count(stdout.String(), "\n") >= 2 })
	time.Sleep(30 * time.Millisecond) // a few more polls: nothing printed twice
	syscall.Kill(os.Getpid(), syscall.SIGINT)
	if c := waitCode(t, code); c != 130 {
		t.Errorf("events -f: exit %d", c)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var types []string
	for _, l := range lines {
		var e api.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		types = append(types, e.Type)
	}
	if !reflect.DeepEqual(types, []string{"sandbox.create", "exec.start"}) {
		t.Errorf("events -f printed %q", lines)
	}
	if !logHas(f, "GET /v1/events", "after=3") {
		t.Errorf("no poll after the last event in %q", f.log)
	}

	// With --since, earlier events first; with --limit, den ends after N.
	stdout, _, code = background(f, nil, "events", "-f", "--since", "1h", "--type", "sandbox.", "-n", "3")
	eventually(t, "two events", func() bool { return strings.Count(stdout.String(), "\n") >= 3 })
	f.addSandbox(api.CreateRequest{Name: "third"})
	if c := waitCode(t, code); c != 0 {
		t.Errorf("events -f -n 3: exit %d", c)
	}
	if !regexp.MustCompile(`^TIME\s+SANDBOX\s+TYPE\s+DATA\n(\S+ \S+\s+[0-9a-f]{12}\s+sandbox\.create\s+\{"x":1\}\n){3}$`).MatchString(stdout.String()) {
		t.Errorf("events -f -n 3:\n%s", stdout.String())
	}
}

func TestNewVerbsHelp(t *testing.T) {
	r := den(t, nil, "", "help")
	for _, v := range []*verb{verbShell, verbSessions, verbStats} {
		if !regexp.MustCompile(`(?m)^  ` + v.name + `\s+` + regexp.QuoteMeta(v.summary) + `$`).MatchString(r.stdout) {
			t.Errorf("den help does not list %s:\n%s", v.name, r.stdout)
		}
	}
	for verb, wants := range map[string][]string{
		"exec":        {"-t, --tty", "-i, --interactive", "--session NAME", "--restart POLICY", "--name NAME", "den exec -it web"},
		"shell":       {"-u, --user USER", "den shell web"},
		"sessions":    {"--json", "den sessions rm web build"},
		"sessions rm": {"den sessions rm web build"},
		"stats":       {"-f, --follow", "--no-stream", "--json", "den stats web"},
		"create":      {"--idle-timeout DURATION"},
		"run":         {"--idle-timeout DURATION", "-t, --tty"},
		"events":      {"-f, --follow", "den events -f"},
	} {
		h := den(t, nil, "", append([]string{"help"}, strings.Fields(verb)...)...)
		for _, w := range wants {
			if !strings.Contains(h.stdout, w) {
				t.Errorf("den help %s lacks %q:\n%s", verb, w, h.stdout)
			}
		}
	}
}
