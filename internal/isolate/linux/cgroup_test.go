package linux

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/internal/isolate"
)

// The kernel's cgroup files are plain files to these functions, so a
// directory tree shaped like each hierarchy checks what gets written where.
func readTrim(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestCgroupV2Files(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu memory pids"), 0o644)
	cg, err := detectCgroups(root, "den")
	if err != nil || !cg.V2 {
		t.Fatalf("detect: %v v2=%v", err, cg != nil && cg.V2)
	}
	if got := readTrim(t, filepath.Join(root, "den", "cgroup.subtree_control")); got != "+cpu +memory +pids" {
		t.Fatalf("subtree_control %q", got)
	}
	if err := cg.Create("b1", isolate.Limits{CPUs: 1.5, Memory: 256 << 20, Pids: 100}); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(root, "den", "b1")
	for f, want := range map[string]string{"memory.max": "268435456", "cpu.max": "150000 100000", "pids.max": "100", "memory.swap.max": "0"} {
		if got := readTrim(t, filepath.Join(d, f)); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	cg.SetLimits("b1", isolate.Limits{})
	for f, want := range map[string]string{"memory.max": "max", "cpu.max": "max 100000", "pids.max": "max"} {
		if got := readTrim(t, filepath.Join(d, f)); got != want {
			t.Errorf("unlimited %s = %q, want %q", f, got, want)
		}
	}
	os.WriteFile(filepath.Join(d, "memory.events"), []byte("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n"), 0o644)
	if n := cg.OOMKills("b1"); n != 2 {
		t.Fatalf("OOMKills = %d", n)
	}
}

// fakeV1 is a cgroup root with the v1 hierarchies den requires.
func fakeV1(t *testing.T) string {
	root := t.TempDir()
	for _, c := range v1Controllers {
		os.MkdirAll(filepath.Join(root, c), 0o755)
	}
	return root
}

func TestCgroupV1Files(t *testing.T) {
	root := fakeV1(t)
	cg, err := detectCgroups(root, "den")
	if err != nil || cg.V2 {
		t.Fatalf("detect: %v", err)
	}
	if err := cg.Create("b1", isolate.Limits{CPUs: 0.5, Memory: 64 << 20, Pids: 10}); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{
		"memory/den/b1/memory.limit_in_bytes": "67108864",
		"cpu/den/b1/cpu.cfs_quota_us":         "50000",
		"cpu/den/b1/cpu.cfs_period_us":        "100000",
		"pids/den/b1/cmds/pids.max":           "10",
	} {
		if got := readTrim(t, filepath.Join(root, f)); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	os.WriteFile(filepath.Join(root, "memory/den/b1/memory.oom_control"), []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n"), 0o644)
	if n := cg.OOMKills("b1"); n != 4 {
		t.Fatalf("OOMKills = %d", n)
	}
	if _, err := detectCgroups(t.TempDir(), "den"); err == nil {
		t.Fatal("a root with neither v2 nor v1 controllers was accepted")
	}
}

func TestFreezeV2Files(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu memory pids"), 0o644)
	cg, err := detectCgroups(root, "den")
	if err != nil {
		t.Fatal(err)
	}
	cg.Create("b1", isolate.Limits{})
	d := filepath.Join(root, "den", "b1")
	ctx := context.Background()
	os.WriteFile(filepath.Join(d, "cgroup.events"), []byte("populated 1\nfrozen 1\n"), 0o644)
	if err := cg.Freeze(ctx, "b1", true); err != nil {
		t.Fatal(err)
	}
	if got := readTrim(t, filepath.Join(d, "cgroup.freeze")); got != "1" || !cg.Frozen("b1") {
		t.Fatalf("cgroup.freeze = %q after Pause", got)
	}
	os.WriteFile(filepath.Join(d, "cgroup.events"), []byte("populated 1\nfrozen 0\n"), 0o644)
	if err := cg.Freeze(ctx, "b1", false); err != nil {
		t.Fatal(err)
	}
	if got := readTrim(t, filepath.Join(d, "cgroup.freeze")); got != "0" || cg.Frozen("b1") {
		t.Fatalf("cgroup.freeze = %q after Resume", got)
	}
	// A group that never reports frozen: the freeze is undone at the deadline.
	tctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if err := cg.Freeze(tctx, "b1", true); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("freeze that never completes: %v", err)
	}
	if got := readTrim(t, filepath.Join(d, "cgroup.freeze")); got != "0" {
		t.Fatalf("cgroup.freeze = %q after a failed Pause", got)
	}
}

func TestFreezeV1Files(t *testing.T) {
	root := fakeV1(t)
	cg, _ := detectCgroups(root, "den")
	cg.Create("b1", isolate.Limits{})
	if err := cg.Freeze(context.Background(), "b1", true); err == nil {
		t.Fatal("pause without a freezer hierarchy succeeded")
	}
	os.MkdirAll(filepath.Join(root, "freezer"), 0o755)
	cg, _ = detectCgroups(root, "den")
	// A box created before its freezer group existed gets one on Pause.
	os.WriteFile(filepath.Join(root, "pids/den/b1/cgroup.procs"), []byte("4242\n"), 0o644)
	if err := cg.Freeze(context.Background(), "b1", true); err != nil {
		t.Fatal(err)
	}
	if got := readTrim(t, filepath.Join(root, "freezer/den/b1/freezer.state")); got != "FROZEN" || !cg.Frozen("b1") {
		t.Fatalf("freezer.state = %q", got)
	}
	if got := readTrim(t, filepath.Join(root, "freezer/den/b1/cgroup.procs")); got != "4242" {
		t.Fatalf("processes not moved to the freezer group: %q", got)
	}
	cg.Create("b2", isolate.Limits{})
	if _, err := os.Stat(filepath.Join(root, "freezer/den/b2")); err != nil {
		t.Fatalf("no freezer group for a new box: %v", err)
	}
	if err := cg.Freeze(context.Background(), "b1", false); err != nil || cg.Frozen("b1") {
		t.Fatalf("thaw: %v", err)
	}
}

// TestRemoveParent makes a parent group with a box group and a running
// process in every real cgroup hierarchy of this host, and removes it:
// the process is killed and no hierarchy keeps the parent. A name that
// is not one group's is refused.
func TestRemoveParent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	hs := cgroupHierarchies("/sys/fs/cgroup")
	if len(hs) == 0 {
		t.Skip("no cgroup filesystem at /sys/fs/cgroup")
	}
	for _, bad := range []string{"", ".", "..", "a/b", "../den"} {
		if _, err := RemoveParent("/sys/fs/cgroup", bad); err == nil {
			t.Errorf("RemoveParent(%q) was not refused", bad)
		}
	}
	parent := "den-removetest-" + strconv.Itoa(os.Getpid())
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill(); RemoveParent("/sys/fs/cgroup", parent) })
	var made []string
	for _, h := range hs {
		box := filepath.Join(h, parent, "box1")
		if err := os.MkdirAll(box, 0o755); err != nil {
			t.Logf("%s: %v", h, err) // a v2 without delegated controllers, say
			continue
		}
		made = append(made, filepath.Join(h, parent))
		// A v2 beside v1 controllers may refuse the move (a process
		// must not sit in a non-leaf domain there): it is made anyway.
		os.WriteFile(filepath.Join(box, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0)
	}
	if len(made) == 0 {
		t.Skip("cannot make groups here")
	}
	gone, err := RemoveParent("/sys/fs/cgroup", parent)
	if err != nil {
		t.Fatal(err)
	}
	if len(gone) != len(made) {
		t.Errorf("removed %q, want %q", gone, made)
	}
	for _, m := range made {
		if _, err := os.Stat(m); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v)", m, err)
		}
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the process in the groups was not killed")
	}
	if gone, err := RemoveParent("/sys/fs/cgroup", parent); err != nil || len(gone) != 0 {
		t.Errorf("second removal: %q, %v", gone, err)
	}
}
