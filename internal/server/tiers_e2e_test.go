package server_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/isolate/gvisor"
	"github.com/den-dev/den/internal/isolate/microvm"
	"github.com/den-dev/den/internal/testenv"
	"github.com/den-dev/den/internal/testenv/e2e"
)

// newTierEnv is a daemon offering the gvisor and microvm tiers where this
// machine runs them; the reasons of missing ones are what den info says.
func newTierEnv(t *testing.T) *env {
	return newEnvWith(t, 0, func(e *env) { addTiers(t, e) })
}

// addTiers gives e, before it starts, the gvisor and microvm tiers where
// this machine runs them.
func addTiers(t *testing.T, e *env) {
	e.tiers = map[string]isolate.Runtime{"linux": e.rt}
	e.unavailable = map[string]string{}
	run := fmt.Sprintf("/run/den-e2e/tiers-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_"))
	if g, err := gvisor.New(gvisor.Config{RunDir: run + "/gvisor", CgroupParent: "den-e2e", Runsc: os.Getenv("DEN_RUNSC")}); err != nil {
		e.unavailable["gvisor"] = err.Error()
	} else {
		e.tiers["gvisor"] = g
	}
	if m, err := microvm.New(microvm.Config{RunDir: run + "/microvm", StateDir: "/var/tmp/den-e2e-microvm"}); err != nil {
		e.unavailable["microvm"] = err.Error()
	} else {
		e.tiers["microvm"] = m
	}
	t.Cleanup(func() {
		e2e.UnmountRunDir(run + "/gvisor")
		e2e.UnmountRunDir(run + "/microvm")
		os.RemoveAll(run)
	})
}

// need skips t when the host lacks what tier needs (and the run does not
// require it), and fails it when den could not start a tier the host can
// run.
func (e *env) need(t *testing.T, tier string) {
	t.Helper()
	testenv.Tier(t, tier)
	if why, ok := e.unavailable[tier]; ok {
		testenv.Unavailable(t, tier, why)
	}
}

// ticker starts a background counter in a sandbox; count reads it (the
// file is replaced whole, so a read never sees it half written).
func (e *env) ticker(t *testing.T, id string) {
	t.Helper()
	if _, err := e.c.StartProcess(context.Background(), id, api.ExecRequest{Shell: "i=0; while true; do i=$((i+1)); echo $i > /tmp/tick.new; mv /tmp/tick.new /tmp/tick; sleep 0.1; done"}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) count(t *testing.T, id string) int {
	t.Helper()
	res := e.sh(t, id, "cat /tmp/tick 2>/dev/null || echo 0")
	n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	return n
}

func (e *env) waitCount(t *testing.T, id string, want int) int {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if n := e.count(t, id); n >= want {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("counter in %s stayed below %d", id, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestTiersBadInput(t *testing.T) {
	e := newEnvWith(t, 0, func(e *env) {
		e.tiers = map[string]isolate.Runtime{"linux": e.rt}
		e.unavailable = map[string]string{
			"gvisor":  "runsc not found (apt-get install runsc)",
			"microvm": "qemu-system-x86_64 not found (apt-get install qemu-system-x86)",
		}
	})
	ctx := context.Background()
	info, err := e.c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Runtimes) == 0 || info.Runtimes[0].Name != "linux" || !info.Runtimes[0].Default {
		t.Fatalf("info: %+v", info)
	}
	_, err = e.c.Create(ctx, api.CreateRequest{Runtime: "xen"})
	if ae := wantKind(t, err, api.KindInvalid); !strings.Contains(ae.Message, "runtime") {
		t.Fatalf("unknown runtime: %v", ae)
	}
	_, err = e.c.Create(ctx, api.CreateRequest{Runtime: "microvm"})
	if ae := wantKind(t, err, api.KindUnsupported); !strings.Contains(ae.Message, "qemu-system-x86_64 not found") {
		t.Fatalf("unavailable runtime: %v", ae)
	}
	sb := e.create(t, api.CreateRequest{Name: "esc"})
	if _, err := e.c.Escalate(ctx, sb.ID, ""); err == nil {
		t.Fatal("escalate without a runtime succeeded")
	} else {
		wantKind(t, err, api.KindInvalid)
	}
	_, err = e.c.Escalate(ctx, sb.ID, "linux")
	wantKind(t, err, api.KindConflict)
	_, err = e.c.Escalate(ctx, sb.ID, "vmware")
	wantKind(t, err, api.KindInvalid)
	_, err = e.c.Escalate(ctx, sb.ID, "microvm")
	wantKind(t, err, api.KindUnsupported)
	_, err = e.c.Escalate(ctx, sb.ID, "gvisor")
	if ae := wantKind(t, err, api.KindUnsupported); !strings.Contains(ae.Message, "runsc not found") {
		t.Fatalf("escalate to an unavailable tier: %v", ae)
	}
	status, body := e.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/escalate", strings.NewReader(`{"runtime": 7}`))
	if status != 400 {
		t.Fatalf("escalate with a number: %d %s", status, body)
	}
	// Nothing was lost: the sandbox still runs on linux.
	got, err := e.c.Get(ctx, sb.ID)
	if err != nil || got.Runtime != "linux" || got.State != api.StateRunning {
		t.Fatalf("after bad escalations: %+v %v", got, err)
	}
}

// createOn creates a sandbox on tier: the host image, or busybox on
// microvm (a guest boots an image's files).
func (e *env) createOn(t *testing.T, tier string) *api.Sandbox {
	t.Helper()
	req := api.CreateRequest{Runtime: tier}
	if tier == "microvm" {
		req.Image = e2e.BusyboxImage(t, e.c)
	}
	return e.create(t, req)
}

func TestGvisorSandbox(t *testing.T) {
	e := newTierEnv(t)
	e.need(t, "gvisor")
	ctx := context.Background()

	// Escalation keeps the id, files, policy and ports.
	sb := e.create(t, api.CreateRequest{Name: "climb", Network: &api.NetworkPolicy{Mode: api.NetNone}})
	e.sh(t, sb.ID, "echo from-linux > /root/kept && chown 1000:1000 /root/kept")
	got, err := e.c.Escalate(ctx, sb.ID, "gvisor")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != sb.ID || got.Runtime != "gvisor" || got.State != api.StateRunning {
		t.Fatalf("escalated: %+v", got)
	}
	// (busybox's stat: Debian's coreutils pass statx a flag the 2022 runsc
	// refuses, see docs/design.md.)
	res := e.sh(t, sb.ID, "cat /root/kept; busybox stat -c %u /root/kept")
	if !strings.HasPrefix(string(res.Stdout), "from-linux\n1000\n") || res.ExitCode != 0 {
		t.Fatalf("after escalation: %+v", res)
	}
	if _, err := e.c.Escalate(ctx, sb.ID, "linux"); err == nil {
		t.Fatal("escalated down to linux")
	}

	// Hibernate keeps the processes: resume restores them.
	e.ticker(t, sb.ID)
	before := e.waitCount(t, sb.ID, 3)
	if _, err := e.c.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err = e.c.Resume(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Resumed != api.ResumedRestored {
		t.Fatalf("resumed %q, want restored", got.Resumed)
	}
	after := e.count(t, sb.ID)
	if after < before {
		t.Fatalf("counter went back from %d to %d: the process did not survive", before, after)
	}
	e.waitCount(t, sb.ID, after+2)

	// A killed sandbox is failed with the reason; the daemon and another
	// sandbox go on.
	other := e.create(t, api.CreateRequest{Runtime: "gvisor"})
	cur, _ := e.c.Get(ctx, sb.ID)
	if err := syscall.Kill(cur.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		cur, _ = e.c.Get(ctx, sb.ID)
		if cur.State == api.StateFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("killed sandbox: %+v", cur)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if cur.Error == "" {
		t.Fatal("a failed sandbox without a reason")
	}
	if res := e.sh(t, other.ID, "echo alive"); string(res.Stdout) != "alive\n" {
		t.Fatalf("the other sandbox: %+v", res)
	}
	if _, err := e.c.Start(ctx, sb.ID); err != nil {
		t.Fatalf("start after failure: %v", err)
	}
	if res := e.sh(t, sb.ID, "cat /root/kept"); string(res.Stdout) != "from-linux\n" {
		t.Fatalf("files after failure and start: %+v", res)
	}
	e.c.Remove(ctx, sb.ID, true)
	e.c.Remove(ctx, other.ID, true)
}

func TestMicrovmSandbox(t *testing.T) {
	e := newTierEnv(t)
	e.need(t, "microvm")
	ctx := context.Background()
	img := e2e.BusyboxImage(t, e.c)
	sb := e.create(t, api.CreateRequest{Image: img, Runtime: "microvm"})
	res := e.sh(t, sb.ID, "mkdir -p /root; uname -r; id -u; echo data > /root/f")
	if res.ExitCode != 0 || !strings.Contains(string(res.Stdout), "\n0\n") {
		t.Fatalf("microvm exec: %+v", res)
	}
	if strings.HasPrefix(string(res.Stdout), hostRelease()) && hostRelease() != "" {
		t.Fatalf("the microVM runs the host's kernel %s", res.Stdout)
	}
	e.ticker(t, sb.ID)
	before := e.waitCount(t, sb.ID, 3)
	if _, err := e.c.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err := e.c.Resume(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Resumed != api.ResumedRestored {
		t.Fatalf("resumed %q, want restored", got.Resumed)
	}
	if after := e.count(t, sb.ID); after < before {
		t.Fatalf("counter went back from %d to %d", before, after)
	}
	if res := e.sh(t, sb.ID, "cat /root/f"); string(res.Stdout) != "data\n" {
		t.Fatalf("files after restore: %+v", res)
	}
	e.c.Remove(ctx, sb.ID, true)

	// Escalation from linux: the files move into the VM's disk with their
	// owners.
	up := e.create(t, api.CreateRequest{Image: img, Name: "upward"})
	e.sh(t, up.ID, "mkdir -p /srv /root && echo mine > /srv/f && chown 1000:1000 /srv/f && rm /etc/passwd.nonexistent 2>/dev/null; echo gone > /root/g && rm /root/g")
	got, err = e.c.Escalate(ctx, up.ID, "microvm")
	if err != nil {
		t.Fatal(err)
	}
	if got.Runtime != "microvm" || got.State != api.StateRunning {
		t.Fatalf("escalated: %+v", got)
	}
	res = e.sh(t, up.ID, "cat /srv/f; stat -c %u:%g /srv/f; ls /root; uname -r")
	if !strings.HasPrefix(string(res.Stdout), "mine\n1000:1000\n") || strings.Contains(string(res.Stdout), "\ng\n") {
		t.Fatalf("after escalation to microvm: %+v", res)
	}
	e.c.Remove(ctx, up.ID, true)
}

func hostRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}
