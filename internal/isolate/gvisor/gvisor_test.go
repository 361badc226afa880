package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/host"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/isolate/isolatetest"
	"github.com/den-dev/den/internal/storage"
	"github.com/den-dev/den/internal/testenv"
	"github.com/vishvananda/netlink"
)

func TestMain(m *testing.M) {
	if IsAgent(os.Args[1:]) {
		AgentMain()
	}
	code := m.Run()
	// The parent group runsc made for the tests' boxes.
	if os.Geteuid() == 0 {
		cg := detectCgroups("/sys/fs/cgroup", testCgroup)
		if cg.V2 {
			os.Remove(filepath.Join(cg.Root, testCgroup))
		} else if ents, err := os.ReadDir(cg.Root); err == nil {
			for _, e := range ents {
				os.Remove(filepath.Join(cg.Root, e.Name(), testCgroup))
			}
		}
		os.Remove("/run/den-test-gvisor")
	}
	os.Exit(code)
}

// needRunsc skips when the host has no runsc (testenv.Tier) and fails
// when den cannot run the runsc it has.
func needRunsc(t testing.TB) {
	t.Helper()
	testenv.Tier(t, "gvisor")
	if in := Detect(testRunsc); !in.Available {
		testenv.Unavailable(t, "gvisor", in.Reason)
	}
}

const testCgroup = "den-test-gvisor"

// testRunsc is the runsc the tests use: $DEN_RUNSC (as den serve --runsc),
// else runsc on PATH.
var testRunsc = os.Getenv("DEN_RUNSC")

func testRunDir(t testing.TB) string {
	return filepath.Join("/run/den-test-gvisor", strings.ReplaceAll(t.Name(), "/", "_"))
}

// newRuntime makes a runtime with a run directory of the test's own,
// removed (after every box of the test is gone) at the end.
func newRuntime(t testing.TB) *Runtime {
	t.Helper()
	needRunsc(t)
	dir := testRunDir(t)
	rt, err := New(Config{RunDir: dir, Runsc: testRunsc, Platform: os.Getenv("DEN_GVISOR_PLATFORM"), CgroupParent: testCgroup})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cleanupRoot(rt.info.Runsc, rt.state)
		if _, err := storage.UnmountUnder(dir); err != nil {
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
	if ms := storage.MountsUnder(rt.boxRun(id)); len(ms) > 0 {
		out = append(out, "mounts "+strings.Join(ms, " "))
	}
	if _, err := os.Stat(rt.boxRun(id)); err == nil {
		out = append(out, "run dir")
	}
	if _, err := os.Stat(rt.cg.Dir(id, "memory")); err == nil {
		out = append(out, "cgroup")
	}
	return out
}

func TestDetect(t *testing.T) {
	in := Detect(testRunsc)
	t.Logf("%+v", in)
	if testenv.Missing("gvisor") == "" && !in.Available {
		testenv.Unavailable(t, "gvisor", in.Reason)
	}
	if in.Runsc != "" && (in.Version == "" || in.Version == "VERSION_MISSING") {
		t.Fatalf("runsc found but no version: %+v", in)
	}
	if in.Available && in.Platform == "" {
		t.Fatalf("no platform chosen: %+v", in)
	}
	if bad := Detect("/nonexistent/runsc"); bad.Available || !strings.Contains(bad.Reason, "runsc not found") {
		t.Fatalf("missing runsc: %+v", bad)
	}
	// A dynamically linked runsc (go install with cgo) cannot re-execute
	// itself in gVisor's empty chroot: refused, saying how to rebuild.
	if dyn, _ := exec.LookPath("true"); dyn != "" && elfInterp(dyn) != "" {
		if bad := Detect(dyn); bad.Available || !strings.Contains(bad.Reason, "dynamically linked") || !strings.Contains(bad.Reason, "CGO_ENABLED=0") {
			t.Fatalf("dynamic runsc: %+v", bad)
		}
	}
	if elfInterp("/nonexistent") != "" {
		t.Fatal("a missing file has a loader")
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

func TestStopStartKeepsFiles(t *testing.T) {
	rt := newRuntime(t)
	spec := testSpec(t, "gstop")
	ctx := ctxT(t, 2*time.Minute)
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Destroy(context.Background(), spec) })
	mustSh(t, b, "echo kept > /root/file && mkdir -p /srv && echo o > /srv/owned && chown 1000:1000 /srv/owned")
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	if l := leftovers(rt, spec.ID); len(l) > 0 {
		t.Fatalf("left after Stop: %v", l)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(spec.Dir, "upper/root/root/file"), &st); err != nil || st.Uid != 0 || st.Gid != 0 {
		t.Fatalf("a file root made is %d:%d on disk (%v), want 0:0", st.Uid, st.Gid, err)
	}
	b2, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatalf("start again: %v", err)
	}
	defer b2.Stop(context.Background())
	if out := mustSh(t, b2, "cat /root/file; busybox stat -c %u:%g /srv/owned"); out != "kept\n1000:1000\n" {
		t.Fatalf("after a restart: %q", out)
	}
}

func TestMountsAndLimits(t *testing.T) {
	rt := newRuntime(t)
	spec := testSpec(t, "glimits")
	vol, ro := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(ro, "f"), []byte("ro\n"), 0o644)
	spec.Mounts = []isolate.Mount{
		{Source: vol, Target: "/data/vol"},
		{Source: ro, Target: "/data/vol/ro", ReadOnly: true},
	}
	spec.Limits = isolate.Limits{Memory: 128 << 20, CPUs: 0.5, Pids: 100}
	b := start(t, rt, spec)
	mustSh(t, b, "echo w > /data/vol/w && cat /data/vol/ro/f")
	if data, err := os.ReadFile(filepath.Join(vol, "w")); err != nil || string(data) != "w\n" {
		t.Fatalf("volume write: %q %v", data, err)
	}
	if res := sh(t, b, "echo x > /data/vol/ro/g"); res.Exit.ExitCode == 0 {
		t.Fatal("wrote through a read-only mount")
	}
	// gVisor's kernel sizes its memory by the limit.
	out := mustSh(t, b, "grep MemTotal /proc/meminfo")
	t.Logf("%s", out)
	if f := strings.Fields(out); len(f) < 2 || f[1] != strconv.Itoa(128<<10) {
		t.Errorf("MemTotal inside = %q, want the 128 MiB limit", out)
	}
	cgFile := func(c, f string) string {
		data, _ := os.ReadFile(filepath.Join(rt.cg.Dir(spec.ID, c), f))
		return strings.TrimSpace(string(data))
	}
	if got := cgFile("memory", "memory.limit_in_bytes"); !rt.cg.V2 && got != strconv.Itoa(128<<20) {
		t.Errorf("memory limit %q", got)
	}
	if err := b.SetLimits(isolate.Limits{Memory: 192 << 20, CPUs: 1, Pids: 200}); err != nil {
		t.Fatal(err)
	}
	if !rt.cg.V2 {
		if got := cgFile("memory", "memory.limit_in_bytes"); got != strconv.Itoa(192<<20) {
			t.Errorf("memory limit after SetLimits %q", got)
		}
		if got := cgFile("cpu", "cpu.cfs_quota_us"); got != "100000" {
			t.Errorf("cpu quota after SetLimits %q", got)
		}
	}
	st, err := b.(isolate.Statser).Stats()
	if err != nil || st.CPU <= 0 || st.Memory <= 0 {
		t.Fatalf("stats %+v %v", st, err)
	}
	t.Logf("stats %+v", st)
	// A command that allocates far beyond the limit: gVisor's kernel
	// (this runsc) has no OOM killer of its own, so the host's kills the
	// sandbox, and the whole box ends (counted by OOMKills).
	sh := func(script string) (isolatetest.Result, error) {
		return isolatetest.Exec(ctxT(t, time.Minute), b.Agent(), &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", script}})
	}
	res, err := sh("head -c 400m /dev/zero | tail > /dev/null; echo done")
	t.Logf("memory hog: exit %+v stdout %q stderr %q (%v), OOM kills %d", res.Exit, res.Stdout, res.Stderr, err, b.OOMKills())
	select {
	case <-b.Done():
		if b.OOMKills() == 0 {
			t.Fatal("the box died of a command's memory use, and no OOM kill is counted")
		}
		t.Logf("the box ended with its memory limit exceeded")
		return
	case <-time.After(time.Second):
	}
	if out := mustSh(t, b, "echo alive"); out != "alive\n" {
		t.Fatal(out)
	}
}

func TestPauseResume(t *testing.T) {
	rt := newRuntime(t)
	b := start(t, rt, testSpec(t, "gpause"))
	p := b.(isolate.Pauser)
	ctx := ctxT(t, time.Minute)
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := isolatetest.Exec(short, b.Agent(), &agent.ExecSpec{Argv: []string{"true"}})
	cancel()
	if err == nil {
		t.Fatal("a paused box answered")
	}
	if err := p.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	mustSh(t, b, "true")
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatalf("stop of a paused box: %v", err)
	}
}

// startCounter starts a background shell loop counting in /tmp/n.
func startCounter(t testing.TB, b isolate.Box) {
	t.Helper()
	var st struct{ ID string }
	if err := b.Agent().JSON(ctxT(t, time.Minute), "POST", agent.PathProcs, nil, &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done"}}, &st); err != nil {
		t.Fatal(err)
	}
}

func counter(t testing.TB, b isolate.Box) int {
	t.Helper()
	n, _ := strconv.Atoi(strings.TrimSpace(mustSh(t, b, "cat /tmp/n 2>/dev/null || echo 0")))
	return n
}

func waitCounter(t testing.TB, b isolate.Box, want int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := counter(t, b)
		if n >= want {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("counter stuck at %d, want %d", n, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestCheckpointRestore(t *testing.T) {
	rt := newRuntime(t)
	spec := testSpec(t, "gckpt")
	ctx := ctxT(t, 3*time.Minute)
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Destroy(context.Background(), spec) })
	startCounter(t, b)
	// The shell's own variable (memory state, not the file) carries on.
	mustSh(t, b, "echo before > /root/file")
	n0 := waitCounter(t, b, 5)
	dir := filepath.Join(t.TempDir(), "ckpt")
	t0 := time.Now()
	if err := rt.Checkpoint(ctx, b, dir+"-live", true); err != nil {
		t.Fatalf("checkpoint, keep running: %v", err)
	}
	t.Logf("checkpoint (keep running) took %v", time.Since(t0))
	n1 := waitCounter(t, b, n0+3)
	t0 = time.Now()
	if err := rt.Checkpoint(ctx, b, dir, false); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	t.Logf("checkpoint took %v", time.Since(t0))
	select {
	case <-b.Done():
	default:
		t.Fatal("the box runs on after a checkpoint that stops it")
	}
	if l := leftovers(rt, spec.ID); len(l) > 0 {
		t.Fatalf("left after a checkpoint: %v", l)
	}
	// Clobber the counter file: only the shell's memory knows the count.
	os.WriteFile(filepath.Join(spec.Dir, "upper/root/tmp/n"), []byte("0\n"), 0o644)
	t0 = time.Now()
	r, err := rt.Restore(ctx, spec, dir)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	t.Logf("restore took %v", time.Since(t0))
	defer r.Stop(context.Background())
	n2 := waitCounter(t, r, n1+1)
	if n2 < n1 || n2 > n1+200 {
		t.Fatalf("counter after restore %d, before %d", n2, n1)
	}
	if out := mustSh(t, r, "cat /root/file"); out != "before\n" {
		t.Fatalf("file after restore %q", out)
	}
	// The restored box checkpoints again, and the live checkpoint's image
	// restores as a second box (a fork) with its own storage.
	fork := testSpec(t, "gfork")
	if err := os.CopyFS(fork.Dir, os.DirFS(spec.Dir)); err != nil {
		t.Fatal(err)
	}
	fork.Layers = spec.Layers
	f, err := rt.Restore(ctx, fork, dir+"-live")
	if err != nil {
		t.Fatalf("restore a fork: %v", err)
	}
	defer rt.Destroy(context.Background(), fork)
	defer f.Stop(context.Background())
	if n := waitCounter(t, f, 1); n < n0 {
		t.Fatalf("fork counter %d, want at least %d", n, n0)
	}
	mustSh(t, f, "echo fork > /root/file")
	if out := mustSh(t, r, "cat /root/file"); out != "before\n" {
		t.Fatalf("the fork wrote into the original: %q", out)
	}
}

func TestLoadAfterRestart(t *testing.T) {
	rt := newRuntime(t)
	spec := testSpec(t, "gload")
	ctx := ctxT(t, 2*time.Minute)
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Destroy(context.Background(), spec) })
	startCounter(t, b)
	n := waitCounter(t, b, 3)
	pid := b.Pid()
	// A new daemon: a new runtime on the same run directory; the old
	// box object is dropped without Stop (its link just goes away).
	b.(*box).link.Close()
	rt2, err := New(Config{RunDir: testRunDir(t), Runsc: testRunsc, CgroupParent: testCgroup})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt2.Load(ctx, testSpec(t, "gnone"), pid); err == nil {
		t.Fatal("Load accepted another box's sandbox")
	}
	l, err := rt2.Load(ctx, spec, pid)
	if err != nil {
		t.Fatal(err)
	}
	if m := waitCounter(t, l, n+2); m < n {
		t.Fatal(m)
	}
	// Loaded while paused: the agent answers after Resume.
	if err := l.(isolate.Pauser).Pause(ctx); err != nil {
		t.Fatal(err)
	}
	l.(*box).link.Close()
	rt3, err := New(Config{RunDir: testRunDir(t), Runsc: testRunsc, CgroupParent: testCgroup})
	if err != nil {
		t.Fatal(err)
	}
	l3, err := rt3.Load(ctx, spec, pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := l3.(isolate.Pauser).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	mustSh(t, l3, "true")
	if err := l3.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(rt3, spec.ID); len(left) > 0 {
		t.Fatalf("left after Stop: %v", left)
	}
}

func TestSandboxKilled(t *testing.T) {
	rt := newRuntime(t)
	spec := testSpec(t, "gkill")
	ctx := ctxT(t, time.Minute)
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Destroy(context.Background(), spec) })
	syscall.Kill(b.Pid(), syscall.SIGKILL)
	select {
	case <-b.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the sandbox was killed")
	}
	if _, err := isolatetest.Exec(ctx, b.Agent(), &agent.ExecSpec{Argv: []string{"true"}}); err == nil {
		t.Fatal("exec in a dead box succeeded")
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(rt, spec.ID); len(l) > 0 {
		t.Fatalf("left after Stop: %v", l)
	}
	// A box whose daemon died too: Destroy cleans it all up.
	b2, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	b2.(*box).link.Close()
	if err := rt.Destroy(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(rt, spec.ID); len(l) > 0 {
		t.Fatalf("left after Destroy: %v", l)
	}
	if _, err := os.Stat(spec.Dir); !os.IsNotExist(err) {
		t.Fatalf("storage left: %v", err)
	}
}

func TestStartFails(t *testing.T) {
	rt := newRuntime(t)
	ctx := ctxT(t, time.Minute)
	spec := testSpec(t, "gfail")
	spec.Layers[1].Lowers = []string{"/nonexistent/layer"}
	if _, err := rt.Start(ctx, spec); err == nil {
		t.Fatal("started with a missing layer")
	} else {
		t.Logf("missing layer: %v", err)
	}
	if l := leftovers(rt, spec.ID); len(l) > 0 {
		t.Fatalf("left after a failed start: %v", l)
	}
	// runsc itself fails: a mount target it cannot make.
	spec = testSpec(t, "gfail2")
	spec.Mounts = []isolate.Mount{{Source: t.TempDir(), Target: "/proc/self/den"}}
	if _, err := rt.Start(ctx, spec); err == nil {
		t.Fatal("started with a mount over /proc/self")
	} else {
		t.Logf("runsc failure: %v", err)
	}
	if l := leftovers(rt, spec.ID); len(l) > 0 {
		t.Fatalf("left after a failed start: %v", l)
	}
}

// busyboxSpec is a box whose /usr is the host's with a busybox (the
// host's static one) and a link per applet over its programs: the
// conformance suite's commands. The host's libraries stay for a test
// binary linked dynamically. (Debian's
// coreutils 9 call statx with AT_NO_AUTOMOUNT, which Debian's 2022 runsc
// refuses with EINVAL: ls and stat of the host's /usr fail inside; see
// TestCoreutils.)
func busyboxSpec(t *testing.T, usr, id string) *isolate.Spec {
	spec := testSpec(t, id)
	spec.Layers[1].Lowers = []string{"/usr", usr}
	return spec
}

func busyboxUsr(t *testing.T) string {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox")
	}
	usr := filepath.Join(t.TempDir(), "usr")
	bin := filepath.Join(usr, "bin")
	os.MkdirAll(bin, 0o755)
	os.Symlink("bin", filepath.Join(usr, "sbin"))
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" {
			os.Symlink("busybox", filepath.Join(bin, a))
		}
	}
	return usr
}

// Debian's coreutils in a box: their statx with AT_NO_AUTOMOUNT fails
// with EINVAL on Debian's 2022 runsc (known, logged), and works on a
// current one (which SavesTCP tells apart).
func TestCoreutils(t *testing.T) {
	rt := newRuntime(t)
	if _, err := os.Stat("/usr/bin/stat"); err != nil {
		t.Skip("no coreutils stat on the host")
	}
	b := start(t, rt, testSpec(t, "gcoreutils"))
	res := sh(t, b, "/usr/bin/stat -c '%F %u' /usr/bin && /usr/bin/ls -d /usr/bin")
	if !rt.info.SavesTCP {
		t.Logf("runsc %s: exit %+v, stderr %q", rt.info.Version, res.Exit, res.Stderr)
		if res.Exit.ExitCode == 0 {
			t.Errorf("Debian's 2022 runsc was expected to refuse coreutils' statx: update the docs")
		}
		return
	}
	if res.Exit.ExitCode != 0 || res.Stdout != "directory 0\n/usr/bin\n" {
		t.Fatalf("runsc %s: exit %+v, stdout %q, stderr %q", rt.info.Version, res.Exit, res.Stdout, res.Stderr)
	}
}

func TestConformance(t *testing.T) {
	rt := newRuntime(t)
	usr := busyboxUsr(t)
	isolatetest.Run(t, isolatetest.Harness{
		Runtime: rt,
		Spec:    func(t *testing.T, id string) *isolate.Spec { return busyboxSpec(t, usr, id) },
	})
}

// A networked box: gVisor's netstack on the box's eth0 in the pinned
// namespace, den's nft rules sending its TCP to the egress port.
func TestNetwork(t *testing.T) {
	needRunsc(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nftables")
	}
	id := os.Getpid() % 200
	cfg := host.NetworkConfig{
		Bridge: fmt.Sprintf("dengv%d", id), Table: fmt.Sprintf("dengv%d", id),
		Subnet:      netip.MustParsePrefix(fmt.Sprintf("10.231.%d.0/24", id)),
		Transparent: 18080 + id, DNS: 18300 + id, HTTPProxy: 18600 + id,
	}
	t.Cleanup(func() {
		exec.Command("nft", "delete", "table", "inet", cfg.Table).Run()
		if l, err := netlink.LinkByName(cfg.Bridge); err == nil {
			netlink.LinkDel(l)
		}
	})
	n, err := host.NewNetwork(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The egress proxy's stand-in: says who connected, and closes when the
	// client has (busybox nc shuts its side down at the end of its stdin).
	ln, err := net.Listen("tcp", netip.AddrPortFrom(n.Gateway(), uint16(cfg.Transparent)).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(time.Minute))
				fmt.Fprintf(c, "from %s\n", c.RemoteAddr().(*net.TCPAddr).IP)
				io.Copy(io.Discard, c)
			}()
		}
	}()
	dir := testRunDir(t)
	rt, err := New(Config{RunDir: dir, Runsc: testRunsc, CgroupParent: testCgroup, Network: n})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { storage.UnmountUnder(dir); os.RemoveAll(dir) })
	spec := testSpec(t, "gnet")
	spec.Net, spec.NetSlot, spec.NetBandwidth = true, 3, 10<<20
	b := start(t, rt, spec)
	addr, _ := n.Addr(3)
	// A checkpoint that keeps the box running keeps its network.
	if err := rt.Checkpoint(ctxT(t, time.Minute), b, filepath.Join(t.TempDir(), "ck"), true); err != nil {
		t.Fatal(err)
	}
	out := mustSh(t, b, "cat /proc/net/dev | grep -c eth0; busybox nc 192.0.2.1 80 </dev/null")
	if want := fmt.Sprintf("1\nfrom %s\n", addr); out != want {
		t.Fatalf("inside: %q, want %q", out, want)
	}
	st, err := b.(isolate.Statser).Stats()
	if err != nil || st.NetRxBytes == 0 || st.NetTxBytes == 0 {
		t.Fatalf("network stats %+v %v", st, err)
	}
	// Debian's 2022 runsc cannot save a TCP connection over eth0 (even
	// one just closed, at times): the checkpoint fails, says why, and the
	// box ends. A current runsc saves it, and the box runs on with its
	// network. A connection held open makes the case certain.
	mustSh(t, b, "(sleep 30 | busybox nc 192.0.2.1 80 >/dev/null 2>&1 &); sleep 0.5; grep -c ':0050 01 ' /proc/net/tcp")
	err = rt.Checkpoint(ctxT(t, time.Minute), b, filepath.Join(t.TempDir(), "ck2"), true)
	switch {
	case rt.info.SavesTCP && err != nil:
		t.Fatalf("runsc %s should save a box that had a TCP connection: %v", rt.info.Version, err)
	case rt.info.SavesTCP:
		if out := mustSh(t, b, "busybox nc 192.0.2.1 80 </dev/null"); out != fmt.Sprintf("from %s\n", addr) {
			t.Fatalf("after a checkpoint with a connection: %q", out)
		}
	case err == nil:
		t.Fatalf("runsc %s saved a box that had a TCP connection: SavesTCP is wrong", rt.info.Version)
	case !strings.Contains(err.Error(), "connected state"):
		t.Errorf("the error does not say why: %v", err)
	}
	// A box without network has loopback only.
	lo := start(t, rt, testSpec(t, "gnonet"))
	if res := sh(t, lo, "busybox nc -w 2 192.0.2.1 80 </dev/null"); res.Exit.ExitCode == 0 {
		t.Fatalf("a box without network connected: %+v", res)
	}
	veth := func() bool {
		links, _ := netlink.LinkList()
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, "d") && l.Attrs().MasterIndex != 0 {
				if br, err := netlink.LinkByIndex(l.Attrs().MasterIndex); err == nil && br.Attrs().Name == cfg.Bridge {
					return true
				}
			}
		}
		return false
	}
	if !veth() {
		t.Fatal("no veth on the bridge while the box runs")
	}
	if err := b.Stop(ctxT(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	if veth() {
		t.Fatal("the box's veth outlived its Stop")
	}
	if l := leftovers(rt, spec.ID); len(l) > 0 {
		t.Fatalf("left after Stop: %v", l)
	}
	// A fork restored from a checkpoint of a networked box gets its own
	// slot's address.
	src := testSpec(t, "gnetsrc")
	src.Net, src.NetSlot = true, 6
	sb := start(t, rt, src)
	ck := filepath.Join(t.TempDir(), "fork")
	if err := rt.Checkpoint(ctxT(t, time.Minute), sb, ck, false); err != nil {
		t.Fatal(err)
	}
	fork := testSpec(t, "gnetfork")
	fork.Net, fork.NetSlot = true, 7
	os.RemoveAll(fork.Dir)
	if out, err := exec.Command("cp", "-a", src.Dir, fork.Dir).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { rt.Destroy(context.Background(), fork) })
	fb, err := rt.Restore(ctxT(t, time.Minute), fork, ck)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Stop(context.Background())
	faddr, _ := n.Addr(7)
	if out := mustSh(t, fb, "busybox nc 192.0.2.1 80 </dev/null"); out != fmt.Sprintf("from %s\n", faddr) {
		t.Fatalf("the fork connects as %q, want from %s", out, faddr)
	}
}

// BenchmarkWorkload times workloads run in one box through the agent, on
// the platform den picks or $DEN_GVISOR_PLATFORM, with runsc from
// $DEN_RUNSC or PATH: where systrap's cheaper system calls show.
func BenchmarkWorkload(b *testing.B) {
	rt := newRuntime(b)
	box := start(b, rt, testSpec(b, "gbench"))
	b.Logf("runsc %s, platform %s", rt.info.Version, rt.info.Platform)
	for _, w := range []struct{ name, script string }{
		{"exec-true", "true"},
		{"syscalls-20k", "dd if=/dev/zero of=/dev/null bs=1 count=10000 2>/dev/null"},
		{"fork-exec-20", "i=0; while [ $i -lt 20 ]; do /bin/true; i=$((i+1)); done"},
		{"files-find-usr-share", "find /usr/share -xdev >/dev/null 2>&1; true"},
	} {
		b.Run(w.name, func(b *testing.B) {
			for b.Loop() {
				mustSh(b, box, w.script)
			}
		})
	}
}

// TestMeasure reports start and checkpoint times (DEN_GVISOR_MEASURE=1).
func TestMeasure(t *testing.T) {
	if os.Getenv("DEN_GVISOR_MEASURE") == "" {
		t.Skip("set DEN_GVISOR_MEASURE=1")
	}
	rt := newRuntime(t)
	ctx := ctxT(t, 5*time.Minute)
	spec := testSpec(t, "gmeasure")
	const n = 5
	var start, stop time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		b, err := rt.Start(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := isolatetest.Exec(ctx, b.Agent(), &agent.ExecSpec{Argv: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
		start += time.Since(t0)
		t0 = time.Now()
		b.Stop(ctx)
		stop += time.Since(t0)
	}
	t.Logf("den Start until an exec of true answered: %v (Stop %v)", start/n, stop/n)
	// The same root, raw: runsc run of /bin/true.
	if err := rt.prepare(spec); err != nil {
		t.Fatal(err)
	}
	run := rt.boxRun(spec.ID)
	cfg, _ := os.ReadFile(filepath.Join(run, "config.json"))
	cfg = []byte(strings.Replace(string(cfg), `"/dev/.den/den",`+"\n\t\t\t\""+agentArg+`"`, `"/bin/true"`, 1))
	os.WriteFile(filepath.Join(run, "config.json"), cfg, 0o600)
	var raw time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		out, err := exec.Command(rt.info.Runsc, append(rt.globalFlags(), "--network=none", "run", "--bundle", run, "raw"+strconv.Itoa(i))...).CombinedOutput()
		if err != nil {
			t.Fatalf("raw runsc run: %v %s", err, out)
		}
		raw += time.Since(t0)
		exec.Command(rt.info.Runsc, "--root", rt.state, "delete", "--force", "raw"+strconv.Itoa(i)).Run()
	}
	t.Logf("raw runsc run of /bin/true on the same root: %v", raw/n)
	rt.clean(ctx, spec)
	// Checkpoint and restore of an idle box.
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	mustSh(t, b, "true")
	var ck, rs time.Duration
	for i := 0; i < n; i++ {
		dir := filepath.Join(t.TempDir(), "ck")
		t0 := time.Now()
		if err := rt.Checkpoint(ctx, b, dir, false); err != nil {
			t.Fatal(err)
		}
		ck += time.Since(t0)
		t0 = time.Now()
		if b, err = rt.Restore(ctx, spec, dir); err != nil {
			t.Fatal(err)
		}
		if _, err := isolatetest.Exec(ctx, b.Agent(), &agent.ExecSpec{Argv: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
		rs += time.Since(t0)
		if i == 0 {
			var size int64
			filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
				if fi, err := d.Info(); err == nil && !d.IsDir() {
					size += fi.Size()
				}
				return nil
			})
			t.Logf("checkpoint image: %d KiB", size>>10)
		}
	}
	b.Stop(ctx)
	t.Logf("idle box: checkpoint %v, restore until an exec answered %v, total %v", ck/n, rs/n, (ck+rs)/n)
}

// TestReapsSandboxes: the daemon is the subreaper of the sandboxes and
// gofers runsc leaves behind, and reaps them as soon as they exit, so a
// stop does not wait for the host's init.
func TestReapsSandboxes(t *testing.T) {
	rt := newRuntime(t)
	if rt.reap == nil {
		t.Skip("this process cannot be a child subreaper")
	}
	ctx := ctxT(t, 2*time.Minute)
	spec := testSpec(t, "greap")
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	pid := rt.sandboxPid(spec.ID)
	if pid == 0 {
		t.Fatal("no sandbox pid after Start")
	}
	// runsc's sandbox is adopted by this process, its subreaper.
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("\nPPid:\t%d\n", os.Getpid()); !strings.Contains(string(st), want) {
		t.Fatalf("sandbox %d is not this process's child:\n%s", pid, st)
	}
	deadline := time.Now().Add(10 * time.Second)
	t0 := time.Now()
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop took %v", time.Since(t0))
	for {
		var zombies []int
		for _, c := range children() {
			if comm, f, err := host.ProcStat(c); err == nil && comm == "exe" && len(f) > 0 && f[0] == "Z" {
				zombies = append(zombies, c)
			}
		}
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		if len(zombies) == 0 && os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			for _, z := range zombies {
				st, _ := os.ReadFile("/proc/" + strconv.Itoa(z) + "/status")
				t.Logf("zombie %d: %s", z, st)
			}
			t.Fatalf("after Stop: sandbox %d still in /proc (%v), zombie children %v", pid, err, zombies)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A fork bomb in a box with a pids limit is contained as in the linux
// tier: its forks fail inside (EAGAIN), and the box and its agent stay up.
func TestForkBombContained(t *testing.T) {
	rt := newRuntime(t)
	// Containment rests on the sentry enforcing RLIMIT_NPROC. Debian's
	// runsc of 2022-12-19 does not (measured: 150 sleeps under a limit of
	// 132 all started, and the host backstop then ended the sandbox);
	// the runsc scripts/deps.sh builds (2026-09-05) does. Where between
	// them it came is not known: the test skips only runsc from before 2023.
	if in := Detect(testRunsc); runscBefore(in.Version, "20230101") {
		t.Skipf("runsc %s does not enforce RLIMIT_NPROC: a fork bomb ends its sandbox (scripts/deps.sh builds a current runsc)", in.Version)
	}
	spec := busyboxSpec(t, busyboxUsr(t), "gbomb")
	spec.Limits = isolate.Limits{Pids: 100, Memory: 256 << 20}
	b := start(t, rt, spec)
	res, err := isolatetest.Exec(ctxT(t, time.Minute), b.Agent(), &agent.ExecSpec{Timeout: 5 * time.Second, Argv: []string{"/bin/sh", "-c",
		`b() { b | b & }; b 2>>/tmp/bomb.err; while :; do b 2>>/tmp/bomb.err; sleep 0.01; done`}})
	t.Logf("bomb: %+v %v", res.Exit, err)
	if err != nil {
		t.Fatalf("the bomb's exec: %v", err)
	}
	// The bomb's shell may have ended (a failed fork ends sh) and left
	// its tree forking: a kill of the finished command ends it.
	if err := b.Agent().JSON(ctxT(t, time.Minute), "POST", agent.ProcPath(res.Proc.ID, agent.ProcSignal), nil, api.SignalRequest{}, nil); err != nil && !errors.Is(err, api.ErrConflict) {
		t.Fatalf("kill what the bomb left: %v", err)
	}
	select {
	case <-b.Done():
		t.Fatal("the fork bomb ended the box")
	default:
	}
	if out := mustSh(t, b, "echo alive"); out != "alive\n" {
		t.Fatalf("after the bomb: %q", out)
	}
	// The bomb did reach the limit: its forks failed.
	if out := mustSh(t, b, "grep -c 'fork' /tmp/bomb.err || true"); strings.TrimSpace(out) == "0" {
		t.Fatalf("the bomb never failed to fork (%q): the limit was not reached", out)
	}
	if b.OOMKills() != 0 {
		t.Errorf("%d OOM kills during a fork bomb", b.OOMKills())
	}
	// A new limit (a pooled box claimed with other limits) reaches the
	// commands started after it.
	if got := strings.TrimSpace(mustSh(t, b, "ulimit -u")); got != strconv.Itoa(100+procsReserve) {
		t.Fatalf("commands' process limit %s, want %d", got, 100+procsReserve)
	}
	if err := b.SetLimits(isolate.Limits{Pids: 50, Memory: 256 << 20}); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(mustSh(t, b, "ulimit -u")); got != strconv.Itoa(50+procsReserve) {
		t.Fatalf("commands' process limit after SetLimits %s, want %d", got, 50+procsReserve)
	}
}

// runscBefore reports whether a runsc version names a build date before
// day (YYYYMMDD): Debian's "0.0~20221219.0" or a go install's
// "v0.0.0-20260905035102-160fafc42237". Versions without a date are not
// before anything.
func runscBefore(version, day string) bool {
	m := regexp.MustCompile(`(?:~|v0\.0\.0-)(\d{8})`).FindStringSubmatch(version)
	return m != nil && m[1] < day
}
