package server_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/isolate/linux"
	"github.com/den-dev/den/internal/reexec"
	"github.com/den-dev/den/internal/sandbox"
	"github.com/den-dev/den/internal/server"
	"github.com/den-dev/den/internal/storage"
	"github.com/den-dev/den/internal/store"
	"github.com/den-dev/den/internal/testenv/e2e"
)

func TestMain(m *testing.M) {
	reexec.Run(os.Args[1:])
	os.Exit(m.Run())
}

type env struct {
	s    *e2e.Stack
	c    *client.Client
	m    *sandbox.Manager
	db   *store.DB
	sock string
	data string
	rt   *linux.Runtime
	pool int
	// st and allow, when set before start, give the manager a storage
	// backend and host directories sandboxes may mount.
	st    *storage.Store
	allow []string
	// tiers and unavailable, when set before start, add isolation tiers
	// (and the reasons of missing ones) beside the linux default.
	tiers       map[string]isolate.Runtime
	unavailable map[string]string
	// defDisk, when set before start, is the daemon's default disk
	// quota (den serve --default-disk).
	defDisk api.Size
	// previewDomain, when set before start, is the domain of host-name
	// previews (den serve --preview-domain, or localhost).
	previewDomain string
}

// newEnv starts a real daemon stack (SQLite, linux runtime, manager, HTTP
// server on a unix socket) in this process. It skips without root.
func newEnv(t *testing.T) *env { return newEnvPool(t, 0) }

func newEnvPool(t *testing.T, pool int) *env { return newEnvWith(t, pool, nil) }

// newEnvWith is newEnv with a warm pool and a chance to set up the env
// (its storage, allowed mounts) before the daemon starts.
func newEnvWith(t *testing.T, pool int, setup func(e *env)) *env {
	t.Helper()
	e := &env{pool: pool}
	e2e.New(t, "server", func(s *e2e.Stack) {
		e.s, e.db, e.data, e.rt = s, s.DB, s.Data, s.Runtime
		if setup != nil {
			setup(e)
		}
		c := &s.Config
		c.Defaults.Disk, c.WarmPool, c.Storage, c.AllowMounts = e.defDisk, e.pool, e.st, e.allow
		c.Tiers, c.Unavailable, c.PreviewDomain = e.tiers, e.unavailable, e.previewDomain
	})
	e.started()
	return e
}

// start starts the daemon again (after stop) with the image store imgs.
func (e *env) start(t *testing.T, imgs *image.Store) {
	t.Helper()
	e.s.Images, e.s.Config.Images = imgs, imgs
	if err := e.s.Start(); err != nil {
		t.Fatal(err)
	}
	e.started()
}

func (e *env) started() {
	e.m, e.c, e.sock = e.s.Manager, e.s.Admin, e.s.Sock
}

// stop stops the daemon; its sandboxes keep running.
func (e *env) stop() { e.s.Stop() }

func (e *env) create(t *testing.T, req api.CreateRequest) *api.Sandbox {
	t.Helper()
	sb, err := e.c.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return sb
}

func (e *env) sh(t *testing.T, id, script string) *api.ExecResult {
	t.Helper()
	res, err := e.c.Exec(context.Background(), id, api.ExecRequest{Shell: script, Timeout: api.Duration(60 * time.Second)})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return res
}

func wantKind(t *testing.T, err error, kind string) *api.Error {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) {
		t.Fatalf("want a %s API error, got %v", kind, err)
	}
	if ae.Kind != kind {
		t.Fatalf("want kind %s, got %s: %s", kind, ae.Kind, ae.Message)
	}
	return ae
}

func TestLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{Name: "life", Labels: map[string]string{"team": "a"}, Env: []string{"GREETING=hi"}})
	if sb.State != api.StateRunning || sb.Hostname != "life" {
		t.Fatalf("created %+v", sb)
	}
	e.create(t, api.CreateRequest{Labels: map[string]string{"team": "b"}})
	list, err := e.c.List(ctx, map[string]string{"team": "a"})
	if err != nil || len(list) != 1 || list[0].ID != sb.ID {
		t.Fatalf("label filter: %v %v", list, err)
	}
	_, err = e.c.Create(ctx, api.CreateRequest{Name: "life"})
	wantKind(t, err, api.KindExists)

	res := e.sh(t, "life", `echo "$GREETING $(hostname) $(id -u)"; echo err >&2; exit 3`)
	if string(res.Stdout) != "hi life 0\n" || string(res.Stderr) != "err\n" || res.ExitCode != 3 || res.Reason != api.ReasonExited {
		t.Fatalf("exec result %+v stdout %q stderr %q", res.ExitStatus, res.Stdout, res.Stderr)
	}
	// Files written survive stop and start.
	e.sh(t, sb.ID, "echo kept > /root/note")
	if _, err := e.c.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
	wantKind(t, err, api.KindConflict)
	if s, err := e.c.Start(ctx, sb.ID); err != nil || s.State != api.StateRunning {
		t.Fatalf("start: %v %v", s, err)
	}
	if res := e.sh(t, sb.ID, "cat /root/note"); string(res.Stdout) != "kept\n" {
		t.Fatalf("file lost across stop/start: %q", res.Stdout)
	}
	wantKind(t, e.c.Remove(ctx, sb.ID, false), api.KindConflict)
	if err := e.c.Remove(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Get(ctx, sb.ID)
	wantKind(t, err, api.KindNotFound)
	gone := false
	for i := 0; i < 100 && !gone; i++ { // removal finishes in the background
		_, err := os.Stat(filepath.Join(e.data, "sandboxes", sb.ID))
		gone = os.IsNotExist(err)
		time.Sleep(50 * time.Millisecond)
	}
	if !gone {
		t.Fatal("sandbox files left 5 s after rm")
	}
	evs, err := e.c.Events(ctx, client.EventFilter{Sandbox: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	if got := strings.Join(types, ","); !strings.HasPrefix(got, "sandbox.create,exec.start,exec.end") || !strings.HasSuffix(got, "sandbox.remove") {
		t.Fatalf("events %s", got)
	}
}

func TestExecFeatures(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{Workdir: "/tmp"})
	res, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "pwd; cat; id -un"}, Stdin: []byte("from stdin\n"), User: "nobody", Env: []string{"A=1"}})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "/tmp\nfrom stdin\nnobody\n" {
		t.Fatalf("stdout %q", res.Stdout)
	}
	// Stdin is closed unless given: cat ends at once.
	if res := e.sh(t, sb.ID, "cat; echo done"); string(res.Stdout) != "done\n" {
		t.Fatalf("stdin not closed: %q", res.Stdout)
	}
	// The server-side timeout kills the whole process group.
	start := time.Now()
	res, err = e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "sleep 100 & echo $! > /tmp/bg; sleep 100", Timeout: api.Duration(300 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != api.ReasonTimeout || res.ExitCode != 124 || time.Since(start) > 5*time.Second {
		t.Fatalf("timeout: %+v after %v", res.ExitStatus, time.Since(start))
	}
	if r := e.sh(t, sb.ID, `kill -0 $(cat /tmp/bg) 2>/dev/null && echo alive || echo gone`); string(r.Stdout) != "gone\n" {
		t.Fatalf("background child survived the timeout: %q", r.Stdout)
	}
	// A signal is reported as such.
	if r := e.sh(t, sb.ID, "kill -TERM $$"); r.Reason != api.ReasonSignaled || r.Signal != "SIGTERM" || r.ExitCode != 143 {
		t.Fatalf("signal: %+v", r.ExitStatus)
	}
	// Unknown commands fail with 127 and a message.
	r, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"no-such-command"}})
	if err != nil || r.ExitCode != 127 || r.Reason != api.ReasonFailed || !strings.Contains(r.Error, "not found") {
		t.Fatalf("missing command: %+v %v", r, err)
	}
	// Streaming delivers output as it comes.
	var out, errb bytes.Buffer
	st, err := e.c.ExecStream(ctx, sb.ID, api.ExecRequest{Shell: "for i in 1 2 3; do echo $i; echo e$i >&2; done"}, &out, &errb)
	if err != nil || st.ExitCode != 0 || out.String() != "1\n2\n3\n" || errb.String() != "e1\ne2\ne3\n" {
		t.Fatalf("stream: %+v %v %q %q", st, err, out.String(), errb.String())
	}
	// Many execs at once in one sandbox.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: fmt.Sprintf("sleep 0.2; echo %d", i)})
			if err == nil && string(r.Stdout) != fmt.Sprintf("%d\n", i) {
				err = fmt.Errorf("exec %d printed %q", i, r.Stdout)
			}
			errs <- err
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestBadInput(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, api.CreateRequest{})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", e.sock)
	}}}
	cases := []struct {
		method, path, body string
		status             int
		kind, field, msg   string
	}{
		{"POST", "/v1/sandboxes", `{"name":`, 400, "invalid", "", "malformed JSON"},
		{"POST", "/v1/sandboxes", ``, 400, "invalid", "", "empty"},
		{"POST", "/v1/sandboxes", `{"nmae":"x"}`, 400, "invalid", "nmae", "unknown field"},
		{"POST", "/v1/sandboxes", `{"limits":{"memory":"12q"}}`, 400, "invalid", "", "bad size"},
		{"POST", "/v1/sandboxes", `{"limits":{"memory":"-5m"}}`, 400, "invalid", "", "negative"},
		{"POST", "/v1/sandboxes", `{"limits":{"memory":"1k"}}`, 400, "invalid", "limits.memory", "minimum"},
		{"POST", "/v1/sandboxes", `{"limits":{"cpus":1000}}`, 400, "invalid", "limits.cpus", "out of range"},
		{"POST", "/v1/sandboxes", `{"limits":{"pids":-1}}`, 400, "invalid", "limits.pids", ""},
		{"POST", "/v1/sandboxes", `{"ttl":"soon"}`, 400, "invalid", "", "bad duration"},
		{"POST", "/v1/sandboxes", `{"name":"../x"}`, 400, "invalid", "name", ""},
		{"POST", "/v1/sandboxes", `{"image":"nope"}`, 404, "not_found", "", "no image"},
		{"POST", "/v1/sandboxes", `{"env":["NOEQUALS"]}`, 400, "invalid", "env", ""},
		{"POST", "/v1/sandboxes", `{} {}`, 400, "invalid", "", "trailing"},
		{"POST", "/v1/sandboxes", `{"labels":"x"}`, 400, "invalid", "labels", ""},
		{"POST", "/v1/sandboxes", `{"name":"` + strings.Repeat("a", 2<<20) + `"}`, 400, "invalid", "name", "too large"},
		{"POST", "/v1/sandboxes", strings.Repeat(" ", 2<<20) + `{}`, 413, "too_large", "", ""},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":["echo","` + strings.Repeat("a", 128<<10) + `"]}`, 400, "invalid", "cmd", "MAX_ARG_STRLEN"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"shell":"echo ` + strings.Repeat("a", 128<<10) + `"}`, 400, "invalid", "shell", "MAX_ARG_STRLEN"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":["true"],"env":["A=` + strings.Repeat("a", 128<<10) + `"]}`, 400, "invalid", "env", "MAX_ARG_STRLEN"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":["true"],"env":[` + strings.Repeat(`"A=`+strings.Repeat("a", 100<<10)+`",`, 24) + `"B=1"]}`, 400, "invalid", "env", "ARG_MAX"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":[` + strings.Repeat(`"`+strings.Repeat("a", 100<<10)+`",`, 24) + `"b"]}`, 400, "invalid", "cmd", "ARG_MAX"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":["true"],"env":["A=` + strings.Repeat("a", 40<<20) + `"]}`, 400, "invalid", "env", "too large"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":["true"],"stdin":"` + strings.Repeat("AAAA", 400<<10) + `"}`, 400, "invalid", "stdin", "processes"},
		{"GET", "/v1/sandboxes/doesnotexist", ``, 404, "not_found", "", ""},
		{"DELETE", "/v1/sandboxes/doesnotexist", ``, 404, "not_found", "", ""},
		{"POST", "/v1/sandboxes/doesnotexist/exec", `{"cmd":["true"]}`, 404, "not_found", "", ""},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{}`, 400, "invalid", "cmd", ""},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":["true"],"shell":"true"}`, 400, "invalid", "shell", ""},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":["true"],"timeout":"-1s"}`, 400, "invalid", "", "negative"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":["true"],"workdir":"relative"}`, 400, "invalid", "workdir", ""},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":["true"],"user":"nosuchuser"}`, 400, "invalid", "user", ""},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":["true"],"workdir":"/nonexistent"}`, 400, "invalid", "workdir", ""},
		{"GET", "/v1/sandboxes/" + sb.ID + "/files", ``, 400, "invalid", "path", ""},
		{"GET", "/v1/sandboxes/" + sb.ID + "/files?path=/nonexistent", ``, 404, "not_found", "", ""},
		{"PUT", "/v1/sandboxes/" + sb.ID + "/files?path=/tmp/x&mode=999", `x`, 400, "invalid", "mode", ""},
		{"DELETE", "/v1/sandboxes/" + sb.ID + "?force=maybe", ``, 400, "invalid", "force", ""},
		{"GET", "/v1/sandboxes?label=nolabel", ``, 400, "invalid", "label", ""},
		{"GET", "/v1/events?limit=x", ``, 400, "invalid", "limit", ""},
		{"GET", "/v1/nothing", ``, 404, "not_found", "", "no route"},
		{"DELETE", "/v1/images/host", ``, 409, "conflict", "", "built in"},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, "http://den"+c.path, strings.NewReader(c.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", c.method, c.path, err)
		}
		var doc api.ErrorDoc
		err = json.NewDecoder(resp.Body).Decode(&doc)
		resp.Body.Close()
		if resp.StatusCode != c.status || err != nil || doc.Error == nil || doc.Error.Kind != c.kind {
			t.Errorf("%s %s %.60s: status %d doc %+v err %v; want %d %s", c.method, c.path, c.body, resp.StatusCode, doc.Error, err, c.status, c.kind)
			continue
		}
		if c.field != "" && doc.Error.Field != c.field {
			t.Errorf("%s %s %.60s: field %q, want %q (%s)", c.method, c.path, c.body, doc.Error.Field, c.field, doc.Error.Message)
		}
		if c.msg != "" && !strings.Contains(doc.Error.Message, c.msg) {
			t.Errorf("%s %s %.60s: message %q lacks %q", c.method, c.path, c.body, doc.Error.Message, c.msg)
		}
	}
	// The daemon still answers and the sandbox still works.
	if r := e.sh(t, sb.ID, "echo ok"); string(r.Stdout) != "ok\n" {
		t.Fatalf("after bad input: %q", r.Stdout)
	}
}

func TestFiles(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	id := sb.ID
	fi, err := e.c.WriteFile(ctx, id, "/work/deep/dir/a.txt", strings.NewReader("hello"), 0o640)
	if err != nil || fi.Size != 5 || fi.Mode != 0o640 || fi.Type != "file" {
		t.Fatalf("write: %+v %v", fi, err)
	}
	rc, err := e.c.ReadFile(ctx, id, "/work/deep/dir/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "hello" {
		t.Fatalf("read %q", b)
	}
	if _, err := e.c.Mkdir(ctx, id, "/work/m/n", 0o700, true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Rename(ctx, id, "/work/deep/dir/a.txt", "/work/m/b.txt"); err != nil {
		t.Fatal(err)
	}
	ls, err := e.c.ListDir(ctx, id, "/work/m")
	if err != nil || len(ls) != 2 || ls[0].Name != "b.txt" || ls[1].Name != "n" || ls[1].Type != "dir" {
		t.Fatalf("list: %+v %v", ls, err)
	}
	if err := e.c.RemoveFile(ctx, id, "/work", false); err == nil {
		t.Fatal("non-recursive remove of a non-empty dir succeeded")
	}
	if err := e.c.RemoveFile(ctx, id, "/work", true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Stat(ctx, id, "/work"); err == nil {
		t.Fatal("/work still there")
	}

	// Escapes: every path resolves inside the sandbox.
	secret := filepath.Join(t.TempDir(), "host-secret")
	os.WriteFile(secret, []byte("HOST"), 0o600)
	e.sh(t, id, fmt.Sprintf("ln -s %s /tmp/abs; ln -s ../../../../../../%s /tmp/rel; ln -s /proc/1/root/etc /tmp/procroot", secret, secret))
	for _, p := range []string{"/../../../../" + secret, secret, "/tmp/abs", "/tmp/rel", "/proc/1/exe", "/proc/self/fd/3", "/proc/1/fd/1"} {
		rc, err := e.c.ReadFile(ctx, id, p)
		if err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			if strings.Contains(string(b), "HOST") || bytes.HasPrefix(b, []byte("\x7fELF")) {
				t.Fatalf("read of %s reached a host file", p)
			}
		}
	}
	// Writing through symlinks lands inside the sandbox, never on the host.
	e.sh(t, id, "mkdir -p "+filepath.Dir(secret))
	if _, err := e.c.WriteFile(ctx, id, "/tmp/abs", strings.NewReader("pwned"), 0o644); err != nil {
		t.Fatalf("write through symlink: %v", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "HOST" {
		t.Fatal("a write through a symlink changed a host file")
	}
	if r := e.sh(t, id, "cat "+secret); string(r.Stdout) != "pwned" {
		t.Fatalf("the write should land at the same path inside the sandbox: %q", r.Stdout)
	}
	// Hard links to host files cannot even be made: host paths are not there.
	if r := e.sh(t, id, "ln /etc/hostname /tmp/hl 2>&1; ln "+secret+" /tmp/hl2 2>&1 && cat /tmp/hl2"); strings.Contains(string(r.Stdout), "HOST") {
		t.Fatal("hard link reached a host file")
	}

	// Archives: round trip a tree; refuse entries escaping the target.
	e.sh(t, id, "mkdir -p /src/sub && echo one > /src/sub/f && ln -s f /src/sub/l && chmod 600 /src/sub/f")
	rc, err = e.c.Download(ctx, id, "/src")
	if err != nil {
		t.Fatal(err)
	}
	tarball, _ := io.ReadAll(rc)
	rc.Close()
	names := tarNames(t, tarball)
	if strings.Join(names, ",") != "src/,src/sub/,src/sub/f,src/sub/l" {
		t.Fatalf("tar entries %v", names)
	}
	if err := e.c.Upload(ctx, id, "/dst", bytes.NewReader(tarball)); err != nil {
		t.Fatal(err)
	}
	if r := e.sh(t, id, "cat /dst/src/sub/l; stat -c %a /dst/src/sub/f; readlink /dst/src/sub/l"); string(r.Stdout) != "one\n600\nf\n" {
		t.Fatalf("uploaded tree: %q", r.Stdout)
	}
	for _, evil := range []func(*tar.Writer){
		func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Name: "../escape", Mode: 0o644, Size: 1})
			tw.Write([]byte("x"))
		},
		func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Name: "/abs", Mode: 0o644, Size: 1})
			tw.Write([]byte("x"))
		},
		func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/etc"})
			tw.WriteHeader(&tar.Header{Name: "link/evil", Mode: 0o644, Size: 1})
			tw.Write([]byte("x"))
		},
		func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Name: "hl", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"})
		},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		evil(tw)
		tw.Close()
		err := e.c.Upload(ctx, id, "/up", &buf)
		if err == nil {
			t.Fatalf("evil archive accepted")
		}
	}
	if r := e.sh(t, id, "ls /escape /abs /etc/evil 2>/dev/null; echo end"); string(r.Stdout) != "end\n" {
		t.Fatalf("evil archive wrote outside its target: %q", r.Stdout)
	}
}

func tarNames(t *testing.T, b []byte) []string {
	tr := tar.NewReader(bytes.NewReader(b))
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
}

// A symlink swapped in while a tree is being copied never leads outside.
func TestSymlinkSwapRace(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	secret := filepath.Join(t.TempDir(), "race-secret")
	if err := os.WriteFile(secret, []byte("HOSTSECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.sh(t, sb.ID, "mkdir -p /race/d && for i in $(seq 1 50); do echo data > /race/d/f$i; done")
	// The racer swaps f1..f5 between a file and a symlink to the host's
	// secret path, and says how many swaps it made.
	swaps := make(chan string, 1)
	go func() {
		r, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: fmt.Sprintf(`n=0; end=$(($(date +%%s)+3)); while [ $(date +%%s) -lt $end ]; do for i in 1 2 3 4 5; do rm -f /race/d/f$i; ln -s %s /race/d/f$i; rm -f /race/d/f$i; echo data > /race/d/f$i; n=$((n+1)); done; done; echo $n`, secret)})
		if err != nil {
			swaps <- err.Error()
			return
		}
		swaps <- strings.TrimSpace(string(r.Stdout))
	}()
	var downloads, reads int
	deadline := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if rc, err := e.c.Download(ctx, sb.ID, "/race"); err == nil {
			files, err := readTar(rc)
			rc.Close()
			if err != nil {
				t.Fatalf("download during the race: %v", err)
			}
			for name, body := range files {
				if strings.Contains(body, "HOSTSECRET") {
					t.Fatalf("a copy followed a swapped-in symlink to a host file (%s)", name)
				}
			}
			// The files nobody swaps come whole.
			if files["race/d/f50"] != "data\n" {
				t.Fatalf("download during the race: f50 = %q (entries %d)", files["race/d/f50"], len(files))
			}
			downloads++
		}
		if rc, err := e.c.ReadFile(ctx, sb.ID, "/race/d/f1"); err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			if bytes.Contains(b, []byte("HOSTSECRET")) {
				t.Fatal("a read followed a swapped-in symlink to a host file")
			}
			reads++
		}
	}
	n, err := strconv.Atoi(<-swaps)
	if err != nil || n == 0 {
		t.Fatalf("the racer made no swaps: %v", err)
	}
	// A race test proves something only if the operations ran during it.
	if downloads < 3 || reads < 1 {
		t.Fatalf("only %d downloads and %d reads succeeded during %d swaps", downloads, reads, n)
	}
	t.Logf("%d downloads and %d reads during %d swaps, none followed a symlink", downloads, reads, n)
}

// readTar reads a tar stream into name → content (regular files only).
func readTar(r io.Reader) (map[string]string, error) {
	files := map[string]string{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, nil
		}
		if err != nil {
			return files, err
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				return files, err
			}
			files[strings.TrimPrefix(h.Name, "./")] = string(b)
		}
	}
}

func TestIsolation(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, api.CreateRequest{})
	r := e.sh(t, sb.ID, `
		echo procs=$(ls /proc | grep -c '^[0-9]')
		unshare -U true 2>/dev/null && echo unshare=yes || echo unshare=no
		mount -t tmpfs x /tmp 2>/dev/null && echo mount=yes || echo mount=no
		ip link add dummy0 type dummy 2>/dev/null && echo netadmin=yes || echo netadmin=no
		echo 1 > /proc/sys/kernel/sysrq 2>/dev/null && echo procsys=yes || echo procsys=no
		cat /proc/kcore 2>/dev/null | head -c1 | wc -c | sed 's/^/kcore=/'
		grep -c . /proc/net/dev | sed 's/^/netdevs=/'
		ls /root /home | tr '\n' ' '; echo
		test -e /var/lib/den && echo dendata=yes || echo dendata=no
		test -e /etc/ssh/ssh_host_rsa_key && echo hostkey=yes || echo hostkey=no
		grep -c 'CapEff:.*a80425fb\|CapEff:.*a80405fb' /proc/self/status | sed 's/^/capeff=/'
	`)
	out := string(r.Stdout)
	for _, want := range []string{"unshare=no", "mount=no", "netadmin=no", "procsys=no", "kcore=0", "netdevs=3", "dendata=no", "hostkey=no", "capeff=1"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("isolation: want %s in\n%s", want, out)
		}
	}
	var procs int
	fmt.Sscanf(out[strings.Index(out, "procs="):], "procs=%d", &procs)
	if procs < 2 || procs > 8 {
		t.Errorf("want only the sandbox's few processes in /proc, saw %d", procs)
	}
	// apt/dpkg state is the sandbox's own copy: a change stays inside.
	if r := e.sh(t, sb.ID, "touch /usr/bin/den-marker /var/lib/dpkg/den-marker && echo ok"); string(r.Stdout) != "ok\n" {
		t.Fatalf("root cannot change image files via copy-up: %q %q", r.Stdout, r.Stderr)
	}
	for _, p := range []string{"/usr/bin/den-marker", "/var/lib/dpkg/den-marker"} {
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("sandbox write reached host %s", p)
		}
	}
	// A setuid-root binary made by root inside gives a user no privileges.
	e.sh(t, sb.ID, "cp /usr/bin/id /usr/local/bin/id-suid && chmod 4755 /usr/local/bin/id-suid")
	r2, err := e.c.Exec(context.Background(), sb.ID, api.ExecRequest{Cmd: []string{"/usr/local/bin/id-suid"}, User: "nobody"})
	if err != nil || !strings.HasPrefix(string(r2.Stdout), "uid=65534") || strings.Contains(string(r2.Stdout), "euid=0") {
		t.Fatalf("setuid as nobody: %q %v", r2.Stdout, err)
	}
	other := e.create(t, api.CreateRequest{})
	if r := e.sh(t, other.ID, "test -e /usr/bin/den-marker && echo leak || echo clean"); string(r.Stdout) != "clean\n" {
		t.Fatalf("one sandbox's write is visible in another: %q", r.Stdout)
	}
}

func TestLimitsContainBombs(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	bystander := e.create(t, api.CreateRequest{})
	bomb := e.create(t, api.CreateRequest{Limits: api.Limits{Pids: 64, Memory: 64 << 20}})
	// Memory bomb: reported as an out-of-memory kill.
	r, err := e.c.Exec(ctx, bomb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", "a = bytearray(512 << 20)"}, Timeout: api.Duration(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Reason != api.ReasonOOM || r.ExitCode != 137 {
		t.Fatalf("memory bomb: %+v stderr %.300q", r.ExitStatus, r.Stderr)
	}
	// Fork bomb: held at the pids limit while the other sandbox keeps
	// answering; the timeout then kills the whole process group.
	done := make(chan *api.ExecResult, 1)
	go func() {
		r, _ := e.c.Exec(ctx, bomb.ID, api.ExecRequest{Shell: `b() { b | b & }; b; while :; do b 2>/dev/null; sleep 0.01; done`, Timeout: api.Duration(4 * time.Second)})
		done <- r
	}()
	time.Sleep(time.Second)
	for i := 0; i < 5; i++ {
		start := time.Now()
		if r := e.sh(t, bystander.ID, "echo alive"); string(r.Stdout) != "alive\n" {
			t.Fatalf("bystander: %q", r.Stdout)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("bystander took %v during a fork bomb", d)
		}
	}
	if n := countProcs(t, bomb.Pid); n > 64+1 { // the commands, plus the agent
		t.Fatalf("fork bomb grew to %d processes past the pids limit of 64", n)
	}
	// The agent kept answering through the bomb.
	if _, err := e.c.Exec(ctx, bomb.ID, api.ExecRequest{Cmd: []string{"true"}, Timeout: api.Duration(5 * time.Second)}); err != nil && !strings.Contains(err.Error(), "fork") {
		t.Logf("exec during the bomb: %v", err)
	}
	if r := <-done; r == nil || (r.Reason != api.ReasonTimeout && r.Reason != api.ReasonExited) {
		t.Fatalf("fork bomb exec did not end cleanly: %v", r != nil)
	}
	// Stopping kills whatever the bomb left; the sandbox starts again clean.
	if _, err := e.c.Stop(ctx, bomb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Start(ctx, bomb.ID); err != nil {
		t.Fatal(err)
	}
	if r := e.sh(t, bomb.ID, "echo recovered"); string(r.Stdout) != "recovered\n" {
		t.Fatalf("bomb sandbox unusable after restart: %q", r.Stdout)
	}
}

// countProcs counts the processes in the pid namespace of host pid init.
func countProcs(t *testing.T, init int) int {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", init))
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/pid"); err == nil && l == ns {
			n++
		}
	}
	return n
}

// A command printing gigabytes to a reader that drops it does not grow the
// daemon's memory.
func TestOutputFloodBoundedMemory(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, api.CreateRequest{})
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var n countWriter
	st, err := e.c.ExecStream(context.Background(), sb.ID, api.ExecRequest{Shell: "head -c 2000000000 /dev/zero"}, &n, io.Discard)
	if err != nil || st.ExitCode != 0 {
		t.Fatalf("flood: %+v %v", st, err)
	}
	if n != 2000000000 {
		t.Fatalf("got %d bytes, want all 2e9", int64(n))
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grow := int64(after.HeapInuse) - int64(before.HeapInuse); grow > 64<<20 {
		t.Fatalf("daemon heap grew by %d MiB while streaming 2 GB", grow>>20)
	}
	// The JSON form caps what it keeps and says so.
	r, err := e.c.Exec(context.Background(), sb.ID, api.ExecRequest{Shell: "head -c 50000000 /dev/zero"})
	if err != nil || !r.Truncated || len(r.Stdout) != server.MaxCapture {
		t.Fatalf("capture: truncated=%v len=%d err=%v", r != nil && r.Truncated, len(r.Stdout), err)
	}
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

func TestTTLExpires(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, api.CreateRequest{TTL: api.Duration(time.Second)})
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := e.c.Get(context.Background(), sb.ID); err != nil {
			wantKind(t, err, api.KindNotFound)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("sandbox outlived its TTL")
}

// Sandboxes and their processes survive a daemon restart.
func TestDaemonRestartReattaches(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, api.CreateRequest{})
	e.sh(t, sb.ID, "sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/sleeper")
	bg := e.startProc(t, sb.ID, "echo before; read line; echo got $line")
	e.stop()
	imgs, _ := image.NewStore(filepath.Join(e.data, "images"))
	e.start(t, imgs)
	got, err := e.c.Get(context.Background(), sb.ID)
	if err != nil || got.State != api.StateRunning {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if r := e.sh(t, sb.ID, "kill -0 $(cat /tmp/sleeper) && echo alive"); string(r.Stdout) != "alive\n" {
		t.Fatalf("process lost across restart: %q %q", r.Stdout, r.Stderr)
	}
	// The background process, its id, its output and its stdin survive too.
	base := "/v1/sandboxes/" + sb.ID + "/processes/" + bg.ID
	if status, b := e.raw(t, "POST", base+"/stdin?close=true", strings.NewReader("x\n")); status != 204 {
		t.Fatalf("stdin after restart: %d %s", status, b)
	}
	_, b := e.raw(t, "GET", base+"/logs?follow=true", nil)
	if out, _, _, exit := logs(t, b); out != "before\ngot x\n" || exit == nil || exit.ExitCode != 0 {
		t.Fatalf("logs after restart: %q %+v", out, exit)
	}
	// A reattached sandbox stops like any other.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.c.Stop(ctx, sb.ID); err != nil {
		t.Fatalf("stop after reattach: %v", err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", got.Pid)); err == nil {
		t.Fatal("the reattached sandbox's init survived stop")
	}
}

func TestWarmPool(t *testing.T) {
	e := newEnvPool(t, 2)
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	var sb *api.Sandbox
	for time.Now().Before(deadline) { // wait until the pool has filled
		sb = e.create(t, api.CreateRequest{Name: "pooled", Limits: api.Limits{Pids: 99}, Labels: map[string]string{"a": "b"}})
		evs, _ := e.c.Events(ctx, client.EventFilter{Sandbox: sb.ID, Type: "sandbox.create"})
		if len(evs) == 1 && strings.Contains(string(evs[0].Data), `"warm":true`) {
			break
		}
		e.c.Remove(ctx, sb.ID, true)
		sb = nil
		time.Sleep(200 * time.Millisecond)
	}
	if sb == nil {
		t.Fatal("no create was served from the warm pool")
	}
	if r := e.sh(t, sb.ID, "hostname; echo $$"); !strings.HasPrefix(string(r.Stdout), "pooled\n") {
		t.Fatalf("claimed sandbox kept the pool's hostname: %q", r.Stdout)
	}
	if n := pidsMax(t, e, sb.ID); n != "99" {
		t.Fatalf("claimed sandbox pids limit %q, want 99", n)
	}
	list, _ := e.c.List(ctx, nil)
	if len(list) != 1 {
		t.Fatalf("pooled sandboxes are visible: %d listed", len(list))
	}
	e.c.Remove(ctx, sb.ID, true)
	e.stop()
	// Closing removes the unclaimed pool: no records, no files.
	all, _ := e.db.ListSandboxes(ctx, nil)
	ents, _ := os.ReadDir(filepath.Join(e.data, "sandboxes"))
	if len(all) != 0 || len(ents) != 0 {
		t.Fatalf("after close: %d records, %d sandbox dirs", len(all), len(ents))
	}
	imgs, _ := image.NewStore(filepath.Join(e.data, "images"))
	e.start(t, imgs)
}

func pidsMax(t *testing.T, e *env, id string) string {
	for _, p := range []string{"/sys/fs/cgroup/pids/den-e2e/" + id + "/cmds/pids.max", "/sys/fs/cgroup/den-e2e/" + id + "/pids.max"} {
		if b, err := os.ReadFile(p); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatal("no pids cgroup found")
	return ""
}

// dpkg -i inside a host-image sandbox installs into that sandbox only.
func TestDpkgInstallStaysInside(t *testing.T) {
	if _, err := os.Stat("/usr/bin/dpkg-deb"); err != nil {
		t.Skip("needs a Debian host (dpkg-deb)")
	}
	e := newEnv(t)
	sb := e.create(t, api.CreateRequest{})
	r := e.sh(t, sb.ID, `set -e
		mkdir -p /tmp/p/DEBIAN /tmp/p/usr/share/den-e2e
		printf 'Package: den-e2e-test\nVersion: 1.0\nArchitecture: all\nMaintainer: den <den@example.org>\nDescription: test\n' > /tmp/p/DEBIAN/control
		echo hi > /tmp/p/usr/share/den-e2e/hello
		dpkg-deb --build /tmp/p /tmp/t.deb >/dev/null
		dpkg -i /tmp/t.deb >/dev/null
		dpkg -s den-e2e-test | grep '^Status'
		cat /usr/share/den-e2e/hello`)
	if string(r.Stdout) != "Status: install ok installed\nhi\n" {
		t.Fatalf("dpkg -i in the sandbox: %q %q", r.Stdout, r.Stderr)
	}
	if _, err := os.Stat("/usr/share/den-e2e"); err == nil {
		t.Fatal("the package's files reached the host")
	}
	if b, _ := os.ReadFile("/var/lib/dpkg/status"); strings.Contains(string(b), "den-e2e-test") {
		t.Fatal("the host's dpkg database lists the sandbox's package")
	}
	other := e.create(t, api.CreateRequest{})
	if r := e.sh(t, other.ID, "dpkg -s den-e2e-test >/dev/null 2>&1 && echo leak || echo clean"); string(r.Stdout) != "clean\n" {
		t.Fatalf("another sandbox sees the package: %q", r.Stdout)
	}
}

func TestIdleTimeout(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	busy := e.create(t, api.CreateRequest{IdleTimeout: api.Duration(1500 * time.Millisecond)})
	idle := e.create(t, api.CreateRequest{IdleTimeout: api.Duration(time.Second)})
	// A long exec keeps a sandbox busy past its idle timeout.
	if r := e.sh(t, busy.ID, "sleep 2.5; echo done"); string(r.Stdout) != "done\n" {
		t.Fatalf("long exec: %q", r.Stdout)
	}
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		sb, err := e.c.Get(ctx, idle.ID)
		if err != nil {
			t.Fatal(err)
		}
		if sb.State == api.StateStopped {
			evs, _ := e.c.Events(ctx, client.EventFilter{Sandbox: idle.ID, Type: "sandbox.idle"})
			if len(evs) != 1 {
				t.Fatalf("no sandbox.idle event: %v", evs)
			}
			if s, _ := e.c.Get(ctx, busy.ID); s.State != api.StateRunning {
				t.Fatal("the busy sandbox was stopped as idle")
			}
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("idle sandbox still running 6 s after its 1 s idle timeout")
}

func TestStatsAndMetrics(t *testing.T) {
	saved := sandbox.UsageInterval
	sandbox.UsageInterval = 500 * time.Millisecond
	defer func() { sandbox.UsageInterval = saved }()
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{Name: "metered", Limits: api.Limits{Memory: 256 << 20, Pids: 100}})
	// Burn about a second of CPU and hold 64 MiB, with a file on disk.
	e.sh(t, sb.ID, `head -c 5000000 /dev/urandom > /root/blob; python3 -c "
import time
a = bytearray(64 << 20)
for i in range(0, len(a), 4096): a[i] = 1
# CPU time, not wall time: on a loaded host a wall-clock loop gets less.
while time.process_time() < 1.2: pass
time.sleep(1.5)
"`)
	status, b := e.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/stats", nil)
	var st api.Stats
	if status != 200 || json.Unmarshal(b, &st) != nil {
		t.Fatalf("stats: %d %s", status, b)
	}
	if st.CPU.D() < time.Second || st.Memory <= 0 || st.MemoryLimit != 256<<20 || st.Pids < 1 || st.PidsLimit != 100 || st.Disk < 5000000 {
		t.Fatalf("stats: %+v", st)
	}
	if st.Usage.CPUSeconds < 0.5 || st.Usage.AliveSeconds < 1 || st.Usage.ActiveSeconds < 1 || st.Usage.MemoryGiBHours <= 0 {
		t.Fatalf("usage totals: %+v", st.Usage)
	}
	status, b = e.raw(t, "GET", "/metrics", nil)
	text := string(b)
	for _, want := range []string{`den_sandboxes{state="running"} 1`, `den_sandbox_cpu_seconds_total{id="` + sb.ID + `",name="metered"}`, "den_daemon_goroutines "} {
		if status != 200 || !strings.Contains(text, want) {
			t.Fatalf("metrics lack %q:\n%s", want, text)
		}
	}
	// Totals survive a stop and are kept in the record.
	if _, err := e.c.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, _ := e.c.Get(ctx, sb.ID)
	if got.Usage.CPUSeconds < st.Usage.CPUSeconds || got.Usage.AliveSeconds < st.Usage.AliveSeconds {
		t.Fatalf("totals after stop %+v, before %+v", got.Usage, st.Usage)
	}
	_, err := e.c.Get(ctx, "nosuch")
	wantKind(t, err, api.KindNotFound)
	if status, _ := e.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/stats", nil); status != 409 {
		t.Fatalf("stats of a stopped sandbox: %d, want 409", status)
	}
}

// After a host reboot (every sandbox process gone while no daemon ran),
// sandboxes come back stopped with their files, and start again.
func TestRebootLeavesStoppedSandboxes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{Name: "survivor"})
	e.sh(t, sb.ID, "echo precious > /root/work.txt")
	e.stop()
	if err := syscall.Kill(sb.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", sb.Pid)); err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	imgs, _ := image.NewStore(filepath.Join(e.data, "images"))
	e.start(t, imgs)
	got, err := e.c.Get(ctx, sb.ID)
	if err != nil || got.State != api.StateStopped {
		t.Fatalf("after reboot: %+v %v", got, err)
	}
	if _, err := e.c.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if r := e.sh(t, sb.ID, "cat /root/work.txt"); string(r.Stdout) != "precious\n" {
		t.Fatalf("files after reboot: %q", r.Stdout)
	}
}
