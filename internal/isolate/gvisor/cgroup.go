package gvisor

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/den-dev/den/internal/isolate"
	"golang.org/x/sys/unix"
)

// cgroups finds a box's groups, which runsc makes (cgroupsPath
// /<parent>/<id>) and removes (runsc delete).
type cgroups struct {
	v2     bool
	root   string
	parent string
}

func detectCgroups(root, parent string) cgroups {
	var st unix.Statfs_t
	v2 := unix.Statfs(root, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
	return cgroups{v2: v2, root: root, parent: parent}
}

func (cg cgroups) dir(id, controller string) string {
	if cg.v2 {
		return filepath.Join(cg.root, cg.parent, id)
	}
	return filepath.Join(cg.root, controller, cg.parent, id)
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}

// keyed reads "key value" lines (memory.stat, cpu.stat, memory.events,
// memory.oom_control).
func keyed(path, key string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

type usage struct {
	CPU    time.Duration
	Memory int64
	Pids   int
}

func (cg cgroups) usage(id string) usage {
	if cg.v2 {
		d := cg.dir(id, "")
		return usage{
			CPU:    time.Duration(keyed(filepath.Join(d, "cpu.stat"), "usage_usec")) * time.Microsecond,
			Memory: readInt(filepath.Join(d, "memory.current")),
			Pids:   int(readInt(filepath.Join(d, "pids.current"))),
		}
	}
	return usage{
		CPU:    time.Duration(readInt(filepath.Join(cg.dir(id, "cpuacct"), "cpuacct.usage"))),
		Memory: readInt(filepath.Join(cg.dir(id, "memory"), "memory.usage_in_bytes")),
		Pids:   int(readInt(filepath.Join(cg.dir(id, "pids"), "pids.current"))),
	}
}

func (cg cgroups) oomKills(id string) uint64 {
	if cg.v2 {
		return uint64(keyed(filepath.Join(cg.dir(id, ""), "memory.events"), "oom_kill"))
	}
	return uint64(keyed(filepath.Join(cg.dir(id, "memory"), "memory.oom_control"), "oom_kill"))
}

func write(path, v string) error {
	if err := os.WriteFile(path, []byte(v), 0); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// setLimits applies l (zero fields: unlimited) to a running box's groups.
func (cg cgroups) setLimits(id string, l isolate.Limits) error {
	if _, err := os.Stat(cg.dir(id, "memory")); err != nil {
		return fmt.Errorf("box %s has no cgroup (not running?): %w", id, err)
	}
	if cg.v2 {
		d := cg.dir(id, "")
		mem, cpu, pids := "max", "max", "max"
		if l.Memory > 0 {
			mem = strconv.FormatInt(l.Memory, 10)
		}
		if l.CPUs > 0 {
			cpu = strconv.Itoa(int(l.CPUs * cpuPeriod))
		}
		if l.Pids > 0 {
			pids = strconv.Itoa(l.Pids + pidsOverhead)
		}
		if err := write(filepath.Join(d, "memory.max"), mem); err != nil {
			return err
		}
		if err := write(filepath.Join(d, "cpu.max"), cpu+" "+strconv.Itoa(cpuPeriod)); err != nil {
			return err
		}
		return write(filepath.Join(d, "pids.max"), pids)
	}
	mem, cpu, pids := "-1", "-1", "max"
	if l.Memory > 0 {
		mem = strconv.FormatInt(l.Memory, 10)
	}
	if l.CPUs > 0 {
		cpu = strconv.Itoa(int(l.CPUs * cpuPeriod))
	}
	if l.Pids > 0 {
		pids = strconv.Itoa(l.Pids + pidsOverhead)
	}
	if err := write(filepath.Join(cg.dir(id, "memory"), "memory.limit_in_bytes"), mem); err != nil {
		return err
	}
	write(filepath.Join(cg.dir(id, "cpu"), "cpu.cfs_period_us"), strconv.Itoa(cpuPeriod))
	if err := write(filepath.Join(cg.dir(id, "cpu"), "cpu.cfs_quota_us"), cpu); err != nil {
		return err
	}
	return write(filepath.Join(cg.dir(id, "pids"), "pids.max"), pids)
}
