package linux

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/isolate"
)

func TestMain(m *testing.M) {
	if IsInit(os.Args[1:]) {
		Init()
	}
	if len(os.Args) > 1 && os.Args[1] == "__userns-hold" {
		HoldUserns()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// needRoot skips unless the machine can run the linux tier.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the linux tier needs root")
	}
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("no user namespaces")
	}
}

// testSpec builds a tiny root: a skeleton with /etc/passwd and the host's
// /usr (merged-usr symlinks) beneath it.
func testSpec(t testing.TB, rt *Runtime, id string) *isolate.Spec {
	t.Helper()
	dir := t.TempDir()
	skel := filepath.Join(dir, "skel")
	for _, d := range []string{"etc", "usr", "tmp", "root", "proc", "sys", "dev"} {
		os.MkdirAll(filepath.Join(skel, d), 0o755)
	}
	os.Chmod(filepath.Join(skel, "tmp"), 0o1777)
	os.WriteFile(filepath.Join(skel, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"), 0o644)
	os.WriteFile(filepath.Join(skel, "etc/group"), []byte("root:x:0:\n"), 0o644)
	layers := []isolate.Overlay{{Target: "/", Lowers: []string{skel}, Name: "root"}}
	for _, d := range []string{"bin", "sbin", "lib", "lib64"} {
		if st, err := os.Lstat("/" + d); err == nil && st.Mode()&os.ModeSymlink != 0 {
			target, _ := os.Readlink("/" + d)
			os.Symlink(target, filepath.Join(skel, d))
		}
	}
	layers = append(layers, isolate.Overlay{Target: "/usr", Lowers: []string{"/usr"}, Name: "usr"})
	os.Chmod(dir, 0o711)
	return &isolate.Spec{ID: id, Hostname: "box-" + id, Dir: filepath.Join(dir, "state"), Layers: layers, UIDBase: 200000 + 65536*7, Limits: isolate.Limits{Pids: 256, Memory: 256 << 20}}
}

func newRuntime(t testing.TB) *Runtime {
	needRoot(t)
	dir := filepath.Join("/run/den-test", strings.ReplaceAll(t.Name(), "/", "_"))
	rt, err := New(Config{RunDir: dir, CgroupName: "den-test"})
	if err != nil {
		t.Fatal(err)
	}
	// New made dir a private mount; it goes once the test's boxes have
	// (cleanups run last-in, first-out).
	t.Cleanup(func() {
		syscall.Unmount(dir, syscall.MNT_DETACH)
		os.RemoveAll(dir)
	})
	return rt
}

func run(t testing.TB, c *agent.Client, argv ...string) (string, string, api.ExitStatus) {
	t.Helper()
	return runSpec(t, c, &agent.ExecSpec{Argv: argv})
}

// runSpec runs a command (20 s timeout unless set) and collects its output.
func runSpec(t testing.TB, c *agent.Client, spec *agent.ExecSpec) (string, string, api.ExitStatus) {
	t.Helper()
	if spec.Timeout == 0 {
		spec.Timeout = 20 * time.Second
	}
	argv := spec.Argv
	rc, err := c.Exec(context.Background(), spec)
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	defer rc.Close()
	var out, errb bytes.Buffer
	st, err := api.ReadExecStream(rc, func(f *api.ExecFrame) error {
		switch f.Type {
		case api.FrameStdout:
			out.Write(f.Payload)
		case api.FrameStderr:
			errb.Write(f.Payload)
		}
		return nil
	})
	if err == io.EOF {
		t.Fatalf("exec %v: stream ended without exit", argv)
	}
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	return out.String(), errb.String(), *st
}

func TestBoxBootsAndIsolates(t *testing.T) {
	rt := newRuntime(t)
	spec := testSpec(t, rt, "t1boot")
	ctx := context.Background()
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Destroy(ctx, spec)
	defer b.Stop(ctx)

	out, _, st := run(t, b.Agent(), "/bin/sh", "-c", "echo $$; id -u; hostname; ls -ln /usr/bin/env | cut -d' ' -f3; cat /proc/self/status | grep -E '^(NoNewPrivs|Seccomp):'")
	if st.ExitCode != 0 {
		t.Fatalf("exit %+v out %q", st, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	t.Logf("%q", lines)
	if lines[1] != "0" || lines[2] != "box-t1boot" || lines[3] != "0" {
		t.Fatalf("want uid 0, hostname and root-owned image files inside; got %q", lines)
	}
	if !strings.Contains(out, "NoNewPrivs:\t1") || !strings.Contains(out, "Seccomp:\t2") {
		t.Fatalf("commands not confined: %q", out)
	}
	// Writes go to the box's upper layer only.
	_, _, st = run(t, b.Agent(), "/bin/sh", "-c", "echo hi > /usr/den-test-file && echo x >> /etc/passwd")
	if st.ExitCode != 0 {
		t.Fatalf("copy-up write failed: %+v", st)
	}
	if _, err := os.Stat("/usr/den-test-file"); err == nil {
		t.Fatal("write inside the box reached the host's /usr")
	}
	if b, err := os.ReadFile(filepath.Join(spec.Dir, "upper/usr/den-test-file")); err != nil || string(b) != "hi\n" {
		t.Fatalf("upper layer: %q %v", b, err)
	}
	// The agent is shielded from the OOM killer; its commands are not.
	out, _, _ = run(t, b.Agent(), "/bin/sh", "-c", "sleep 0.1; read a < /proc/1/oom_score_adj; read c < /proc/self/oom_score_adj; echo $a; echo $c")
	if out != "-1000\n500\n" && out != "0\n500\n" {
		t.Fatalf("oom_score_adj of agent and command: %q", out)
	}
	// Host processes are invisible; mount and unshare are refused.
	out, _, _ = run(t, b.Agent(), "/bin/sh", "-c", "ls /proc | grep -c '^[0-9]'; unshare -U true 2>&1; mount -t tmpfs x /mnt 2>&1; echo done")
	t.Logf("%s", out)
}

// BenchmarkStartStop measures booting a box to a ready agent and stopping it.
func BenchmarkStartStop(b *testing.B) {
	rt := newRuntime(b)
	ctx := context.Background()
	spec := testSpec(b, rt, "bench")
	for i := 0; i < b.N; i++ {
		box, err := rt.Start(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		if err := box.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	}
	rt.Destroy(ctx, spec)
}
