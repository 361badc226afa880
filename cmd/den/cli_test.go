package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"golang.org/x/sys/unix"
)

type result struct {
	stdout, stderr string
	code           int
}

// den runs the CLI in-process against the fake daemon.
func den(t *testing.T, f *fakeDaemon, stdin string, args ...string) result {
	t.Helper()
	if f != nil {
		args = append([]string{"--host", f.host}, args...)
	}
	var out, errb bytes.Buffer
	code := run(args, strings.NewReader(stdin), &out, &errb)
	return result{out.String(), errb.String(), code}
}

func TestRunRmExitCode(t *testing.T) {
	f := newFakeDaemon(t)
	r := den(t, f, "", "run", "--rm", "--", "exit", "3")
	if r.code != 3 {
		t.Fatalf("den run --rm -- exit 3: exit %d, stderr %q", r.code, r.stderr)
	}
	if n := f.count(); n != 0 {
		t.Errorf("%d sandboxes left after run --rm", n)
	}
	if !logHas(f, "DELETE /v1/sandboxes/", "force=true") {
		t.Errorf("no forced DELETE in %q", f.log)
	}

	r = den(t, f, "", "run", "--rm", "echo", "hello", "world")
	if r.code != 0 || r.stdout != "hello world\n" {
		t.Errorf("run echo: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = den(t, f, "", "run", "--rm", "--", "err", "oops")
	if r.code != 0 || r.stdout != "" || r.stderr != "oops\n" {
		t.Errorf("run err: %d %q %q", r.code, r.stdout, r.stderr)
	}
	// Even when the command cannot start, the sandbox is removed.
	r = den(t, f, "", "run", "--rm", "--", "nosuch")
	if r.code != 127 || !strings.Contains(r.stderr, "executable file not found") {
		t.Errorf("run nosuch: %d %q", r.code, r.stderr)
	}
	if n := f.count(); n != 0 {
		t.Errorf("%d sandboxes left after failed runs with --rm", n)
	}

	// Without --rm the sandbox stays.
	if r := den(t, f, "", "run", "--", "exit", "0"); r.code != 0 || f.count() != 1 {
		t.Errorf("run without --rm: %d, %d sandboxes", r.code, f.count())
	}
}

func logHas(f *fakeDaemon, prefix, contains string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.log {
		if strings.HasPrefix(l, prefix) && strings.Contains(l, contains) {
			return true
		}
	}
	return false
}

func TestRunEndings(t *testing.T) {
	f := newFakeDaemon(t)
	for _, tc := range []struct {
		cmd    []string
		code   int
		stderr string
	}{
		{[]string{"die", "SIGKILL"}, 137, "den: command killed by signal SIGKILL\n"},
		{[]string{"die", "TERM"}, 143, "den: command killed by signal SIGTERM\n"},
		{[]string{"die", "2"}, 130, "den: command killed by signal SIGINT\n"},
		{[]string{"timeout"}, 124, "den: command timed out after 5s\n"},
		{[]string{"oom"}, 137, "den: command killed: out of memory (see --memory)\n"},
		{[]string{"exit", "0"}, 0, ""},
	} {
		args := append([]string{"run", "--rm", "--timeout", "5s", "--"}, tc.cmd...)
		r := den(t, f, "", args...)
		if r.code != tc.code || r.stderr != tc.stderr {
			t.Errorf("%v: exit %d stderr %q, want %d %q", tc.cmd, r.code, r.stderr, tc.code, tc.stderr)
		}
	}
}

func TestRunFlags(t *testing.T) {
	f := newFakeDaemon(t)
	t.Setenv("DEN_TEST_PASS", "passed")
	r := den(t, f, "", "run", "--rm", "-e", "A=1", "-e", "DEN_TEST_PASS", "-e", "DEN_TEST_UNSET_VAR", "-w", "/tmp", "-u", "nobody",
		"--image", "alpine:3.20", "--cpus", "1.5", "--memory", "512m", "--pids", "10", "--timeout", "30s",
		"--ttl", "1h", "--label", "a=b", "-l", "c=d", "--name", "n1", "--", "pwd")
	if r.code != 0 || r.stdout != "/tmp\n" {
		t.Fatalf("run: %+v", r)
	}
	want := api.CreateRequest{Name: "n1", Image: "alpine:3.20", Labels: map[string]string{"a": "b", "c": "d"},
		Env: []string{"A=1", "DEN_TEST_PASS=passed"}, Workdir: "/tmp", User: "nobody",
		Limits: api.Limits{CPUs: 1.5, Memory: 512 << 20, Pids: 10}, TTL: api.Duration(time.Hour)}
	if len(f.creates) != 1 || !reflect.DeepEqual(f.creates[0], want) {
		t.Errorf("create request %+v\nwant %+v", f.creates, want)
	}
	wantExec := api.ExecRequest{Cmd: []string{"pwd"}, Env: want.Env, Workdir: "/tmp", User: "nobody", Timeout: api.Duration(30 * time.Second)}
	if len(f.execs) != 1 || !reflect.DeepEqual(f.execs[0], wantExec) {
		t.Errorf("exec request %+v\nwant %+v", f.execs, wantExec)
	}

	// A single argument with spaces stays one argv entry.
	r = den(t, f, "", "run", "--rm", "--", "echo hi there")
	if got := f.execs[len(f.execs)-1].Cmd; !reflect.DeepEqual(got, []string{"echo hi there"}) {
		t.Errorf("cmd %q", got)
	}
	// Flags after the command belong to the command.
	den(t, f, "", "run", "--rm", "echo", "--rm", "-x")
	if got := f.execs[len(f.execs)-1].Cmd; !reflect.DeepEqual(got, []string{"echo", "--rm", "-x"}) {
		t.Errorf("cmd %q", got)
	}
}

func TestRunStdinAndNoCommand(t *testing.T) {
	f := newFakeDaemon(t)
	r := den(t, f, "line 1\nline 2\n", "run", "--rm", "-i", "--", "cat")
	if r.code != 0 || r.stdout != "line 1\nline 2\n" {
		t.Errorf("run -i cat: %+v", r)
	}
	// Without -i, stdin is not sent.
	r = den(t, f, "ignored", "run", "--rm", "--", "cat")
	if r.stdout != "" {
		t.Errorf("run cat without -i printed %q", r.stdout)
	}

	// No command: print the id, like create.
	r = den(t, f, "", "run", "--name", "idle")
	if r.code != 0 || !regexp.MustCompile(`^[0-9a-f]{64}\n$`).MatchString(r.stdout) {
		t.Errorf("run without a command: %+v", r)
	}
	r = den(t, f, "", "run", "--rm")
	if r.code != 2 || !strings.Contains(r.stderr, "--rm needs a command") {
		t.Errorf("run --rm without a command: %+v", r)
	}
	// --json with a command prints the captured result.
	r = den(t, f, "", "run", "--rm", "--json", "--", "echo", "x")
	var res api.ExecResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || string(res.Stdout) != "x\n" || r.code != 0 {
		t.Errorf("run --json: %+v (%v)", r, err)
	}
}

func TestCreateExec(t *testing.T) {
	f := newFakeDaemon(t)
	r := den(t, f, "", "create", "--name", "box", "--label", "k=v")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || len(id) != 64 {
		t.Fatalf("create: %+v", r)
	}
	r = den(t, f, "", "create", "--json", "--name", "box2")
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil || sb.Name != "box2" || sb.State != api.StateRunning {
		t.Errorf("create --json: %+v (%v)", r, err)
	}

	if r := den(t, f, "", "exec", "box", "--", "exit", "5"); r.code != 5 {
		t.Errorf("exec exit 5: %+v", r)
	}
	if r := den(t, f, "", "exec", id[:6], "echo", "-n", "x"); r.code != 0 || r.stdout != "-n x\n" {
		t.Errorf("exec without --: %+v", r)
	}
	// Flags after the ID, before --.
	r = den(t, f, "", "exec", "box", "-e", "X=1", "-w", "/work", "--", "env")
	if r.code != 0 || r.stdout != "X=1\n" {
		t.Errorf("exec -e: %+v", r)
	}
	if got := f.execs[len(f.execs)-1]; got.Workdir != "/work" || !reflect.DeepEqual(got.Cmd, []string{"env"}) {
		t.Errorf("exec request %+v", got)
	}
	r = den(t, f, "abc", "exec", "-i", "box", "cat")
	if r.stdout != "abc" {
		t.Errorf("exec -i: %+v", r)
	}
	// More stdin than an exec request carries is streamed to a background
	// process, whose output is followed.
	big := strings.Repeat("0123456789abcdef", api.MaxExecStdin/16+4096)
	nprocs := len(f.procReqs)
	r = den(t, f, big, "exec", "-i", "box", "cat")
	if r.code != 0 || r.stdout != big {
		t.Errorf("exec -i with %d bytes: code %d, %d bytes out, stderr %q", len(big), r.code, len(r.stdout), r.stderr)
	}
	if len(f.procReqs) != nprocs+1 || f.procReqs[nprocs].Stdin != nil || f.execs[len(f.execs)-1].Stdin != nil && len(f.execs[len(f.execs)-1].Stdin) > api.MaxExecStdin {
		t.Errorf("exec -i with %d bytes did not go through a background process", len(big))
	}
	r = den(t, f, "", "exec", "--json", "box", "--", "err", "e")
	var res api.ExecResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || string(res.Stderr) != "e\n" {
		t.Errorf("exec --json: %+v", r)
	}

	if r := den(t, f, "", "exec", "box"); r.code != 2 || !strings.Contains(r.stderr, "needs a command") {
		t.Errorf("exec without a command: %+v", r)
	}
	r = den(t, f, "", "exec", "nope", "--", "echo")
	if r.code != 1 || !strings.Contains(r.stderr, `den: no such sandbox "nope"`) || !strings.Contains(r.stderr, "hint: run `den ls` to see sandboxes") {
		t.Errorf("exec on a missing sandbox: %+v", r)
	}
}

func TestLs(t *testing.T) {
	f := newFakeDaemon(t)
	a := f.addSandbox(api.CreateRequest{Name: "alpha", Image: "alpine:3.20", Labels: map[string]string{"team": "x", "b": "2"}})
	b := f.addSandbox(api.CreateRequest{Name: "beta", Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"example.com"}}})

	r := den(t, f, "", "ls")
	if r.code != 0 {
		t.Fatalf("ls: %+v", r)
	}
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("ls printed %d lines:\n%s", len(lines), r.stdout)
	}
	if !regexp.MustCompile(`^ID\s+NAME\s+IMAGE\s+STATE\s+NET\s+CREATED\s+LABELS$`).MatchString(lines[0]) {
		t.Errorf("header %q", lines[0])
	}
	all := strings.Join(lines[1:], "\n")
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^` + a.ID[:12] + `\s+alpha\s+alpine:3\.20\s+running\s+none\s+3 minutes ago\s+b=2,team=x$`),
		regexp.MustCompile(`(?m)^` + b.ID[:12] + `\s+beta\s+host\s+running\s+allow\s+3 minutes ago\s*$`),
	} {
		if !want.MatchString(all) {
			t.Errorf("ls table does not match %s:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, a.ID[:13]) {
		t.Error("ls shows more than 12 characters of an id")
	}

	r = den(t, f, "", "ls", "--json")
	var list []*api.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 2 {
		t.Fatalf("ls --json: %v\n%s", err, r.stdout)
	}

	r = den(t, f, "", "ls", "-q", "--label", "team=x")
	if r.stdout != a.ID+"\n" {
		t.Errorf("ls -q --label: %q", r.stdout)
	}
	if q := f.lastQuery["GET /v1/sandboxes"]; q != "label=team%3Dx" {
		t.Errorf("label filter sent as %q", q)
	}
	// Flags after positional-free verbs work in any order; --host after the verb too.
	r = den(t, nil, "", "ls", "--json", "--host", f.host, "--label", "team=nobody")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("empty ls --json: %+v", r)
	}
}

func TestInspectStopStartRm(t *testing.T) {
	f := newFakeDaemon(t)
	a := f.addSandbox(api.CreateRequest{Name: "alpha"})
	f.addSandbox(api.CreateRequest{Name: "beta"})

	r := den(t, f, "", "inspect", "alpha")
	var list []*api.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 || list[0].ID != a.ID {
		t.Errorf("inspect: %+v", r)
	}
	if !strings.Contains(r.stdout, "\n  {") {
		t.Errorf("inspect output is not indented:\n%s", r.stdout)
	}
	r = den(t, f, "", "inspect", "alpha", "missing")
	if r.code != 1 || !strings.Contains(r.stderr, "missing") || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list) != 1 {
		t.Errorf("inspect with a missing one: %+v", r)
	}

	if r := den(t, f, "", "rm", "alpha"); r.code != 1 || !strings.Contains(r.stderr, "den rm -f") {
		t.Errorf("rm of a running sandbox: %+v", r)
	}
	if r := den(t, f, "", "stop", "alpha", "beta"); r.code != 0 || r.stdout != "alpha\nbeta\n" {
		t.Errorf("stop: %+v", r)
	}
	if r := den(t, f, "", "start", "beta"); r.code != 0 || r.stdout != "beta\n" {
		t.Errorf("start: %+v", r)
	}
	if r := den(t, f, "", "rm", "alpha"); r.code != 0 || r.stdout != "alpha\n" {
		t.Errorf("rm of a stopped sandbox: %+v", r)
	}
	if r := den(t, f, "", "rm", "beta", "-f"); r.code != 0 || r.stdout != "beta\n" || f.count() != 0 {
		t.Errorf("rm -f after the id: %+v", r)
	}
	if r := den(t, f, "", "rm"); r.code != 2 {
		t.Errorf("rm without ids: %+v", r)
	}
}

// mkTree makes a local tree with a subdirectory, modes and a symlink.
func mkTree(t *testing.T, dir string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Join(dir, "sub", "deep"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "a.txt"), []byte("alpha"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "sub", "deep", "b.txt"), []byte("beta"), 0o600))
	must(t, os.Symlink("a.txt", filepath.Join(dir, "link")))
	must(t, os.Symlink("/etc/passwd", filepath.Join(dir, "abs")))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// checkTree verifies a copy of mkTree's tree.
func checkTree(t *testing.T, dir string) {
	t.Helper()
	for name, want := range map[string]string{"a.txt": "alpha", "run.sh": "#!/bin/sh\n", "sub/deep/b.txt": "beta"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(b) != want {
			t.Errorf("%s: %q %v", name, b, err)
		}
	}
	for name, want := range map[string]fs.FileMode{"run.sh": 0o755, "a.txt": 0o644, "sub/deep/b.txt": 0o600} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v), want %v", name, fi.Mode(), err, want)
		}
	}
	for name, want := range map[string]string{"link": "a.txt", "abs": "/etc/passwd"} {
		if target, err := os.Readlink(filepath.Join(dir, name)); err != nil || target != want {
			t.Errorf("%s: symlink to %q (%v), want %q", name, target, err, want)
		}
	}
}

func TestCpBothWays(t *testing.T) {
	f := newFakeDaemon(t)
	sb := f.addSandbox(api.CreateRequest{Name: "box"})
	s := f.sandboxes[sb.ID]
	local := t.TempDir()
	src := filepath.Join(local, "src")
	mkTree(t, src)

	// Into an existing directory: /work/src.
	if r := den(t, f, "", "cp", src, "box:/work"); r.code != 0 {
		t.Fatalf("cp in: %+v", r)
	}
	checkTree(t, filepath.Join(s.root, "work", "src"))
	names := f.uploads[len(f.uploads)-1]
	if names[0] != "src/" {
		t.Errorf("first entry %q, want src/", names[0])
	}
	// Owners default to root.
	// To a missing path: it becomes the copy.
	if r := den(t, f, "", "cp", src, "box:/work/renamed"); r.code != 0 {
		t.Fatalf("cp in to a new name: %+v", r)
	}
	checkTree(t, filepath.Join(s.root, "work", "renamed"))
	// A directory's contents with /.
	if r := den(t, f, "", "cp", src+"/.", "box:/flat"); r.code != 0 {
		t.Fatalf("cp in contents: %+v", r)
	}
	checkTree(t, filepath.Join(s.root, "flat"))
	// A single file onto an existing file, and into a directory.
	must(t, os.WriteFile(filepath.Join(s.root, "work", "old.txt"), []byte("old"), 0o644))
	if r := den(t, f, "", "cp", filepath.Join(src, "a.txt"), "box:/work/old.txt"); r.code != 0 {
		t.Fatalf("cp file onto file: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(s.root, "work", "old.txt")); string(b) != "alpha" {
		t.Errorf("overwritten file holds %q", b)
	}
	if r := den(t, f, "", "cp", src, "box:/work/old.txt"); r.code != 1 || !strings.Contains(r.stderr, "onto the file") {
		t.Errorf("cp dir onto file: %+v", r)
	}

	// Out to an existing directory: out/src.
	out := t.TempDir()
	if r := den(t, f, "", "cp", "box:/work/src", out); r.code != 0 {
		t.Fatalf("cp out: %+v", r)
	}
	checkTree(t, filepath.Join(out, "src"))
	// Out to a new name.
	if r := den(t, f, "", "cp", "box:/work/src", filepath.Join(out, "copy")); r.code != 0 {
		t.Fatalf("cp out to a new name: %+v", r)
	}
	checkTree(t, filepath.Join(out, "copy"))
	// Contents into an existing directory.
	flat := t.TempDir()
	if r := den(t, f, "", "cp", "box:/work/src/.", flat); r.code != 0 {
		t.Fatalf("cp out contents: %+v", r)
	}
	checkTree(t, flat)
	// One file, to a new name and onto an existing file.
	if r := den(t, f, "", "cp", "box:/work/src/a.txt", filepath.Join(out, "one.txt")); r.code != 0 {
		t.Fatalf("cp out file: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "one.txt")); string(b) != "alpha" {
		t.Errorf("one.txt holds %q", b)
	}
	if r := den(t, f, "", "cp", "box:/work/src/run.sh", filepath.Join(out, "one.txt")); r.code != 0 {
		t.Fatalf("cp out file onto file: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "one.txt")); string(b) != "#!/bin/sh\n" {
		t.Errorf("one.txt holds %q", b)
	}

	// - is a tar stream on stdout and stdin.
	r := den(t, f, "", "cp", "box:/work/src", "-")
	if r.code != 0 {
		t.Fatalf("cp to -: %+v", r)
	}
	var entries []string
	tr := tar.NewReader(strings.NewReader(r.stdout))
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		entries = append(entries, hdr.Name)
	}
	if len(entries) != 8 || entries[0] != "src/" {
		t.Errorf("tar on stdout has %q", entries)
	}
	if r := den(t, f, r.stdout, "cp", "-", "box:/fromstdin"); r.code != 0 {
		t.Fatalf("cp from -: %+v", r)
	}
	checkTree(t, filepath.Join(s.root, "fromstdin", "src"))

	// Usage errors.
	if r := den(t, f, "", "cp", "a", "b"); r.code != 2 {
		t.Errorf("cp between two local paths: %+v", r)
	}
	if r := den(t, f, "", "cp", "box:/a"); r.code != 2 {
		t.Errorf("cp with one argument: %+v", r)
	}
	if r := den(t, f, "", "cp", "box:/nonexistent", out); r.code != 1 || !strings.Contains(r.stderr, "no such file") {
		t.Errorf("cp of a missing file: %+v", r)
	}
}

// evilTar builds a tar stream from headers (and their bodies).
func evilTar(t *testing.T, hdrs ...*tar.Header) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		body := h.Linkname
		if h.Typeflag == tar.TypeReg {
			body = "pwned"
			h.Size = int64(len(body))
			h.Linkname = ""
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		must(t, tw.WriteHeader(h))
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(body))
		}
	}
	must(t, tw.Close())
	return b.Bytes()
}

func TestCpRefusesUnsafeArchives(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})
	outside := t.TempDir()
	for name, archive := range map[string][]byte{
		"dotdot": evilTar(t,
			&tar.Header{Name: "x/", Typeflag: tar.TypeDir, Mode: 0o755},
			&tar.Header{Name: "x/../../escape", Typeflag: tar.TypeReg}),
		"absolute": evilTar(t,
			&tar.Header{Name: "x/", Typeflag: tar.TypeDir, Mode: 0o755},
			&tar.Header{Name: "/" + filepath.Join(outside, "escape")[1:], Typeflag: tar.TypeReg}),
		"through symlink": evilTar(t,
			&tar.Header{Name: "x/", Typeflag: tar.TypeDir, Mode: 0o755},
			&tar.Header{Name: "x/link", Typeflag: tar.TypeSymlink, Linkname: outside},
			&tar.Header{Name: "x/link/escape", Typeflag: tar.TypeReg}),
		"through relative symlink": evilTar(t,
			&tar.Header{Name: "x/", Typeflag: tar.TypeDir, Mode: 0o755},
			&tar.Header{Name: "x/up", Typeflag: tar.TypeSymlink, Linkname: "../.."},
			&tar.Header{Name: "x/up/escape", Typeflag: tar.TypeReg}),
		"hard link out": evilTar(t,
			&tar.Header{Name: "x/", Typeflag: tar.TypeDir, Mode: 0o755},
			&tar.Header{Name: "x/h", Typeflag: tar.TypeLink, Linkname: strings.TrimPrefix(filepath.Join(outside, "escape"), "/")}),
		"other root": evilTar(t,
			&tar.Header{Name: "x/", Typeflag: tar.TypeDir, Mode: 0o755},
			&tar.Header{Name: "y/escape", Typeflag: tar.TypeReg}),
	} {
		t.Run(name, func(t *testing.T) {
			f.mu.Lock()
			f.archive = archive
			f.mu.Unlock()
			dest := filepath.Join(t.TempDir(), "d")
			must(t, os.Mkdir(dest, 0o755))
			r := den(t, f, "", "cp", "box:/x", dest)
			if r.code != 1 || !strings.HasPrefix(r.stderr, "den: refusing") {
				t.Errorf("unsafe archive accepted: %+v", r)
			}
			if _, err := os.Lstat(filepath.Join(outside, "escape")); err == nil {
				t.Fatal("a file was written outside the destination")
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(dest), "escape")); err == nil {
				t.Fatal("a file was written outside the destination")
			}
		})
	}

	// An existing local symlink at a file's place is replaced, not written
	// through.
	f.mu.Lock()
	f.archive = evilTar(t, &tar.Header{Name: "x", Typeflag: tar.TypeReg})
	f.mu.Unlock()
	dest := t.TempDir()
	victim := filepath.Join(outside, "victim")
	must(t, os.WriteFile(victim, []byte("safe"), 0o644))
	must(t, os.Symlink(victim, filepath.Join(dest, "x")))
	if r := den(t, f, "", "cp", "box:/x", dest); r.code != 0 {
		t.Fatalf("cp over a symlink: %+v", r)
	}
	if b, _ := os.ReadFile(victim); string(b) != "safe" {
		t.Errorf("wrote through a symlink: victim holds %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "x")); string(b) != "pwned" {
		t.Errorf("x holds %q", b)
	}
}

// TestCpOutDropsPrivileges: what a sandbox sends never becomes a
// privileged file here: setuid and setgid bits are dropped, the copies
// belong to the caller, file capabilities (an xattr) and device nodes do
// not come out; -a keeps the sandbox's owners and the bits, never
// capabilities or devices.
func TestCpOutDropsPrivileges(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})
	cap := "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00" // cap_net_raw+ep
	f.archive = evilTar(t,
		&tar.Header{Name: "x/", Typeflag: tar.TypeDir, Mode: 0o2775, Uid: 1234, Gid: 1235},
		&tar.Header{Name: "x/suid", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 0, Gid: 0},
		&tar.Header{Name: "x/sgid", Typeflag: tar.TypeReg, Mode: 0o2755, Uid: 1234, Gid: 1235},
		&tar.Header{Name: "x/cap", Typeflag: tar.TypeReg, Mode: 0o755, PAXRecords: map[string]string{"SCHILY.xattr.security.capability": cap}},
		&tar.Header{Name: "x/hard", Typeflag: tar.TypeLink, Linkname: "x/suid"},
		&tar.Header{Name: "x/mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o666})
	check := func(t *testing.T, dest string, archive bool) {
		t.Helper()
		want := map[string]os.FileMode{"x": 0o775 | fs.ModeDir, "x/suid": 0o755, "x/sgid": 0o755, "x/cap": 0o755, "x/hard": 0o755}
		owner := map[string][2]int{}
		for n := range want {
			owner[n] = [2]int{os.Getuid(), os.Getgid()}
		}
		if archive {
			want["x"] |= fs.ModeSetgid
			want["x/suid"] |= fs.ModeSetuid
			want["x/hard"] |= fs.ModeSetuid
			want["x/sgid"] |= fs.ModeSetgid
			owner["x"], owner["x/sgid"] = [2]int{1234, 1235}, [2]int{1234, 1235}
			owner["x/suid"], owner["x/hard"], owner["x/cap"] = [2]int{0, 0}, [2]int{0, 0}, [2]int{0, 0}
		}
		for n, m := range want {
			fi, err := os.Lstat(filepath.Join(dest, n))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode() != m {
				t.Errorf("%s: mode %v, want %v", n, fi.Mode(), m)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if o := [2]int{int(st.Uid), int(st.Gid)}; o != owner[n] {
				t.Errorf("%s: owner %v, want %v", n, o, owner[n])
			}
		}
		if n, err := unix.Lgetxattr(filepath.Join(dest, "x/cap"), "security.capability", make([]byte, 64)); err != unix.ENODATA {
			t.Errorf("x/cap: security.capability: %d bytes, %v; want none", n, err)
		}
		if _, err := os.Lstat(filepath.Join(dest, "x/mem")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("x/mem: %v, want no device node", err)
		}
	}
	dest := t.TempDir()
	if r := den(t, f, "", "cp", "box:/x", dest); r.code != 0 || !strings.Contains(r.stderr, "skipping") {
		t.Fatalf("cp: %+v", r)
	}
	check(t, dest, false)
	if os.Geteuid() != 0 {
		t.Skip("-a sets other owners: needs root")
	}
	dest = t.TempDir()
	if r := den(t, f, "", "cp", "-a", "box:/x", dest); r.code != 0 {
		t.Fatalf("cp -a: %+v", r)
	}
	check(t, dest, true)
}

func TestFlagErrors(t *testing.T) {
	f := newFakeDaemon(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--memory", "12q", "--", "echo"}, "--memory"},
		{[]string{"run", "--timeout", "soon", "--", "echo"}, "--timeout"},
		{[]string{"run", "--ttl=-1h", "--", "echo"}, "--ttl"},
		{[]string{"create", "--cpus", "lots"}, "--cpus"},
		{[]string{"create", "--pids", "-3"}, "--pids"},
		{[]string{"create", "-m", "1x"}, "-m"},
		{[]string{"create", "--label", "=v"}, "--label"},
		{[]string{"exec", "--timeout", "x", "box", "--", "ls"}, "--timeout"},
		{[]string{"ls", "--bogus"}, "--bogus"},
		{[]string{"run", "--memory"}, "--memory"},
		{[]string{"events", "--since", "yesterday-ish"}, "--since"},
		{[]string{"nosuchverb"}, "nosuchverb"},
	} {
		r := den(t, f, "", tc.args...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "den: ") || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 naming %s", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if len(f.creates) != 0 {
		t.Errorf("a bad command line created sandboxes: %+v", f.creates)
	}
}

func TestHelp(t *testing.T) {
	for _, v := range verbs {
		if v.external {
			continue
		}
		args := append(strings.Fields(v.name), "-h")
		r := den(t, nil, "", args...)
		if r.code != 0 {
			t.Errorf("den %s -h: exit %d %q", v.name, r.code, r.stderr)
		}
		if !strings.Contains(r.stdout, "den "+v.name) || !strings.Contains(r.stdout, "Example") {
			t.Errorf("den %s -h does not mention the verb and an Example:\n%s", v.name, r.stdout)
		}
		if !v.group && !strings.Contains(r.stdout, "--host") {
			t.Errorf("den %s -h does not list --host", v.name)
		}
		if !strings.Contains(r.stdout, v.summary) {
			t.Errorf("den %s -h lacks the summary", v.name)
		}
		r2 := den(t, nil, "", append([]string{"help"}, strings.Fields(v.name)...)...)
		if r2.code != 0 || r2.stdout != r.stdout {
			t.Errorf("den help %s differs from den %s -h", v.name, v.name)
		}
	}
	for _, args := range [][]string{nil, {"help"}, {"--help"}} {
		r := den(t, nil, "", args...)
		if r.code != 0 {
			t.Errorf("den %q: exit %d", args, r.code)
		}
		for _, v := range verbs {
			if !strings.Contains(v.name, " ") && !strings.Contains(r.stdout, "  "+v.name+" ") {
				t.Errorf("den %q does not list %s", args, v.name)
			}
		}
	}
}

func TestImages(t *testing.T) {
	f := newFakeDaemon(t)
	file := filepath.Join(t.TempDir(), "img.tar")
	must(t, os.WriteFile(file, []byte("OCI archive bytes"), 0o644))
	r := den(t, f, "", "image", "import", "--name", "alpine:3.20", file)
	if r.code != 0 || r.stdout != "alpine:3.20\n" {
		t.Fatalf("import: %+v", r)
	}
	if !strings.Contains(r.stderr, "import: layer sha256:aaaa: 17B / 17B (100%)") || !strings.Contains(r.stderr, "import: config") {
		t.Errorf("import progress on a non-terminal:\n%s", r.stderr)
	}
	if r := den(t, f, "OCI from stdin", "image", "import", "-q", "-"); r.code != 0 || r.stdout != "imported:latest\n" || r.stderr != "" {
		t.Errorf("import -: %+v", r)
	}
	if r := den(t, f, "junk", "image", "import", "-"); r.code != 1 || !strings.Contains(r.stderr, "not an OCI archive") {
		t.Errorf("import junk: %+v", r)
	}

	r = den(t, f, "", "image", "ls")
	if !regexp.MustCompile(`(?m)^NAME\s+ID\s+SIZE\s+CREATED\n` + `alpine:3\.20\s+0123456789ab\s+17\.0MiB\s+2 hours ago\n`).MatchString(r.stdout) {
		t.Errorf("image ls:\n%s", r.stdout)
	}
	r = den(t, f, "", "image", "ls", "--json")
	var imgs []*api.Image
	if err := json.Unmarshal([]byte(r.stdout), &imgs); err != nil || len(imgs) != 2 {
		t.Errorf("image ls --json: %+v", r)
	}
	r = den(t, f, "", "image", "inspect", "alpine:3.20")
	if err := json.Unmarshal([]byte(r.stdout), &imgs); err != nil || len(imgs) != 1 || imgs[0].Name != "alpine:3.20" {
		t.Errorf("image inspect: %+v", r)
	}
	if r := den(t, f, "", "image", "rm", "alpine:3.20", "nope"); r.code != 1 || r.stdout != "alpine:3.20\n" ||
		!strings.Contains(r.stderr, "den image ls") {
		t.Errorf("image rm: %+v", r)
	}
	if r := den(t, f, "", "image", "frob"); r.code != 2 {
		t.Errorf("image frob: %+v", r)
	}
	if r := den(t, nil, "", "image"); r.code != 0 || !strings.Contains(r.stdout, "import") {
		t.Errorf("image alone: %+v", r)
	}
}

func TestProgressBar(t *testing.T) {
	var b bytes.Buffer
	p := &progress{w: &b, tty: true}
	p.update(50, 100, "layer")
	p.finish()
	if !strings.Contains(b.String(), "\r\x1b[Klayer [") || !strings.Contains(b.String(), "(50%)") || !strings.HasSuffix(b.String(), "\n") {
		t.Errorf("bar %q", b.String())
	}
	b.Reset()
	p = &progress{w: &b}
	for i := int64(0); i <= 100; i++ {
		p.update(i, 100, "layer")
	}
	if n := strings.Count(b.String(), "\n"); n != 2 {
		t.Errorf("plain progress printed %d lines for a quick step:\n%s", n, b.String())
	}
}

func TestEvents(t *testing.T) {
	f := newFakeDaemon(t)
	sb := f.addSandbox(api.CreateRequest{Name: "box"})
	r := den(t, f, "", "events", "--sandbox", "box", "--type", "sandbox.", "--since", "1h")
	if r.code != 0 || !regexp.MustCompile(`(?m)^TIME\s+SANDBOX\s+TYPE\s+DATA\n\S+ \S+\s+`+sb.ID[:12]+`\s+sandbox\.create\s+\{"x":1\}$`).MatchString(r.stdout) {
		t.Errorf("events:\n%+v", r)
	}
	q := f.lastQuery["GET /v1/events"]
	if !strings.Contains(q, "sandbox="+sb.ID) || !strings.Contains(q, "type=sandbox.") || !strings.Contains(q, "since=") {
		t.Errorf("events query %q", q)
	}
	r = den(t, f, "", "events", "box", "--type", "sandbox.")
	if r.code != 0 || !strings.Contains(f.lastQuery["GET /v1/events"], "sandbox="+sb.ID) {
		t.Errorf("events with the sandbox as an argument: %+v query %q", r, f.lastQuery["GET /v1/events"])
	}
	if r = den(t, f, "", "events", "box", "other"); r.code != 2 {
		t.Errorf("events with two sandboxes: %+v", r)
	}
	r = den(t, f, "", "events", "--json")
	var list []*api.Event
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 {
		t.Errorf("events --json: %+v", r)
	}
}

func TestVersion(t *testing.T) {
	f := newFakeDaemon(t)
	r := den(t, f, "", "version")
	if r.code != 0 || !strings.Contains(r.stdout, "Version:   dev") || !strings.Contains(r.stdout, "fake-1") {
		t.Errorf("version: %+v", r)
	}
	r = den(t, f, "", "version", "--json")
	var doc struct {
		Client struct{ Version string }
		Server *api.VersionInfo
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil || doc.Client.Version != "dev" || doc.Server == nil || doc.Server.Version != "fake-1" {
		t.Errorf("version --json: %+v", r)
	}

	dead := "unix://" + filepath.Join(t.TempDir(), "none.sock")
	r = den(t, nil, "", "version", "--host", dead)
	if r.code != 1 || !strings.Contains(r.stdout, "Client:") ||
		r.stderr != "den: cannot reach den at "+dead+": is \"den serve\" running? (set DEN_HOST or --host to pick another daemon)\n" {
		t.Errorf("version with no daemon: %+v", r)
	}
	t.Setenv("DEN_HOST", dead)
	if r := den(t, nil, "", "ls"); r.code != 1 || !strings.Contains(r.stderr, dead) {
		t.Errorf("ls with DEN_HOST: %+v", r)
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"10m":                  now.Add(-10 * time.Minute),
		"2025-01-02T15:04:05Z": time.Date(2025, 1, 2, 15, 4, 5, 0, time.UTC),
	} {
		got, err := parseSince(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseSince(%q) = %v, %v", in, got, err)
		}
	}
}

func TestHumanDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                   "Less than a second",
		45 * time.Second:    "45 seconds",
		90 * time.Second:    "About a minute",
		3 * time.Minute:     "3 minutes",
		70 * time.Minute:    "About an hour",
		5 * time.Hour:       "5 hours",
		72 * time.Hour:      "3 days",
		24 * 20 * time.Hour: "2 weeks",
	} {
		if got := humanDuration(d); got != want {
			t.Errorf("humanDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

// start starts a background process through den exec -d and returns its id.
func start(t *testing.T, f *fakeDaemon, sandbox string, cmd ...string) string {
	t.Helper()
	r := den(t, f, "", append([]string{"exec", "-d", sandbox, "--"}, cmd...)...)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exec -d %v: %+v", cmd, r)
	}
	return strings.TrimSpace(r.stdout)
}

func TestExecDetach(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})
	r := den(t, f, "", "exec", "-d", "box", "--", "sleep", "100")
	if r.code != 0 || r.stdout != "p1\n" || r.stderr != "" {
		t.Fatalf("exec -d: %+v", r)
	}
	if got := f.procReqs[0]; !reflect.DeepEqual(got, api.ExecRequest{Cmd: []string{"sleep", "100"}}) {
		t.Errorf("exec -d sent %+v", got)
	}
	if len(f.execs) != 0 {
		t.Errorf("exec -d ran a foreground exec: %+v", f.execs)
	}

	// Every exec flag goes into the request.
	r = den(t, f, "", "exec", "--detach", "-e", "A=1", "-w", "/work", "-u", "nobody", "--timeout", "30s", "box", "echo", "hi")
	if r.code != 0 || r.stdout != "p2\n" {
		t.Errorf("exec -d with flags: %+v", r)
	}
	want := api.ExecRequest{Cmd: []string{"echo", "hi"}, Env: []string{"A=1"}, Workdir: "/work", User: "nobody", Timeout: api.Duration(30 * time.Second)}
	if got := f.procReqs[1]; !reflect.DeepEqual(got, want) {
		t.Errorf("exec -d sent %+v, want %+v", got, want)
	}
	// -i sends all of stdin to the process's stdin, then closes it.
	r = den(t, f, "some input", "exec", "-di", "box", "cat")
	if r.code != 0 || r.stdout != "p3\n" || f.procReqs[2].Stdin != nil {
		t.Errorf("exec -di: %+v, sent %+v", r, f.procReqs[2])
	}
	fp := f.proc("p3")
	f.mu.Lock()
	if got := string(bytes.Join(fp.stdin, nil)); got != "some input" || fp.closes != 1 || fp.info.State != api.ProcExited {
		t.Errorf("exec -di: process got stdin %q, %d closes, state %s", got, fp.closes, fp.info.State)
	}
	f.mu.Unlock()

	r = den(t, f, "", "exec", "-d", "--json", "box", "--", "sleep", "1")
	var p api.ProcessInfo
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil || p.ID != "p4" || p.State != api.ProcRunning ||
		!reflect.DeepEqual(p.Cmd, []string{"sleep", "1"}) || p.Pid == 0 {
		t.Errorf("exec -d --json: %+v (%v)", r, err)
	}

	r = den(t, f, "", "exec", "-d", "nope", "--", "sleep")
	if r.code != 1 || !strings.Contains(r.stderr, `no such sandbox "nope"`) || !strings.Contains(r.stderr, "den ls") {
		t.Errorf("exec -d on a missing sandbox: %+v", r)
	}
	if r := den(t, f, "", "exec", "-d", "box"); r.code != 2 || !strings.Contains(r.stderr, "needs a command") {
		t.Errorf("exec -d without a command: %+v", r)
	}
	// Without -d exec still runs in the foreground.
	if r := den(t, f, "", "exec", "box", "--", "exit", "4"); r.code != 4 || len(f.procReqs) != 4 {
		t.Errorf("exec without -d: %+v, %d process starts", r, len(f.procReqs))
	}
}

func TestPs(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})
	other := f.addSandbox(api.CreateRequest{Name: "other"})
	p1 := start(t, f, "box", "sleep", "100")
	p2 := start(t, f, "box", "exit", "3")
	p3 := start(t, f, "box", "die", "TERM")
	p4 := start(t, f, "box", "sh", "-c", "echo 'a b'")
	p5 := start(t, f, "box", "daemons", "2")
	p6 := start(t, f, "box", "daemons", "6")
	start(t, f, other.ID, "sleep", "5")

	r := den(t, f, "", "ps", "box")
	if r.code != 0 {
		t.Fatalf("ps: %+v", r)
	}
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != 7 {
		t.Fatalf("ps printed %d lines:\n%s", len(lines), r.stdout)
	}
	for i, want := range []string{
		`^PROC\s+NAME\s+PID\s+STATE\s+EXIT\s+RESTARTS\s+STARTED\s+ENDED\s+DESCENDANTS\s+COMMAND$`,
		`^` + p1 + `\s+101\s+running\s+2 minutes ago\s+sleep 100$`,
		`^` + p2 + `\s+102\s+exited\s+3\s+2 minutes ago\s+Less than a second ago\s+exit 3$`,
		`^` + p3 + `\s+103\s+exited\s+SIGTERM\s+2 minutes ago\s+Less than a second ago\s+die TERM$`,
		`^` + p4 + `\s+104\s+exited\s+failed\s+2 minutes ago\s+Less than a second ago\s+sh -c 'echo '\\''a b'\\'''$`,
		`^` + p5 + `\s+105\s+running\s+2 minutes ago\s+200,201\s+daemons 2$`,
		`^` + p6 + `\s+106\s+running\s+2 minutes ago\s+200,201,202,203 \+2\s+daemons 6$`,
	} {
		if !regexp.MustCompile(want).MatchString(lines[i]) {
			t.Errorf("ps line %d %q does not match %s", i, lines[i], want)
		}
	}

	r = den(t, f, "", "ps", "--json", "box")
	var list []*api.ProcessInfo
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 6 || list[0].ID != p1 || list[1].Exit == nil || list[1].Exit.ExitCode != 3 || len(list[5].Descendants) != 6 {
		t.Errorf("ps --json: %v\n%s", err, r.stdout)
	}
	if r := den(t, f, "", "ps", "-q", "box"); r.stdout != strings.Join([]string{p1, p2, p3, p4, p5, p6}, "\n")+"\n" {
		t.Errorf("ps -q: %+v", r)
	}
	fresh := f.addSandbox(api.CreateRequest{Name: "fresh"})
	if r := den(t, f, "", "ps", "--json", fresh.ID[:6]); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("ps --json of no processes: %+v", r)
	}
	if r := den(t, f, "", "ps"); r.code != 2 || !strings.Contains(r.stderr, "ps needs one sandbox ID") {
		t.Errorf("ps without an ID: %+v", r)
	}
	if r := den(t, f, "", "ps", "nope"); r.code != 1 || !strings.Contains(r.stderr, "hint: run `den ls` to see sandboxes") {
		t.Errorf("ps of a missing sandbox: %+v", r)
	}
}

func TestLogs(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})
	out := start(t, f, "box", "echo", "hello")
	if r := den(t, f, "", "logs", "box", out); r.code != 0 || r.stdout != "hello\n" || r.stderr != "" {
		t.Errorf("logs: %+v", r)
	}
	if q := f.lastQuery["GET /v1/sandboxes/{id}/processes/{proc}/logs"]; q != "" {
		t.Errorf("logs sent query %q", q)
	}
	errp := start(t, f, "box", "err", "oops")
	if r := den(t, f, "", "logs", "box", errp); r.code != 0 || r.stdout != "" || r.stderr != "oops\n" {
		t.Errorf("logs of stderr: %+v", r)
	}

	// Without -f den exits 0; with -f, with the process's code.
	ex := start(t, f, "box", "exit", "3")
	if r := den(t, f, "", "logs", "box", ex); r.code != 0 {
		t.Errorf("logs of exit 3: %+v", r)
	}
	if r := den(t, f, "", "logs", "-f", "box", ex); r.code != 3 || r.stderr != "" {
		t.Errorf("logs -f of exit 3: %+v", r)
	}
	if q := f.lastQuery["GET /v1/sandboxes/{id}/processes/{proc}/logs"]; q != "follow=true" {
		t.Errorf("logs -f sent query %q", q)
	}
	for _, tc := range []struct {
		cmd    []string
		code   int
		stderr string
	}{
		{[]string{"die", "SIGINT"}, 130, "den: command killed by signal SIGINT\n"},
		{[]string{"timeout"}, 124, "den: command timed out after 2m0s\n"},
		{[]string{"oom"}, 137, "den: command killed: out of memory (see --memory)\n"},
	} {
		p := start(t, f, "box", tc.cmd...)
		if r := den(t, f, "", "logs", "--follow", "box", p); r.code != tc.code || r.stderr != tc.stderr {
			t.Errorf("logs -f of %v: %+v, want %d %q", tc.cmd, r, tc.code, tc.stderr)
		}
	}

	// A running process: without -f den prints what there is and exits.
	sleeper := start(t, f, "box", "sleep", "100")
	if r := den(t, f, "", "logs", "box", sleeper); r.code != 0 || r.stdout != "" {
		t.Errorf("logs of a running process: %+v", r)
	}

	// --tail and --since.
	before := time.Now()
	if r := den(t, f, "", "logs", "--tail", "5", "--since", "10m", "box", out); r.code != 0 || r.stdout != "hello\n" {
		t.Errorf("logs --tail --since: %+v", r)
	}
	q, err := url.ParseQuery(f.lastQuery["GET /v1/sandboxes/{id}/processes/{proc}/logs"])
	if err != nil || q.Get("tail") != "5" || q.Has("follow") {
		t.Errorf("logs --tail sent %v (%v)", q, err)
	}
	since, err := time.Parse(time.RFC3339Nano, q.Get("since"))
	if err != nil || since.Before(before.Add(-10*time.Minute-time.Second)) || since.After(time.Now().Add(-10*time.Minute)) {
		t.Errorf("logs --since 10m sent since=%q (%v)", q.Get("since"), err)
	}
	den(t, f, "", "logs", "--since", "2025-01-02T15:04:05Z", "-n", "0", "box", out)
	if q := f.lastQuery["GET /v1/sandboxes/{id}/processes/{proc}/logs"]; q != "since=2025-01-02T15%3A04%3A05Z&tail=0" {
		t.Errorf("logs --since TIME -n 0 sent %q", q)
	}

	// -f follows new output until the process ends.
	cat := start(t, f, "box", "cat")
	done := make(chan result)
	go func() { done <- den(t, f, "", "logs", "-f", "box", cat) }()
	cl := client.New(f.host)
	if err := cl.WriteStdin(context.Background(), "box", cat, strings.NewReader("line 1\n"), false); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		t.Fatalf("logs -f returned while the process runs: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	if err := cl.WriteStdin(context.Background(), "box", cat, strings.NewReader("line 2\n"), true); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.code != 0 || r.stdout != "line 1\nline 2\n" {
		t.Errorf("logs -f: %+v", r)
	}

	if r := den(t, f, "", "logs", "box", "p99"); r.code != 1 || !strings.Contains(r.stderr, `no process "p99"`) ||
		!strings.Contains(r.stderr, "hint: run `den ps ID` to see the sandbox's processes") {
		t.Errorf("logs of a missing process: %+v", r)
	}
	if r := den(t, f, "", "logs", "box"); r.code != 2 || !strings.Contains(r.stderr, "needs a sandbox ID and a process id") {
		t.Errorf("logs without PROC: %+v", r)
	}
}

func TestKillWait(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})

	// kill sends KILL by default; wait prints and exits with the code.
	p := start(t, f, "box", "sleep", "100")
	if r := den(t, f, "", "kill", "box", p); r.code != 0 || r.stdout != p+"\n" {
		t.Errorf("kill: %+v", r)
	}
	if f.kills[0] != "KILL" {
		t.Errorf("kill sent signal %q", f.kills[0])
	}
	if r := den(t, f, "", "wait", "box", p); r.code != 137 || r.stdout != "137\n" || r.stderr != "den: command killed by signal SIGKILL\n" {
		t.Errorf("wait after kill: %+v", r)
	}

	q := start(t, f, "box", "sleep", "100")
	if r := den(t, f, "", "kill", "-s", "TERM", "box", q); r.code != 0 || f.kills[1] != "TERM" {
		t.Errorf("kill -s TERM: %+v, sent %q", r, f.kills[1])
	}
	r := den(t, f, "", "wait", "--json", "box", q)
	var st api.ExitStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Reason != api.ReasonSignaled || st.Signal != "SIGTERM" || r.code != 143 || r.stderr != "" {
		t.Errorf("wait --json: %+v (%v)", r, err)
	}
	// Killing an ended process is the daemon's conflict.
	if r := den(t, f, "", "kill", "--signal=INT", "box", q); r.code != 1 || !strings.Contains(r.stderr, "has ended") {
		t.Errorf("kill of an ended process: %+v", r)
	}

	ok := start(t, f, "box", "exit", "0")
	if r := den(t, f, "", "wait", "box", ok); r.code != 0 || r.stdout != "0\n" || r.stderr != "" {
		t.Errorf("wait of exit 0: %+v", r)
	}
	three := start(t, f, "box", "exit", "3")
	if r := den(t, f, "", "wait", "box", three); r.code != 3 || r.stdout != "3\n" {
		t.Errorf("wait of exit 3: %+v", r)
	}

	// wait blocks until the process ends.
	s := start(t, f, "box", "sleep", "100")
	done := make(chan result)
	go func() { done <- den(t, f, "", "wait", "box", s) }()
	select {
	case r := <-done:
		t.Fatalf("wait returned while the process runs: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	if r := den(t, f, "", "kill", "-s", "SIGINT", "box", s); r.code != 0 {
		t.Fatalf("kill -s SIGINT: %+v", r)
	}
	if r := <-done; r.code != 130 || r.stdout != "130\n" {
		t.Errorf("wait of a process killed later: %+v", r)
	}

	// Several processes at once; a failure does not stop the others.
	a, b := start(t, f, "box", "sleep", "1"), start(t, f, "box", "sleep", "2")
	r = den(t, f, "", "kill", "box", a, "p99", b)
	if r.code != 1 || r.stdout != a+"\n"+b+"\n" || !strings.Contains(r.stderr, `no process "p99"`) {
		t.Errorf("kill of several: %+v", r)
	}

	for _, args := range [][]string{{"kill", "box"}, {"wait", "box"}, {"wait", "box", "p1", "p2"}, {"kill", "-s", "", "box", "p1"}} {
		if r := den(t, f, "", args...); r.code != 2 {
			t.Errorf("%q: %+v, want a usage error", args, r)
		}
	}
}

func TestAttach(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})

	// Stdin goes to the process, its output to stdout; at EOF stdin is
	// closed, cat ends and den exits 0.
	p := start(t, f, "box", "cat")
	r := den(t, f, "hello\nworld\n", "attach", "box", p)
	if r.code != 0 || r.stdout != "hello\nworld\n" || r.stderr != "" {
		t.Errorf("attach: %+v", r)
	}
	fp := f.proc(p)
	f.mu.Lock()
	if got := string(bytes.Join(fp.stdin, nil)); got != "hello\nworld\n" || fp.closes != 1 {
		t.Errorf("process got stdin %q, %d closes", got, fp.closes)
	}
	f.mu.Unlock()

	// Large input goes in chunks of at most 32 KiB.
	big := strings.Repeat("0123456789abcdef", 70000/16)
	p = start(t, f, "box", "cat")
	r = den(t, f, big, "attach", "box", p)
	if r.code != 0 || r.stdout != big {
		t.Errorf("attach of %d bytes: exit %d, %d bytes out, stderr %q", len(big), r.code, len(r.stdout), r.stderr)
	}
	fp = f.proc(p)
	f.mu.Lock()
	if len(fp.stdin) < 3 || fp.closes != 1 {
		t.Errorf("%d bytes went in %d writes, %d closes", len(big), len(fp.stdin), fp.closes)
	}
	for _, chunk := range fp.stdin {
		if len(chunk) > 32<<10 {
			t.Errorf("a stdin write of %d bytes", len(chunk))
		}
	}
	f.mu.Unlock()

	// Retained output is shown first; a process that ends by itself ends
	// attach with its code, and the refused stdin is not an error.
	p = start(t, f, "box", "exit", "4")
	if r := den(t, f, "ignored", "attach", "box", p); r.code != 4 || r.stderr != "" {
		t.Errorf("attach to an ended process: %+v", r)
	}
	p = start(t, f, "box", "echo", "earlier")
	if r := den(t, f, "", "attach", "box", p); r.code != 0 || r.stdout != "earlier\n" {
		t.Errorf("attach shows retained output: %+v", r)
	}

	// While stdin stays open, attach follows until the process ends.
	p = start(t, f, "box", "sleep", "100")
	pr, pw := io.Pipe()
	defer pw.Close()
	var out, errb bytes.Buffer
	done := make(chan int)
	go func() { done <- run([]string{"--host", f.host, "attach", "box", p}, pr, &out, &errb) }()
	pw.Write([]byte("typed\n"))
	select {
	case code := <-done:
		t.Fatalf("attach returned while the process runs: %d %q", code, errb.String())
	case <-time.After(50 * time.Millisecond):
	}
	if r := den(t, f, "", "kill", "-s", "TERM", "box", p); r.code != 0 {
		t.Fatalf("kill: %+v", r)
	}
	if code := <-done; code != 143 || errb.String() != "den: command killed by signal SIGTERM\n" {
		t.Errorf("attach to a killed process: %d %q", code, errb.String())
	}
	fp = f.proc(p)
	f.mu.Lock()
	if got := string(bytes.Join(fp.stdin, nil)); got != "typed\n" || fp.closes != 0 {
		t.Errorf("process got stdin %q, %d closes", got, fp.closes)
	}
	f.mu.Unlock()

	if r := den(t, f, "", "attach", "box", "p99"); r.code != 1 || !strings.Contains(r.stderr, `no process "p99"`) {
		t.Errorf("attach to a missing process: %+v", r)
	}
}

func TestProcessVerbsHelp(t *testing.T) {
	r := den(t, nil, "", "help")
	for _, v := range []*verb{verbPs, verbLogs, verbAttach, verbKill, verbWait} {
		if !regexp.MustCompile(`(?m)^  ` + v.name + `\s+` + regexp.QuoteMeta(v.summary) + `$`).MatchString(r.stdout) {
			t.Errorf("den help does not list %s with its summary:\n%s", v.name, r.stdout)
		}
		h := den(t, nil, "", "help", v.name)
		if h.code != 0 || !strings.Contains(h.stdout, "den "+v.name+" [flags] ID PROC") && v != verbPs || !strings.Contains(h.stdout, "Example:\n  den ") {
			t.Errorf("den help %s:\n%s", v.name, h.stdout)
		}
	}
	h := den(t, nil, "", "help", "exec")
	if !strings.Contains(h.stdout, "-d, --detach") || !strings.Contains(h.stdout, "den exec -d ") {
		t.Errorf("den help exec does not show -d:\n%s", h.stdout)
	}
	for _, want := range []string{"-f, --follow", "-n, --tail N", "--since TIME"} {
		if h := den(t, nil, "", "logs", "-h"); !strings.Contains(h.stdout, want) {
			t.Errorf("den logs -h lacks %s", want)
		}
	}
	if h := den(t, nil, "", "kill", "-h"); !strings.Contains(h.stdout, "-s, --signal SIGNAL") {
		t.Errorf("den kill -h lacks -s")
	}
}

// Verbs that take a fixed number of arguments answer a missing or an extra
// one with a usage error naming what they need (exit 2), never a crash or
// a silently ignored argument. The control: with the right arguments the
// same verb gets past its checks to the daemon (none listens here: exit 1).
func TestFixedArityVerbsCheckTheirArguments(t *testing.T) {
	host := "unix://" + filepath.Join(t.TempDir(), "none.sock")
	for _, c := range []struct {
		good, bad []string
		need      string
	}{
		{[]string{"snapshot", "create", "web"}, []string{"snapshot", "create"}, "snapshot create needs one sandbox ID"},
		{[]string{"snapshot", "create", "web"}, []string{"snapshot", "create", "web", "extra"}, "snapshot create needs one sandbox ID"},
		{[]string{"snapshot", "load", "-"}, []string{"snapshot", "load"}, "snapshot load needs one FILE"},
		{[]string{"restore", "web", "snap"}, []string{"restore", "web"}, "restore needs a sandbox ID and a SNAPSHOT"},
		{[]string{"fork", "web"}, []string{"fork"}, "fork needs one sandbox ID"},
		{[]string{"volume", "create", "data"}, []string{"volume", "create"}, "volume create needs one NAME"},
	} {
		call := func(args []string) (r result) {
			defer func() {
				if p := recover(); p != nil {
					r = result{stderr: fmt.Sprint("panic: ", p), code: -1}
				}
			}()
			return den(t, nil, "", append([]string{"--host", host}, args...)...)
		}
		if r := call(c.good); r.code != 1 || strings.Contains(r.stderr, "needs") {
			t.Errorf("control: den %s: exit %d, %q; want the daemon's absence (exit 1)", strings.Join(c.good, " "), r.code, r.stderr)
		}
		if r := call(c.bad); r.code != 2 || !strings.Contains(r.stderr, c.need) {
			t.Errorf("den %s: exit %d, %q; want exit 2 saying %q", strings.Join(c.bad, " "), r.code, r.stderr, c.need)
		}
	}
}
