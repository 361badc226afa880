package gvisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/den-dev/den/internal/host"
	"github.com/den-dev/den/internal/isolate"
)

// cgroups finds a box's groups, which runsc makes (cgroupsPath
// /<parent>/<id>) and removes (runsc delete); host.CgroupView reads
// their usage and OOM kills.
type cgroups struct {
	host.CgroupView
}

func detectCgroups(root, parent string) cgroups {
	return cgroups{host.DetectView(root, parent)}
}

// setLimits applies l (zero fields: unlimited) to a running box's groups.
func (cg cgroups) setLimits(id string, l isolate.Limits) error {
	if _, err := os.Stat(cg.Dir(id, "memory")); err != nil {
		return fmt.Errorf("box %s has no cgroup (not running?): %w", id, err)
	}
	if cg.V2 {
		d := cg.Dir(id, "")
		mem, cpu, pids := "max", "max", "max"
		if l.Memory > 0 {
			mem = strconv.FormatInt(l.Memory, 10)
		}
		if l.CPUs > 0 {
			cpu = strconv.Itoa(int(l.CPUs * cpuPeriod))
		}
		if l.Pids > 0 {
			pids = strconv.FormatInt(hostPids(l.Pids), 10)
		}
		if err := host.WriteFile(filepath.Join(d, "memory.max"), mem); err != nil {
			return err
		}
		if err := host.WriteFile(filepath.Join(d, "cpu.max"), cpu+" "+strconv.Itoa(cpuPeriod)); err != nil {
			return err
		}
		return host.WriteFile(filepath.Join(d, "pids.max"), pids)
	}
	mem, cpu, pids := "-1", "-1", "max"
	if l.Memory > 0 {
		mem = strconv.FormatInt(l.Memory, 10)
	}
	if l.CPUs > 0 {
		cpu = strconv.Itoa(int(l.CPUs * cpuPeriod))
	}
	if l.Pids > 0 {
		pids = strconv.FormatInt(hostPids(l.Pids), 10)
	}
	if err := host.WriteFile(filepath.Join(cg.Dir(id, "memory"), "memory.limit_in_bytes"), mem); err != nil {
		return err
	}
	host.WriteFile(filepath.Join(cg.Dir(id, "cpu"), "cpu.cfs_period_us"), strconv.Itoa(cpuPeriod))
	if err := host.WriteFile(filepath.Join(cg.Dir(id, "cpu"), "cpu.cfs_quota_us"), cpu); err != nil {
		return err
	}
	return host.WriteFile(filepath.Join(cg.Dir(id, "pids"), "pids.max"), pids)
}
