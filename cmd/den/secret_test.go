package main

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSecretSet(t *testing.T) {
	f := newFakeDaemon(t)
	for _, tc := range []struct {
		stdin, want string
	}{
		{"s3cr3t", "s3cr3t"},
		{"s3cr3t\n", "s3cr3t"},             // echo's newline is dropped
		{"s3cr3t\r\n", "s3cr3t"},           // so is a CRLF
		{"two\nlines\n\n", "two\nlines\n"}, // but only one
		{" spaced ", " spaced "},
	} {
		r := den(t, f, tc.stdin, "secret", "set", "TOKEN")
		if r.code != 0 || r.stdout != "" || r.stderr != "" {
			t.Errorf("secret set with %q: %+v", tc.stdin, r)
		}
		f.mu.Lock()
		got := string(f.secrets["TOKEN"])
		f.mu.Unlock()
		if got != tc.want {
			t.Errorf("secret set with %q stored %q, want %q", tc.stdin, got, tc.want)
		}
	}
	if !logHas(f, "PUT /v1/secrets/TOKEN", "") {
		t.Errorf("no PUT /v1/secrets/TOKEN in %q", f.log)
	}
	// Flags after the name, and the largest value.
	big := strings.Repeat("x", 64<<10)
	if r := den(t, f, big+"\n", "secret", "set", "_Big_2", "--host", f.host); r.code != 0 || len(f.secrets["_Big_2"]) != 64<<10 {
		t.Errorf("secret set of 64 KiB: %+v", r.stderr)
	}

	n := len(f.log)
	for _, tc := range []struct {
		args  []string
		stdin string
		code  int
		want  string
	}{
		{[]string{"secret", "set"}, "x", 2, "one NAME"},
		{[]string{"secret", "set", "TOKEN", "hunter2"}, "x", 2, "never from the command line"},
		{[]string{"secret", "set", "TOKEN=hunter2"}, "x", 2, "never from the command line"},
		{[]string{"secret", "set", "1TOKEN"}, "x", 2, "bad secret name"},
		{[]string{"secret", "set", "my-token"}, "x", 2, "bad secret name"},
		{[]string{"secret", "set", strings.Repeat("A", 129)}, "x", 2, "bad secret name"},
		{[]string{"secret", "set", "--prompt", "TOKEN"}, "x", 2, "--prompt needs a terminal"},
		{[]string{"secret", "set", "--value", "hunter2", "TOKEN"}, "x", 2, "unknown flag --value"},
		{[]string{"secret", "set", "TOKEN"}, "", 1, "empty"},
		{[]string{"secret", "set", "TOKEN"}, "\n", 1, "empty"},
		{[]string{"secret", "set", "TOKEN"}, big + "x", 1, "over 64 KiB"},
	} {
		r := den(t, f, tc.stdin, tc.args...)
		if r.code != tc.code || !strings.HasPrefix(r.stderr, "den: ") || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
		if strings.Contains(r.stderr, "hunter2") {
			t.Errorf("%q: the error quotes the value: %q", tc.args, r.stderr)
		}
	}
	if len(f.log) != n {
		t.Errorf("bad secret set commands sent requests: %q", f.log[n:])
	}
}

func TestSecretLsRm(t *testing.T) {
	f := newFakeDaemon(t)
	r := den(t, f, "", "secret", "ls")
	if r.code != 0 || r.stdout != "NAME\n" {
		t.Errorf("secret ls of none: %+v", r)
	}
	if r := den(t, f, "", "secret", "ls", "--json"); r.code != 0 || r.stdout != "[]\n" {
		t.Errorf("secret ls --json of none: %+v", r)
	}
	for _, name := range []string{"ZED", "A_TOKEN", "b"} {
		den(t, f, "value of "+name, "secret", "set", name)
	}
	r = den(t, f, "", "secret", "ls")
	if r.code != 0 || r.stdout != "NAME\nA_TOKEN\nZED\nb\n" {
		t.Errorf("secret ls: %+v", r)
	}
	if strings.Contains(r.stdout, "value of") {
		t.Errorf("secret ls prints values: %q", r.stdout)
	}
	r = den(t, f, "", "secret", "ls", "--json")
	var names []string
	if err := json.Unmarshal([]byte(r.stdout), &names); err != nil || !reflect.DeepEqual(names, []string{"A_TOKEN", "ZED", "b"}) {
		t.Errorf("secret ls --json: %+v", r)
	}
	if r := den(t, f, "", "secret", "ls", "x"); r.code != 2 || !strings.Contains(r.stderr, "no arguments") {
		t.Errorf("secret ls x: %+v", r)
	}

	r = den(t, f, "", "secret", "rm", "ZED", "b")
	if r.code != 0 || r.stdout != "ZED\nb\n" || r.stderr != "" {
		t.Errorf("secret rm: %+v", r)
	}
	if !logHas(f, "DELETE /v1/secrets/ZED", "") || !logHas(f, "DELETE /v1/secrets/b", "") {
		t.Errorf("no DELETEs in %q", f.log)
	}
	// A missing one is reported; the others are still removed.
	r = den(t, f, "", "secret", "rm", "NOPE", "A_TOKEN")
	if r.code != 1 || r.stdout != "A_TOKEN\n" || !strings.Contains(r.stderr, `no secret "NOPE"`) || !strings.Contains(r.stderr, "den secret ls") {
		t.Errorf("secret rm of a missing secret: %+v", r)
	}
	if len(f.secrets) != 0 {
		t.Errorf("secrets left: %v", f.secrets)
	}
	for _, args := range [][]string{{"secret", "rm"}, {"secret", "rm", "OK", "bad-name"}} {
		n := len(f.log)
		if r := den(t, f, "", args...); r.code != 2 || len(f.log) != n {
			t.Errorf("%q: %+v", args, r)
		}
	}
}

func TestSecretHelp(t *testing.T) {
	r := den(t, nil, "", "help")
	if !regexp.MustCompile(`(?m)^  secret\s+` + regexp.QuoteMeta(verbSecret.summary) + `$`).MatchString(r.stdout) {
		t.Errorf("den help does not list secret:\n%s", r.stdout)
	}
	r = den(t, nil, "", "secret")
	for _, sub := range []string{"set", "ls", "rm"} {
		if r.code != 0 || !regexp.MustCompile(`(?m)^  `+sub+`\s`).MatchString(r.stdout) {
			t.Errorf("den secret does not list %s:\n%s", sub, r.stdout)
		}
	}
	for verb, wants := range map[string][]string{
		"secret set": {"--prompt", "standard input", "never from the command line", "den secret set TOKEN < token.txt", "--secret-header"},
		"secret ls":  {"--json", "den secret ls"},
		"secret rm":  {"den secret rm TOKEN"},
	} {
		h := den(t, nil, "", append([]string{"help"}, strings.Fields(verb)...)...)
		for _, w := range wants {
			if !strings.Contains(h.stdout, w) {
				t.Errorf("den help %s lacks %q:\n%s", verb, w, h.stdout)
			}
		}
	}
}

// openPtyPair opens a pseudo-terminal: the controlling side and the
// terminal (openPty gives the terminal alone).
func openPtyPair(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	t.Cleanup(func() { ptm.Close() })
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	if err == nil {
		err = unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0)
	}
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	pts, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	t.Cleanup(func() { pts.Close() })
	return ptm, pts
}

func TestSecretSetTerminal(t *testing.T) {
	f := newFakeDaemon(t)
	ptm, pts := openPtyPair(t)

	// A terminal on stdin is refused: the value would be echoed, and a
	// pasted value would end up on the screen.
	var out, errb syncBuffer
	code := run([]string{"--host", f.host, "secret", "set", "TOKEN"}, pts, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "--prompt") {
		t.Errorf("secret set on a terminal: exit %d, stderr %q", code, errb.String())
	}

	// The terminal echoes what is typed (so that seeing no echo below
	// means something).
	echoed := func() string {
		fds := []unix.PollFd{{Fd: int32(ptm.Fd()), Events: unix.POLLIN}}
		if n, _ := unix.Poll(fds, 100); n <= 0 {
			return ""
		}
		b := make([]byte, 1024)
		nr, _ := ptm.Read(b)
		return string(b[:nr])
	}
	ptm.Write([]byte("probe\n"))
	line := make([]byte, 64)
	if nr, _ := pts.Read(line); string(line[:nr]) != "probe\n" {
		t.Fatalf("the terminal read %q", line[:nr])
	}
	if e := echoed(); !strings.Contains(e, "probe") {
		t.Fatalf("the terminal does not echo: %q", e)
	}

	// --prompt reads a line without echo.
	done := make(chan int, 1)
	var errb2 syncBuffer
	go func() {
		done <- run([]string{"--host", f.host, "secret", "set", "--prompt", "TOKEN"}, pts, &out, &errb2)
	}()
	eventually(t, "the prompt", func() bool { return strings.Contains(errb2.String(), "Value of secret TOKEN: ") })
	eventually(t, "echo off", func() bool {
		tio, err := unix.IoctlGetTermios(int(pts.Fd()), unix.TCGETS)
		return err == nil && tio.Lflag&unix.ECHO == 0
	})
	if _, err := ptm.Write([]byte("hunter2\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-done:
		if c != 0 {
			t.Fatalf("secret set --prompt: exit %d, stderr %q", c, errb2.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("secret set --prompt does not end")
	}
	f.mu.Lock()
	got := string(f.secrets["TOKEN"])
	f.mu.Unlock()
	if got != "hunter2" {
		t.Errorf("secret set --prompt stored %q", got)
	}
	// Nothing was echoed on the terminal.
	if tio, err := unix.IoctlGetTermios(int(pts.Fd()), unix.TCGETS); err != nil || tio.Lflag&unix.ECHO == 0 {
		t.Errorf("echo is still off after secret set --prompt (%v)", err)
	}
	if e := echoed(); strings.Contains(e, "hunter2") {
		t.Errorf("the terminal echoed the value: %q", e)
	}
}
