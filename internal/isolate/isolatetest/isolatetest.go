// Package isolatetest is the conformance suite every isolation tier runs:
// the behaviour den's manager relies on, checked the same way for linux
// namespaces, gVisor and microVMs. A tier's test calls Run with its
// runtime and a spec builder; optional abilities (pause, checkpoint,
// stats, dial) are tested when the tier's boxes have them.
//
// The commands used are busybox applets (sh, echo, cat, sleep, id,
// hostname, ls, wc, cut, stat, grep, ln), so a tier may test with a busybox
// root.
package isolatetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/isolate"
)

// Harness is what a tier gives the suite.
type Harness struct {
	Runtime isolate.Runtime
	// Spec returns the spec of a new box named id (unique per call): a
	// root filesystem with a shell and the busybox applets above, its
	// Dir in a fresh temporary directory, and no network.
	Spec func(t *testing.T, id string) *isolate.Spec
	// Timeout bounds each step (default 60 s; a TCG-emulated VM boots in
	// seconds).
	Timeout time.Duration
}

// Run runs the suite. Each part is a subtest with its own box.
func Run(t *testing.T, h Harness) {
	if h.Timeout == 0 {
		h.Timeout = 60 * time.Second
	}
	t.Run("Exec", func(t *testing.T) { testExec(t, h) })
	t.Run("Files", func(t *testing.T) { testFiles(t, h) })
	t.Run("StopKeepsFiles", func(t *testing.T) { testStopKeepsFiles(t, h) })
	t.Run("Background", func(t *testing.T) { testBackground(t, h) })
	t.Run("Descendants", func(t *testing.T) { testDescendants(t, h) })
	t.Run("Destroy", func(t *testing.T) { testDestroy(t, h) })
	t.Run("Pause", func(t *testing.T) { testPause(t, h) })
	t.Run("Checkpoint", func(t *testing.T) { testCheckpoint(t, h) })
	t.Run("CheckpointFork", func(t *testing.T) { testCheckpointFork(t, h) })
	t.Run("Stats", func(t *testing.T) { testStats(t, h) })
	t.Run("DialPort", func(t *testing.T) { testDialPort(t, h) })
}

func (h Harness) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// start boots a box and registers its stop and destroy.
func (h Harness) start(t *testing.T, spec *isolate.Spec) isolate.Box {
	t.Helper()
	b, err := h.Runtime.Start(h.ctx(t), spec)
	if err != nil {
		t.Fatalf("start %s: %v", spec.ID, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
		defer cancel()
		b.Stop(ctx)
		h.Runtime.Destroy(ctx, spec)
	})
	return b
}

// Result is the outcome of one command.
type Result struct {
	Stdout, Stderr string
	Exit           api.ExitStatus
	Proc           api.Process // the agent's id and pid of the command
}

// Exec runs argv in a box through its agent and collects the result.
func Exec(ctx context.Context, c *agent.Client, spec *agent.ExecSpec) (Result, error) {
	var res Result
	if spec.Timeout == 0 {
		spec.Timeout = 30 * time.Second
	}
	rc, err := c.Exec(ctx, spec)
	if err != nil {
		return res, err
	}
	defer rc.Close()
	var out, errb bytes.Buffer
	st, err := api.ReadExecStream(rc, func(f *api.ExecFrame) error {
		switch f.Type {
		case api.FrameStarted:
			res.Proc = f.Started
		case api.FrameStdout:
			out.Write(f.Payload)
		case api.FrameStderr:
			errb.Write(f.Payload)
		}
		return nil
	})
	if err == io.EOF {
		return res, fmt.Errorf("exec %q: stream ended without an exit status", spec.Argv)
	}
	if err != nil {
		return res, fmt.Errorf("exec %q: %w", spec.Argv, err)
	}
	res.Exit, res.Stdout, res.Stderr = *st, out.String(), errb.String()
	return res, nil
}

func sh(t *testing.T, ctx context.Context, b isolate.Box, script string) Result {
	t.Helper()
	res, err := Exec(ctx, b.Agent(), &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// CheckClock checks that the box's wall clock (`date +%s`) is the host's,
// within 2 s either side of the exec: a correctness bound (a guest
// clock left at 1970, or at a pause's or checkpoint's time, is off by
// far more), not a speed one.
func CheckClock(t testing.TB, ctx context.Context, b isolate.Box, when string) {
	t.Helper()
	lo := time.Now().Unix()
	res, err := Exec(ctx, b.Agent(), &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", "date +%s"}})
	hi := time.Now().Unix()
	if err != nil || res.Exit.ExitCode != 0 {
		t.Fatalf("%s: date +%%s: %v %+v", when, err, res)
	}
	g, err := strconv.ParseInt(strings.TrimSpace(res.Stdout), 10, 64)
	if err != nil {
		t.Fatalf("%s: date +%%s printed %q", when, res.Stdout)
	}
	if g < lo-2 || g > hi+2 {
		f := func(s int64) string { return time.Unix(s, 0).UTC().Format(time.RFC3339) }
		t.Fatalf("%s: the box's clock reads %s, the host's %s..%s", when, f(g), f(lo), f(hi))
	}
}

func mustSh(t *testing.T, ctx context.Context, b isolate.Box, script string) string {
	t.Helper()
	res := sh(t, ctx, b, script)
	if res.Exit.ExitCode != 0 || res.Exit.Signal != "" {
		t.Fatalf("%q: exit %+v, stdout %q, stderr %q", script, res.Exit, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

func testExec(t *testing.T, h Harness) {
	spec := h.Spec(t, "cexec")
	b := h.start(t, spec)
	ctx := h.ctx(t)
	if b.Pid() <= 0 {
		t.Errorf("Pid() = %d, want the host pid of the box's first process", b.Pid())
	}
	CheckClock(t, ctx, b, "after boot")
	res := sh(t, ctx, b, "echo out; echo err >&2; exit 3")
	if res.Stdout != "out\n" || res.Stderr != "err\n" || res.Exit.ExitCode != 3 {
		t.Fatalf("stdout %q stderr %q exit %+v; want out, err, 3", res.Stdout, res.Stderr, res.Exit)
	}
	// Identity: root inside, the spec's hostname, its own pid 1.
	out := mustSh(t, ctx, b, "id -u; hostname; echo $$")
	lines := strings.Fields(out)
	if len(lines) != 3 || lines[0] != "0" || lines[1] != spec.Hostname {
		t.Fatalf("id/hostname: %q (want 0 and %q)", out, spec.Hostname)
	}
	// The box sees only its own processes.
	out = mustSh(t, ctx, b, "ls /proc | grep -c '^[0-9]'")
	if n, _ := strconv.Atoi(strings.TrimSpace(out)); n <= 0 || n > 20 {
		t.Fatalf("processes visible inside: %q, want a handful", out)
	}
	// Standard input reaches the command.
	res, err := Exec(ctx, b.Agent(), &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", "cat; echo ."}, Stdin: []byte("piped\n")})
	if err != nil || res.Stdout != "piped\n.\n" {
		t.Fatalf("stdin: %q %v", res.Stdout, err)
	}
	// A signal ends a command and is reported.
	res = sh(t, ctx, b, "kill -9 $$")
	if res.Exit.Signal == "" && res.Exit.ExitCode != 137 {
		t.Fatalf("killed command: exit %+v", res.Exit)
	}
	// A missing program is an error frame or exit 127, never a hang.
	r2, err := Exec(ctx, b.Agent(), &agent.ExecSpec{Argv: []string{"/no/such/program"}})
	if err == nil && r2.Exit.ExitCode == 0 {
		t.Fatalf("missing program ran: %+v", r2)
	}
	// Writes stay out of the host's image layers.
	mustSh(t, ctx, b, "echo hi > /etc/den-conformance")
	for _, l := range spec.Layers {
		for _, low := range l.Lowers {
			if _, err := os.Stat(filepath.Join(low, "etc/den-conformance")); err == nil {
				t.Fatalf("a write inside reached the lower layer %s", low)
			}
		}
	}
}

func testFiles(t *testing.T, h Harness) {
	b := h.start(t, h.Spec(t, "cfiles"))
	ctx := h.ctx(t)
	c := b.Agent()
	data := bytes.Repeat([]byte("den\x00\xff"), 100000)
	q := url.Values{"path": {"/root/blob"}, "mode": {"0600"}}
	resp, err := c.Do(ctx, "PUT", agent.PathFiles, q, bytes.NewReader(data), nil)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	resp.Body.Close()
	out := mustSh(t, ctx, b, "wc -c < /root/blob; ls -l /root/blob | cut -c1-10")
	if f := strings.Fields(out); len(f) != 2 || f[0] != strconv.Itoa(len(data)) || f[1] != "-rw-------" {
		t.Fatalf("file written through the agent, seen inside: %q", out)
	}
	resp, err = c.Do(ctx, "GET", agent.PathFiles, url.Values{"path": {"/root/blob"}}, nil, nil)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(data))
	}
	// A symlink inside cannot lead a file operation out of the box.
	mustSh(t, ctx, b, "ln -s / /root/up && ln -s ../../../../../etc/hostname /root/hn")
	resp, err = c.Do(ctx, "GET", agent.PathFiles, url.Values{"path": {"/root/up/etc/hostname"}}, nil, nil)
	if err == nil {
		inside, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		host, _ := os.ReadFile("/etc/hostname")
		if len(host) > 0 && bytes.Equal(inside, host) && !strings.Contains(mustSh(t, ctx, b, "cat /etc/hostname 2>/dev/null || true"), strings.TrimSpace(string(host))) {
			t.Fatal("a symlink led a read to the host's /etc/hostname")
		}
	}
	if _, err := c.Do(ctx, "GET", agent.PathFiles, url.Values{"path": {"/no/such/file"}}, nil, nil); err == nil {
		t.Fatal("reading a missing file succeeded")
	}
}

func testStopKeepsFiles(t *testing.T, h Harness) {
	spec := h.Spec(t, "cstop")
	ctx := h.ctx(t)
	b, err := h.Runtime.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Runtime.Destroy(context.Background(), spec) })
	mustSh(t, ctx, b, "mkdir -p /srv/keep && echo kept > /srv/keep/file && chown 1000:1000 /srv/keep/file")
	if err := b.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	select {
	case <-b.Done():
	case <-ctx.Done():
		t.Fatal("Done not closed after Stop")
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	b2, err := h.Runtime.Start(ctx, spec)
	if err != nil {
		t.Fatalf("start again: %v", err)
	}
	defer b2.Stop(context.Background())
	out := mustSh(t, ctx, b2, "cat /srv/keep/file; stat -c %u:%g /srv/keep/file")
	if out != "kept\n1000:1000\n" {
		t.Fatalf("after a restart: %q, want the file and its owner 1000:1000", out)
	}
}

func testBackground(t *testing.T, h Harness) {
	b := h.start(t, h.Spec(t, "cbg"))
	ctx := h.ctx(t)
	var st api.ProcessInfo
	err := b.Agent().JSON(ctx, "POST", agent.PathProcs, nil, &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/tick.new; mv /tmp/tick.new /tmp/tick; sleep 0.1; done"}, Name: "ticker"}, &st)
	if err != nil {
		t.Fatalf("start background process: %v", err)
	}
	if st.ID == "" {
		t.Fatalf("no process id in %+v", st)
	}
	// Commands come and go while it runs.
	first := tick(t, ctx, b)
	for i := 0; i < 5; i++ {
		mustSh(t, ctx, b, "true")
	}
	waitTicks(t, ctx, b, first+3)
	var procs []api.ProcessInfo
	if err := b.Agent().JSON(ctx, "GET", agent.PathProcs, nil, nil, &procs); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range procs {
		found = found || (p.ID == st.ID && p.State == "running")
	}
	if !found {
		t.Fatalf("background process %s not listed as running: %+v", st.ID, procs)
	}
}

// testDescendants: what a command starts in a new session (setsid) or
// leaves behind when it ends (re-parented to the agent) is listed with it,
// and dies with it when it times out or is killed through the agent; when
// it ends by itself such processes keep running (as after docker exec). A
// background process of its own is no part of another's tree.
func testDescendants(t *testing.T, h Harness) {
	b := h.start(t, h.Spec(t, "ctree"))
	ctx := h.ctx(t)
	c := b.Agent()
	var bystander api.ProcessInfo
	if err := c.JSON(ctx, "POST", agent.PathProcs, nil, &agent.ExecSpec{Argv: []string{"sleep", "1009"}}, &bystander); err != nil {
		t.Fatalf("start the bystander: %v", err)
	}

	// A command that ends by itself leaves its daemon running, listed
	// among its descendants; a kill of the finished command ends it.
	res := sh(t, ctx, b, "setsid sleep 1001 & echo $!")
	daemon, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if res.Exit.ExitCode != 0 || daemon <= 0 || res.Proc.ID == "" {
		t.Fatalf("setsid sleep 1001 &: %+v", res)
	}
	waitSleeps(t, ctx, b, "the daemon to start", func(live map[string][]int) bool { return len(live["1001"]) == 1 })
	var info api.ProcessInfo
	if err := c.JSON(ctx, "GET", agent.ProcPath(res.Proc.ID, ""), nil, nil, &info); err != nil {
		t.Fatal(err)
	}
	if info.State != api.ProcExited || len(info.Descendants) != 1 || info.Descendants[0] != daemon {
		t.Fatalf("the finished command is listed as %s with descendants %v, want exited with [%d] (its setsid daemon)", info.State, info.Descendants, daemon)
	}
	if err := c.JSON(ctx, "POST", agent.ProcPath(res.Proc.ID, agent.ProcSignal), nil, api.SignalRequest{Signal: "KILL"}, nil); err != nil {
		t.Fatalf("kill the finished command's daemon: %v", err)
	}
	waitSleeps(t, ctx, b, "the kill of the finished command to end its daemon", func(live map[string][]int) bool { return len(live["1001"]) == 0 })
	if err := c.JSON(ctx, "POST", agent.ProcPath(res.Proc.ID, agent.ProcSignal), nil, api.SignalRequest{Signal: "KILL"}, nil); err == nil {
		t.Fatal("a kill of a finished command that left nothing running succeeded; want a conflict")
	}

	// A timeout ends the whole tree: a child in a new session and a
	// grandchild in another whose parent ended at once.
	res, err := Exec(ctx, c, &agent.ExecSpec{Timeout: 10 * time.Second, Argv: []string{"/bin/sh", "-c",
		"rm -f /tmp/r1 /tmp/r2; setsid sh -c 'touch /tmp/r1; exec sleep 1002' & (setsid sh -c 'touch /tmp/r2; exec sleep 1003' &); " +
			"until [ -e /tmp/r1 ] && [ -e /tmp/r2 ]; do sleep 0.1; done; echo started; sleep 1004"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Exit.Reason != api.ReasonTimeout || res.Stdout != "started\n" {
		t.Fatalf("the command did not start its tree and time out: %+v", res)
	}
	waitSleeps(t, ctx, b, "the timeout to end the tree", func(live map[string][]int) bool {
		return len(live["1002"])+len(live["1003"])+len(live["1004"]) == 0
	})

	// A kill through the agent ends a background process's tree.
	var bg api.ProcessInfo
	if err := c.JSON(ctx, "POST", agent.PathProcs, nil, &agent.ExecSpec{Argv: []string{"/bin/sh", "-c",
		"(setsid sleep 1005 &); setsid sleep 1006 & sleep 1007"}}, &bg); err != nil {
		t.Fatal(err)
	}
	var want []int
	waitSleeps(t, ctx, b, "the background tree to start", func(live map[string][]int) bool {
		want = append(append(append([]int(nil), live["1005"]...), live["1006"]...), live["1007"]...)
		return len(live["1005"]) == 1 && len(live["1006"]) == 1 && len(live["1007"]) == 1
	})
	if err := c.JSON(ctx, "GET", agent.ProcPath(bg.ID, ""), nil, nil, &info); err != nil {
		t.Fatal(err)
	}
	for _, pid := range want {
		if pid != bg.Pid && !slices.Contains(info.Descendants, pid) { // a shell may exec its last command
			t.Fatalf("background process %s lists descendants %v, want %v among them", bg.ID, info.Descendants, want)
		}
	}
	if err := c.JSON(ctx, "POST", agent.ProcPath(bg.ID, agent.ProcSignal), nil, api.SignalRequest{Signal: "KILL"}, nil); err != nil {
		t.Fatal(err)
	}
	waitSleeps(t, ctx, b, "the kill to end the background tree", func(live map[string][]int) bool {
		return len(live["1005"])+len(live["1006"])+len(live["1007"]) == 0
	})

	live := sleeps(t, ctx, b)
	if len(live["1009"]) != 1 {
		t.Fatalf("the bystander (its own background process) was killed with another's tree: %v", live)
	}
	if err := c.JSON(ctx, "GET", agent.ProcPath(bystander.ID, ""), nil, nil, &info); err != nil || info.State != api.ProcRunning {
		t.Fatalf("bystander: %+v %v", info, err)
	}
}

// sleeps lists the box's live sleep commands by argument: pids by "1001".
func sleeps(t *testing.T, ctx context.Context, b isolate.Box) map[string][]int {
	t.Helper()
	out := mustSh(t, ctx, b, `for d in /proc/[0-9]*; do printf '%s ' "${d#/proc/}"; tr '\000' ' ' < "$d/cmdline"; echo; done 2>/dev/null`)
	live := map[string][]int{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[1] == "sleep" {
			pid, _ := strconv.Atoi(f[0])
			live[f[2]] = append(live[f[2]], pid)
		}
	}
	return live
}

// waitSleeps reads the box's sleeps until done accepts them.
func waitSleeps(t *testing.T, ctx context.Context, b isolate.Box, what string, done func(map[string][]int) bool) {
	t.Helper()
	for {
		live := sleeps(t, ctx, b)
		if done(live) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waited in vain for %s: live sleeps %v", what, live)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tick reads the ticker's counter (0 when it has not written yet).
func tick(t *testing.T, ctx context.Context, b isolate.Box) int {
	t.Helper()
	n, _ := strconv.Atoi(strings.TrimSpace(mustSh(t, ctx, b, "cat /tmp/tick 2>/dev/null || echo 0")))
	return n
}

func waitTicks(t *testing.T, ctx context.Context, b isolate.Box, want int) int {
	t.Helper()
	for {
		n := tick(t, ctx, b)
		if n >= want {
			return n
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the background counter stayed at %d (want %d)", n, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func startTicker(t *testing.T, ctx context.Context, b isolate.Box) {
	t.Helper()
	var st api.ProcessInfo
	if err := b.Agent().JSON(ctx, "POST", agent.PathProcs, nil, &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/tick.new; mv /tmp/tick.new /tmp/tick; sleep 0.1; done"}}, &st); err != nil {
		t.Fatalf("start ticker: %v", err)
	}
}

func testDestroy(t *testing.T, h Harness) {
	spec := h.Spec(t, "cdestroy")
	ctx := h.ctx(t)
	b, err := h.Runtime.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	mustSh(t, ctx, b, "echo x > /root/x")
	// Destroy of a running box is the daemon's clean-up after a crash:
	// stop first as the manager does, then destroy twice.
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := h.Runtime.Destroy(ctx, spec); err != nil {
			t.Fatalf("destroy %d: %v", i+1, err)
		}
	}
	if _, err := os.Stat(spec.Dir); !os.IsNotExist(err) {
		t.Fatalf("box storage %s still there after Destroy: %v", spec.Dir, err)
	}
	// A box that never started destroys cleanly too.
	never := h.Spec(t, "cnever")
	if err := h.Runtime.Destroy(ctx, never); err != nil {
		t.Fatalf("destroy of a box never started: %v", err)
	}
}

func testPause(t *testing.T, h Harness) {
	b := h.start(t, h.Spec(t, "cpause"))
	p, ok := b.(isolate.Pauser)
	if !ok {
		t.Skipf("%s boxes cannot pause", h.Runtime.Name())
	}
	ctx := h.ctx(t)
	startTicker(t, ctx, b)
	before := waitTicks(t, ctx, b, 2)
	if err := p.Pause(ctx); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if err := p.Pause(ctx); err != nil {
		t.Fatalf("second pause: %v", err)
	}
	// Nothing runs while paused: an exec cannot be answered.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := Exec(short, b.Agent(), &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", "cat /tmp/tick"}})
	cancel()
	if err == nil {
		t.Fatal("a paused box answered an exec")
	}
	// Long enough for a guest clock that stood still to be seen behind.
	time.Sleep(3 * time.Second)
	if err := p.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if err := p.Resume(ctx); err != nil {
		t.Fatalf("second resume: %v", err)
	}
	after := tick(t, ctx, b)
	// At 10 ticks a second, 3.5 s of pause would have added about 35.
	if after > before+5 {
		t.Fatalf("the counter ran while paused: %d before, %d right after", before, after)
	}
	CheckClock(t, ctx, b, "after a 3 s pause")
	waitTicks(t, ctx, b, after+2)
	// A paused box can be stopped.
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatalf("stop of a paused box: %v", err)
	}
}

func testCheckpoint(t *testing.T, h Harness) {
	cp, ok := h.Runtime.(isolate.Checkpointer)
	if !ok {
		t.Skipf("the %s tier has no checkpoints", h.Runtime.Name())
	}
	spec := h.Spec(t, "cckpt")
	ctx := h.ctx(t)
	b, err := h.Runtime.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Runtime.Destroy(context.Background(), spec) })
	startTicker(t, ctx, b)
	mustSh(t, ctx, b, "echo before > /root/file")
	waitTicks(t, ctx, b, 3)
	dir := filepath.Join(t.TempDir(), "ckpt")
	// Kept running: the box answers right after.
	if err := cp.Checkpoint(ctx, b, dir+"-live", true); err != nil {
		t.Fatalf("checkpoint, keep running: %v", err)
	}
	CheckClock(t, ctx, b, "after a checkpoint that keeps the box running")
	n := waitTicks(t, ctx, b, tick(t, ctx, b)+2)
	// Stopped: the processes are gone, restore brings them back where
	// they were, with the files.
	if err := cp.Checkpoint(ctx, b, dir, false); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	select {
	case <-b.Done():
	case <-ctx.Done():
		t.Fatal("the box still runs after a checkpoint that stops it")
	}
	b.Stop(ctx)
	// The restore comes later than the checkpoint: the box must show the
	// time it is restored at, not the saved one.
	time.Sleep(3 * time.Second)
	r, err := cp.Restore(ctx, spec, dir)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	defer r.Stop(context.Background())
	CheckClock(t, ctx, r, "after a restore 3 s after the checkpoint")
	m := tick(t, ctx, r)
	if m < n {
		t.Fatalf("after restore the counter is %d, it was at least %d before: the process did not keep its state", m, n)
	}
	waitTicks(t, ctx, r, m+2) // and it runs on
	if out := mustSh(t, ctx, r, "cat /root/file"); out != "before\n" {
		t.Fatalf("file after restore: %q", out)
	}
}

// testCheckpointFork restores one checkpoint twice: into the box it was
// taken of and into another box whose files are a copy (a fork that keeps
// processes). Each runs on from the saved state with its own identity and
// files.
func testCheckpointFork(t *testing.T, h Harness) {
	cp, ok := h.Runtime.(isolate.Checkpointer)
	if !ok {
		t.Skipf("the %s tier has no checkpoints", h.Runtime.Name())
	}
	spec := h.Spec(t, "cforka")
	fork := h.Spec(t, "cforkb")
	ctx := h.ctx(t)
	b, err := h.Runtime.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Runtime.Destroy(context.Background(), spec) })
	t.Cleanup(func() { h.Runtime.Destroy(context.Background(), fork) })
	startTicker(t, ctx, b)
	mustSh(t, ctx, b, "echo before > /root/file")
	n := waitTicks(t, ctx, b, 3)
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := cp.Checkpoint(ctx, b, dir, false); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	b.Stop(ctx)
	// Later than the checkpoint, as for testCheckpoint's clock.
	time.Sleep(3 * time.Second)
	// The fork's files are a copy of the source's, as the manager makes.
	os.RemoveAll(fork.Dir)
	if out, err := exec.Command("cp", "-a", "--reflink=auto", spec.Dir, fork.Dir).CombinedOutput(); err != nil {
		t.Fatalf("copy the files: %v: %s", err, out)
	}
	f, err := cp.Restore(ctx, fork, dir)
	if err != nil {
		t.Fatalf("restore into another box: %v", err)
	}
	defer f.Stop(context.Background())
	r, err := cp.Restore(ctx, spec, dir)
	if err != nil {
		t.Fatalf("restore into the source after a fork: %v", err)
	}
	defer r.Stop(context.Background())
	for _, c := range []struct {
		b    isolate.Box
		spec *isolate.Spec
	}{{f, fork}, {r, spec}} {
		if m := tick(t, ctx, c.b); m < n {
			t.Fatalf("%s: the counter is %d after restore, it was at least %d: the process did not keep its state", c.spec.ID, m, n)
		}
		if out := mustSh(t, ctx, c.b, "cat /root/file; hostname"); out != "before\n"+c.spec.Hostname+"\n" {
			t.Fatalf("%s: file and hostname after restore: %q (want before and %s)", c.spec.ID, out, c.spec.Hostname)
		}
		CheckClock(t, ctx, c.b, c.spec.ID+" restored")
	}
	// Both run on, independently.
	waitTicks(t, ctx, f, tick(t, ctx, f)+2)
	waitTicks(t, ctx, r, tick(t, ctx, r)+2)
	mustSh(t, ctx, f, "echo fork > /root/file")
	if out := mustSh(t, ctx, r, "cat /root/file"); out != "before\n" {
		t.Fatalf("the source sees the fork's write: %q", out)
	}
}

func testStats(t *testing.T, h Harness) {
	b := h.start(t, h.Spec(t, "cstats"))
	s, ok := b.(isolate.Statser)
	if !ok {
		t.Skipf("%s boxes report no stats", h.Runtime.Name())
	}
	ctx := h.ctx(t)
	mustSh(t, ctx, b, "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")
	st, err := s.Stats()
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	if st.CPU <= 0 || st.Memory <= 0 {
		t.Fatalf("stats after a busy loop: %+v (want CPU and memory in use)", st)
	}
}

func testDialPort(t *testing.T, h Harness) {
	b := h.start(t, h.Spec(t, "cdial"))
	ctx := h.ctx(t)
	var st api.ProcessInfo
	if err := b.Agent().JSON(ctx, "POST", agent.PathProcs, nil, &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", "echo hello from inside | busybox nc -l -p 9000 > /tmp/got"}}, &st); err != nil {
		t.Fatalf("start listener: %v", err)
	}
	var c io.ReadWriteCloser
	for {
		var err error
		c, err = b.Agent().DialPort(ctx, 9000)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("dial port 9000 through the agent: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if _, err := c.Write([]byte("hello from outside\n")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 64)
	n, err := io.ReadAtLeast(c, got, len("hello from inside\n"))
	c.Close()
	if err != nil || string(got[:n]) != "hello from inside\n" {
		t.Fatalf("read through the dialed port: %q %v", got[:n], err)
	}
	for i := 0; ; i++ {
		if out := mustSh(t, ctx, b, "cat /tmp/got"); out == "hello from outside\n" {
			break
		} else if i > 50 {
			t.Fatalf("the listener inside got %q", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := b.Agent().DialPort(ctx, 9001); err == nil {
		t.Fatal("dialing a port nobody listens on succeeded")
	}
}
