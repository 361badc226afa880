package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/isolate/isolatetest"
)

func TestMain(m *testing.M) {
	if IsAgent(os.Args[1:]) {
		AgentMain()
	}
	os.Exit(m.Run())
}

// needRunsc skips unless the machine can run the gvisor tier.
func needRunsc(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the gvisor tier needs root")
	}
	if in := Detect(""); !in.Available {
		t.Skip(in.Reason)
	}
}

const testCgroup = "den-test-gvisor"

func testRunDir(t testing.TB) string {
	return filepath.Join("/run/den-test-gvisor", strings.ReplaceAll(t.Name(), "/", "_"))
}

// newRuntime makes a runtime with a run directory of the test's own,
// removed (after every box of the test is gone) at the end.
func newRuntime(t testing.TB) *Runtime {
	t.Helper()
	needRunsc(t)
	dir := testRunDir(t)
	rt, err := New(Config{RunDir: dir, CgroupParent: testCgroup})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cleanupRoot(rt.info.Runsc, rt.state)
		if err := unmountAll(dir); err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		os.RemoveAll(dir)
	})
	return rt
}

// testSpec builds a tiny root: a skeleton with /etc/passwd and the host's
// /usr (merged-usr symlinks) beneath it.
func testSpec(t testing.TB, id string) *isolate.Spec {
	t.Helper()
	dir := t.TempDir()
	skel := filepath.Join(dir, "skel")
	for _, d := range []string{"etc", "usr", "tmp", "root", "proc", "sys", "dev"} {
		os.MkdirAll(filepath.Join(skel, d), 0o755)
	}
	os.Chmod(filepath.Join(skel, "tmp"), 0o1777)
	os.WriteFile(filepath.Join(skel, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"), 0o644)
	os.WriteFile(filepath.Join(skel, "etc/group"), []byte("root:x:0:\n"), 0o644)
	for _, d := range []string{"bin", "sbin", "lib", "lib64"} {
		if st, err := os.Lstat("/" + d); err == nil && st.Mode()&os.ModeSymlink != 0 {
			target, _ := os.Readlink("/" + d)
			os.Symlink(target, filepath.Join(skel, d))
		}
	}
	layers := []isolate.Overlay{
		{Target: "/", Lowers: []string{skel}, Name: "root"},
		{Target: "/usr", Lowers: []string{"/usr"}, Name: "usr"},
	}
	return &isolate.Spec{ID: id, Hostname: "box-" + id, Dir: filepath.Join(dir, "state"), Layers: layers,
		UIDBase: 200000 + 65536*9, Limits: isolate.Limits{Pids: 256, Memory: 256 << 20}}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// start boots spec and registers its stop and destroy.
func start(t testing.TB, rt *Runtime, spec *isolate.Spec) isolate.Box {
	t.Helper()
	b, err := rt.Start(ctxT(t, time.Minute), spec)
	if err != nil {
		t.Fatalf("start %s: %v", spec.ID, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		b.Stop(ctx)
		rt.Destroy(ctx, spec)
	})
	return b
}

func sh(t testing.TB, b isolate.Box, script string) isolatetest.Result {
	t.Helper()
	res, err := isolatetest.Exec(ctxT(t, time.Minute), b.Agent(), &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func mustSh(t testing.TB, b isolate.Box, script string) string {
	t.Helper()
	res := sh(t, b, script)
	if res.Exit.ExitCode != 0 || res.Exit.Signal != "" {
		t.Fatalf("%q: exit %+v, stdout %q, stderr %q", script, res.Exit, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// leftovers lists what a box left on the host after its Stop.
func leftovers(rt *Runtime, id string) []string {
	var out []string
	if st := rt.containerState(context.Background(), id); st != "" {
		out = append(out, "runsc container "+st)
	}
	if ms := mountsUnder(rt.boxRun(id)); len(ms) > 0 {
		out = append(out, "mounts "+strings.Join(ms, " "))
	}
	if _, err := os.Stat(rt.boxRun(id)); err == nil {
		out = append(out, "run dir")
	}
	if _, err := os.Stat(rt.cg.dir(id, "memory")); err == nil {
		out = append(out, "cgroup")
	}
	return out
}

func TestDetect(t *testing.T) {
	in := Detect("")
	t.Logf("%+v", in)
	if in.Runsc != "" && in.Version == "" {
		t.Fatalf("runsc found but no version: %+v", in)
	}
	if bad := Detect("/nonexistent/runsc"); bad.Available || !strings.Contains(bad.Reason, "runsc not found") {
		t.Fatalf("missing runsc: %+v", bad)
	}
}

func TestBoot(t *testing.T) {
	rt := newRuntime(t)
	spec := testSpec(t, "gboot")
	b := start(t, rt, spec)
	res := sh(t, b, "echo out; echo err >&2; exit 3")
	if res.Stdout != "out\n" || res.Stderr != "err\n" || res.Exit.ExitCode != 3 {
		t.Fatalf("stdout %q stderr %q exit %+v", res.Stdout, res.Stderr, res.Exit)
	}
	out := mustSh(t, b, "id -u; hostname; echo $$; grep -E '^(NoNewPrivs|Seccomp|CapEff):' /proc/self/status; cat /proc/1/cmdline | tr '\\0' ' '")
	t.Logf("%s", out)
	lines := strings.Split(out, "\n")
	if lines[0] != "0" || lines[1] != "box-gboot" {
		t.Fatalf("id/hostname: %q", out)
	}
	// (gVisor's /proc/PID/status shows no NoNewPrivs line.)
	if !strings.Contains(out, "CapEff:\t00000000a80405fb") || !strings.Contains(out, "Seccomp:\t2") {
		t.Errorf("commands' capabilities are not den's container set: %q", out)
	}
	// Seccomp is enforced: a syscall the filter refuses fails.
	if res := sh(t, b, "unshare -U true"); res.Exit.ExitCode == 0 {
		t.Errorf("unshare -U succeeded inside a confined command")
	}
	// Writes go to the upper layer, with canonical ids; /tmp is kept too.
	mustSh(t, b, "echo hi > /usr/den-test-file && echo t > /tmp/t && mkdir /root/d && chown 1000:1000 /root/d")
	if _, err := os.Stat("/usr/den-test-file"); err == nil {
		t.Fatal("write inside the box reached the host's /usr")
	}
	if data, err := os.ReadFile(filepath.Join(spec.Dir, "upper/usr/den-test-file")); err != nil || string(data) != "hi\n" {
		t.Fatalf("upper layer: %q %v", data, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(spec.Dir, "upper/usr/den-test-file"), &st); err != nil || st.Uid != 0 {
		t.Fatalf("owner on disk of a file root made: %d %v", st.Uid, err)
	}
	if err := syscall.Stat(filepath.Join(spec.Dir, "upper/root/root/d"), &st); err != nil || st.Uid != 1000 || st.Gid != 1000 {
		t.Fatalf("owner on disk of a dir chowned to 1000: %d:%d %v", st.Uid, st.Gid, err)
	}
	if data, err := os.ReadFile(filepath.Join(spec.Dir, "upper/root/tmp/t")); err != nil || string(data) != "t\n" {
		t.Fatalf("/tmp is not in the upper layer: %q %v", data, err)
	}
	// The agent's binary cannot be changed by the box.
	if res := sh(t, b, "echo x >> /dev/.den/den || rm -f /dev/.den/den"); res.Exit.ExitCode == 0 {
		t.Fatal("the box modified the agent's binary")
	}
}
