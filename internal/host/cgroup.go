package host

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// CgroupView finds and reads the groups of boxes under one parent group,
// on cgroup v2 (Root/Parent/<id>) or v1 (Root/<controller>/Parent/<id>).
// The linux tier makes its groups itself; the gvisor tier reads the ones
// runsc makes.
type CgroupView struct {
	V2     bool
	Root   string // /sys/fs/cgroup
	Parent string // "den": the parent group of every box
}

// Dir is box id's group of controller (the one group on v2).
func (v CgroupView) Dir(id, controller string) string {
	if v.V2 {
		return filepath.Join(v.Root, v.Parent, id)
	}
	return filepath.Join(v.Root, controller, v.Parent, id)
}

// OOMKills reads the kernel's count of OOM kills in the box's memory group.
func (v CgroupView) OOMKills(id string) uint64 {
	file := "memory.oom_control"
	if v.V2 {
		file = "memory.events"
	}
	f, err := os.Open(filepath.Join(v.Dir(id, "memory"), file))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
	}
	return 0
}

// Usage is a box's live resource use as its cgroups count it.
type Usage struct {
	CPU    time.Duration // total CPU time used
	Memory int64         // bytes in use, page cache included
	Pids   int
}

func readInt(p string) int64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// Usage reads the box's counters.
func (v CgroupView) Usage(id string) Usage {
	var u Usage
	if v.V2 {
		d := v.Dir(id, "")
		if b, err := os.ReadFile(filepath.Join(d, "cpu.stat")); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					u.CPU = time.Duration(n) * time.Microsecond
				}
			}
		}
		u.Memory = readInt(filepath.Join(d, "memory.current"))
		u.Pids = int(readInt(filepath.Join(d, "pids.current")))
		return u
	}
	u.CPU = time.Duration(readInt(filepath.Join(v.Dir(id, "cpuacct"), "cpuacct.usage")))
	u.Memory = readInt(filepath.Join(v.Dir(id, "memory"), "memory.usage_in_bytes"))
	u.Pids = int(readInt(filepath.Join(v.Dir(id, "pids"), "pids.current")))
	return u
}

// V1Controllers are the cgroup v1 controllers whose groups den makes and
// reads for each box (on v2 one group has them all).
var V1Controllers = []string{"memory", "cpu", "cpuacct", "pids"}

// WriteFile writes v to the kernel file path (a cgroup interface file), as
// one write, naming the path when the kernel refuses it.
func WriteFile(path, v string) error {
	if err := os.WriteFile(path, []byte(v), 0); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// RemoveGroup removes the (empty) group d, waiting up to limit for the
// processes that were in it to be gone. A missing group is no error.
func RemoveGroup(d string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		err := os.Remove(d)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w (processes still in it: %s)", d, err, readProcs(d))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// RemoveParent removes the parent group name and every group under it
// from each cgroup hierarchy mounted at root (cgroup v2 at root itself or
// beside v1 controllers, and every v1 hierarchy: runsc makes its groups in
// all of them), for den system reset: it first thaws and kills every
// process left in them. It returns the parent groups it removed (nothing
// when there is none).
func RemoveParent(root, name string) ([]string, error) {
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		return nil, fmt.Errorf("cgroup parent %q: not a group name", name)
	}
	var tops []string
	for _, h := range cgroupHierarchies(root) {
		if st, err := os.Stat(filepath.Join(h, name)); err == nil && st.IsDir() {
			tops = append(tops, filepath.Join(h, name))
		}
	}
	var groups []string // every group, deepest last
	for _, top := range tops {
		filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				groups = append(groups, p)
			}
			return nil
		})
	}
	for _, g := range groups {
		WriteFile(filepath.Join(g, "cgroup.freeze"), "0")      // v2 (absent on v1)
		WriteFile(filepath.Join(g, "freezer.state"), "THAWED") // v1 freezer
		b, _ := os.ReadFile(filepath.Join(g, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	var errs []error
	for i := len(groups) - 1; i >= 0; i-- {
		if err := RemoveGroup(groups[i], 2*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	var gone []string
	for _, top := range tops {
		if _, err := os.Stat(top); errors.Is(err, os.ErrNotExist) {
			gone = append(gone, top)
		}
	}
	return gone, errors.Join(errs...)
}

func readProcs(g string) string {
	b, _ := os.ReadFile(filepath.Join(g, "cgroup.procs"))
	return strings.Join(strings.Fields(string(b)), " ")
}

// cgroupHierarchies lists the cgroup filesystems mounted at root: root
// itself (cgroup v2 alone), or each of its subdirectories that is one (v1
// controllers, a named v1 hierarchy such as systemd's, a v2 beside them).
func cgroupHierarchies(root string) []string {
	isCgroup := func(p string) bool {
		var st syscall.Statfs_t
		if syscall.Statfs(p, &st) != nil {
			return false
		}
		return st.Type == unix.CGROUP2_SUPER_MAGIC || st.Type == unix.CGROUP_SUPER_MAGIC
	}
	if isCgroup(root) {
		return []string{root}
	}
	ents, _ := os.ReadDir(root)
	var out []string
	for _, e := range ents {
		p := filepath.Join(root, e.Name())
		if e.IsDir() && isCgroup(p) {
			out = append(out, p)
		}
	}
	return out
}

// DetectView is the view of the groups under parent at root: cgroup v2
// when root is a cgroup2 filesystem, else v1 hierarchies beneath it. It
// makes nothing.
func DetectView(root, parent string) CgroupView {
	var st unix.Statfs_t
	v2 := unix.Statfs(root, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
	return CgroupView{V2: v2, Root: root, Parent: parent}
}

// boxDirs are box id's groups: the one on v2, one per controller den
// reads on v1.
func (v CgroupView) boxDirs(id string) []string {
	if v.V2 {
		return []string{v.Dir(id, "")}
	}
	var d []string
	for _, c := range V1Controllers {
		d = append(d, v.Dir(id, c))
	}
	return d
}

// Place puts pid (every thread of it) in box id's groups, making them,
// without limits: a tier that limits its boxes otherwise (microvm: the
// guest's memory and CPUs) still keeps them under the daemon's parent,
// where den system reset finds them and the usage is counted.
func (v CgroupView) Place(id string, pid int) error {
	for _, d := range v.boxDirs(id) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create cgroup: %w", err)
		}
		if err := WriteFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// RemoveGroups removes box id's groups once its processes have exited
// (waiting briefly for the kernel to let them go). Idempotent.
func (v CgroupView) RemoveGroups(id string) error {
	var errs []error
	for _, d := range v.boxDirs(id) {
		if err := RemoveGroup(d, time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RemoveParentIfEmpty removes the parent group name from each hierarchy
// at root where no box group is left in it (den serve at its end: boxes
// outlive the daemon, and their parent stays with them).
func RemoveParentIfEmpty(root, name string) {
	if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
		return
	}
	for _, h := range cgroupHierarchies(root) {
		os.Remove(filepath.Join(h, name)) // ENOTEMPTY/EBUSY: boxes remain
	}
}
