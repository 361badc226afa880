package host

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
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
