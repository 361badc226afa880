package host

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

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
