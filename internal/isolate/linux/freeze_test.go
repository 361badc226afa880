package linux

import (
	"bytes"
	"context"
	"fmt"
	"github.com/den-dev/den/internal/host"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/isolate"
)

// A paused box uses no CPU and its agent does not answer; resumed, it
// runs on where it was.
func TestPauseResume(t *testing.T) {
	rt := newRuntime(t)
	if rt.cg.V2 {
		t.Log("cgroup v2 host")
	}
	ctx := context.Background()
	spec := testSpec(t, rt, "t1pause")
	defer rt.Destroy(ctx, spec)
	b := startBox(t, rt, spec)
	p := b.(isolate.Pauser)
	ag := b.Agent()
	sh(t, ag, "", "(while :; do :; done) </dev/null >/dev/null 2>&1 &")
	cpu := func() time.Duration { return rt.cg.Usage(spec.ID).CPU }
	// running reports whether the box uses 20 ms of CPU within 2 s (the
	// host may be busy).
	running := func() bool {
		c0 := cpu()
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if cpu()-c0 >= 20*time.Millisecond {
				return true
			}
		}
		return false
	}
	if !running() {
		t.Fatal("the busy loop does not run")
	}

	// A sleep started before the pause finishes after it.
	type result struct {
		out  string
		code int
	}
	slept := make(chan result, 1)
	go func() {
		out, _, st := runSpec(t, ag, &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", "sleep 0.3; echo slept"}})
		slept <- result{out, st.ExitCode}
	}()
	time.Sleep(50 * time.Millisecond)

	start := time.Now()
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("Pause took %v", time.Since(start))
	if err := p.Pause(ctx); err != nil { // idempotent
		t.Fatal(err)
	}
	c0 := cpu()
	time.Sleep(200 * time.Millisecond)
	if c1 := cpu(); c1 != c0 {
		t.Errorf("a paused box used %v of CPU in 200 ms", c1-c0)
	}
	pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if err := ag.Ping(pctx); err == nil {
		t.Error("the agent of a paused box answered")
	}
	cancel()
	select {
	case r := <-slept:
		t.Fatalf("the sleep ended while paused: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}
	// A reattaching daemon finds the box paused, not dead.
	if _, err := rt.Load(ctx, spec, b.Pid()); err != nil {
		t.Errorf("Load of a paused box: %v", err)
	}

	start = time.Now()
	if err := p.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("Resume took %v", time.Since(start))
	if err := p.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	pctx, cancel = context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := ag.Ping(pctx); err != nil {
		t.Fatalf("agent after Resume: %v", err)
	}
	select {
	case r := <-slept:
		if r.out != "slept\n" || r.code != 0 {
			t.Errorf("the sleep after Resume: %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the sleep did not finish after Resume")
	}
	if !running() {
		t.Error("the busy loop does not run on after Resume")
	}

	// Pause and Resume in a row, with the busy loop running, keep working
	// (how long they take is BenchmarkPauseResume's to say).
	for i := 0; i < 20; i++ {
		if err := p.Pause(ctx); err != nil {
			t.Fatalf("pause %d: %v", i, err)
		}
		if err := p.Resume(ctx); err != nil {
			t.Fatalf("resume %d: %v", i, err)
		}
	}
	if !running() {
		t.Error("the busy loop does not run on after 20 rounds of Pause and Resume")
	}

	// Stop works on a paused box.
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := b.Stop(sctx); err != nil {
		t.Fatalf("Stop of a paused box: %v", err)
	}
}

// BenchmarkPauseResume measures one Pause and one Resume of an idle box.
func BenchmarkPauseResume(b *testing.B) {
	rt := newRuntime(b)
	ctx := context.Background()
	spec := testSpec(b, rt, "benchpause")
	defer rt.Destroy(ctx, spec)
	box, err := rt.Start(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	defer box.Stop(ctx)
	p := box.(isolate.Pauser)
	for i := 0; i < b.N; i++ {
		if err := p.Pause(ctx); err != nil {
			b.Fatal(err)
		}
		if err := p.Resume(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// The v2 freezer, on the real kernel: a hybrid host's (controller-less)
// cgroup2 hierarchy has cgroup.freeze in every group. A pure v2 host runs
// TestPauseResume on v2 instead.
func TestFreezeV2Kernel(t *testing.T) {
	needRoot(t)
	root := "/sys/fs/cgroup/unified"
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		t.Skip("no hybrid cgroup2 hierarchy at " + root)
	}
	cg := &cgroups{CgroupView: host.CgroupView{V2: true, Root: root, Parent: "den-test"}}
	d := cg.dir("spin", "")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(filepath.Dir(d))
	defer cg.Remove("spin")
	cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	defer cg.Kill("spin")
	if err := cg.Add("spin", cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	// CPU time of the process in clock ticks (utime + stime).
	ticks := func() int {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		u, _ := strconv.Atoi(f[11])
		s, _ := strconv.Atoi(f[12])
		return u + s
	}
	ctx := context.Background()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if err := cg.Freeze(ctx, "spin", true); err != nil {
		t.Fatal(err)
	}
	t.Logf("v2 freeze took %v", time.Since(start))
	t0 := ticks()
	time.Sleep(200 * time.Millisecond)
	if t1 := ticks(); t1 != t0 {
		t.Errorf("a frozen process used %d ticks in 200 ms", t1-t0)
	}
	start = time.Now()
	if err := cg.Freeze(ctx, "spin", false); err != nil {
		t.Fatal(err)
	}
	t.Logf("v2 thaw took %v", time.Since(start))
	t0 = ticks()
	time.Sleep(200 * time.Millisecond)
	if t1 := ticks(); t1-t0 < 2 {
		t.Errorf("a thawed process used %d ticks in 200 ms", t1-t0)
	}
	// Killing a frozen group works.
	cg.Freeze(ctx, "spin", true)
	cg.Kill("spin")
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a killed frozen process did not end")
	}
}
