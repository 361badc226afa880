package linux

import (
	"context"
	"errors"
	"fmt"
	"github.com/den-dev/den/internal/host"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/den-dev/den/internal/isolate"
)

// cgroups places boxes in cgroups on either cgroup v2 (unified) or v1
// (one hierarchy per controller), whichever the host has.
type cgroups struct {
	host.CgroupView
	freezer bool // v1: the freezer hierarchy is mounted (v2 always has cgroup.freeze)
}

var v1Controllers = host.V1Controllers

// v1Freezer is the v1 controller that pauses boxes; a host without it
// runs boxes that cannot be paused.
const v1Freezer = "freezer"

func detectCgroups(root, name string) (*cgroups, error) {
	cg := &cgroups{CgroupView: host.CgroupView{Root: root, Parent: name}}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		cg.V2 = true
		if err := os.MkdirAll(filepath.Join(root, name), 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup %s: %w", name, err)
		}
		for _, dir := range []string{root, filepath.Join(root, name)} {
			if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+cpu +memory +pids"), 0); err != nil {
				return nil, fmt.Errorf("enable cgroup v2 controllers in %s: %w", dir, err)
			}
		}
		return cg, nil
	}
	for _, c := range v1Controllers {
		if _, err := os.Stat(filepath.Join(root, c)); err != nil {
			return nil, fmt.Errorf("no cgroup v2 at %s and no v1 %s controller: %w", root, c, err)
		}
		if err := os.MkdirAll(filepath.Join(root, c, name), 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup %s/%s: %w", c, name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, v1Freezer)); err == nil {
		if err := os.MkdirAll(filepath.Join(root, v1Freezer, name), 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup %s/%s: %w", v1Freezer, name, err)
		}
		cg.freezer = true
	}
	return cg, nil
}

func (cg *cgroups) Version() string {
	if cg.V2 {
		return "v2"
	}
	return "v1"
}

func (cg *cgroups) dirs(id string) []string {
	if cg.V2 {
		return []string{filepath.Join(cg.Root, cg.Parent, id)}
	}
	var d []string
	for _, c := range v1Controllers {
		d = append(d, filepath.Join(cg.Root, c, cg.Parent, id))
	}
	if cg.freezer {
		d = append(d, filepath.Join(cg.Root, v1Freezer, cg.Parent, id))
	}
	return d
}

func (cg *cgroups) dir(id, controller string) string { return cg.Dir(id, controller) }

// Create makes the box's groups and sets its limits.
func (cg *cgroups) Create(id string, l isolate.Limits) error {
	for _, d := range cg.dirs(id) {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create cgroup: %w", err)
		}
	}
	if !cg.V2 {
		// Keep OOM kills inside the group and let the kernel report them.
		host.WriteFile(filepath.Join(cg.dir(id, "memory"), "memory.swappiness"), "0")
	}
	return cg.SetLimits(id, l)
}

// SetLimits applies l; zero fields mean unlimited.
func (cg *cgroups) SetLimits(id string, l isolate.Limits) error {
	const period = 100000
	if cg.V2 {
		d := cg.dir(id, "")
		mem, cpu, pids := "max", "max", "max"
		if l.Memory > 0 {
			mem = strconv.FormatInt(l.Memory, 10)
		}
		if l.CPUs > 0 {
			cpu = strconv.Itoa(int(l.CPUs * period))
		}
		if l.Pids > 0 {
			pids = strconv.Itoa(l.Pids)
		}
		if err := host.WriteFile(filepath.Join(d, "memory.max"), mem); err != nil {
			return err
		}
		if l.Memory > 0 {
			host.WriteFile(filepath.Join(d, "memory.swap.max"), "0") // absent without swap accounting
		}
		if err := host.WriteFile(filepath.Join(d, "cpu.max"), cpu+" "+strconv.Itoa(period)); err != nil {
			return err
		}
		return host.WriteFile(filepath.Join(d, "pids.max"), pids)
	}
	mem := "-1"
	if l.Memory > 0 {
		mem = strconv.FormatInt(l.Memory, 10)
	}
	md := cg.dir(id, "memory")
	if err := host.WriteFile(filepath.Join(md, "memory.limit_in_bytes"), mem); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(md, "memory.memsw.limit_in_bytes")); err == nil {
		host.WriteFile(filepath.Join(md, "memory.memsw.limit_in_bytes"), mem)
	}
	cd := cg.dir(id, "cpu")
	if err := host.WriteFile(filepath.Join(cd, "cpu.cfs_period_us"), strconv.Itoa(period)); err != nil {
		return err
	}
	quota := "-1"
	if l.CPUs > 0 {
		quota = strconv.Itoa(int(l.CPUs * period))
	}
	if err := host.WriteFile(filepath.Join(cd, "cpu.cfs_quota_us"), quota); err != nil {
		return err
	}
	pids := "max"
	if l.Pids > 0 {
		pids = strconv.Itoa(l.Pids)
	}
	// On v1 the limit sits on a child group holding the agent's launcher
	// thread and so every command: the agent's own threads stay outside
	// it, and a fork bomb cannot starve the agent of threads.
	cmds := filepath.Join(cg.dir(id, "pids"), "cmds")
	if err := os.Mkdir(cmds, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create cgroup: %w", err)
	}
	return host.WriteFile(filepath.Join(cmds, "pids.max"), pids)
}

// Add moves pid into the box's groups.
func (cg *cgroups) Add(id string, pid int) error {
	for _, d := range cg.dirs(id) {
		if err := host.WriteFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// Kill sends SIGKILL to every process left in the box's groups, and thaws
// them if they were frozen so that they die.
func (cg *cgroups) Kill(id string) {
	defer cg.Thaw(id)
	dirs := cg.dirs(id)
	if !cg.V2 {
		dirs = append(dirs, filepath.Join(cg.dir(id, "pids"), "cmds"))
	}
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// Remove deletes the box's groups, waiting briefly for exiting processes.
// It is idempotent.
func (cg *cgroups) Remove(id string) error {
	var last error
	dirs := cg.dirs(id)
	if !cg.V2 {
		dirs = append([]string{filepath.Join(cg.dir(id, "pids"), "cmds")}, dirs...)
	}
	for _, d := range dirs {
		if err := host.RemoveGroup(d, time.Second); err != nil {
			last = err
		}
	}
	return last
}

// MoveLauncher puts the agent's launcher thread (tid, a host id) in the
// commands' pids group (v1; on v2 the whole box shares one group).
func (cg *cgroups) MoveLauncher(id string, tid int) error {
	if cg.V2 {
		return nil
	}
	return host.WriteFile(filepath.Join(cg.dir(id, "pids"), "cmds", "tasks"), strconv.Itoa(tid))
}

// Procs lists the host pids in the box's groups.
func (cg *cgroups) Procs(id string) []int {
	var out []int
	for _, d := range []string{cg.dir(id, "pids"), filepath.Join(cg.dir(id, "pids"), "cmds")} {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// Freeze freezes (frozen) or thaws the box's processes, the agent's
// launcher and commands included, and waits until the kernel reports the
// whole group in that state. If ctx ends first, a freeze is undone.
func (cg *cgroups) Freeze(ctx context.Context, id string, frozen bool) error {
	var file, value string
	var done func() (bool, error)
	if cg.V2 {
		d := cg.dir(id, "")
		file, value = filepath.Join(d, "cgroup.freeze"), "0"
		want := "frozen 0"
		if frozen {
			value, want = "1", "frozen 1"
		}
		events := filepath.Join(d, "cgroup.events")
		done = func() (bool, error) {
			b, err := os.ReadFile(events)
			if err != nil {
				return false, err
			}
			for _, line := range strings.Split(string(b), "\n") {
				if line == want {
					return true, nil
				}
			}
			return false, nil
		}
	} else {
		if !cg.freezer {
			return errors.New("this host has no cgroup v1 freezer controller")
		}
		if err := cg.joinFreezer(id); err != nil {
			return err
		}
		file, value = filepath.Join(cg.dir(id, v1Freezer), "freezer.state"), "THAWED"
		if frozen {
			value = "FROZEN"
		}
		polls := 0
		done = func() (bool, error) {
			b, err := os.ReadFile(file)
			if err != nil {
				return false, err
			}
			if s := strings.TrimSpace(string(b)); s == value {
				return true, nil
			}
			// Still FREEZING now and then: ask again, which kicks tasks
			// that were busy in the kernel the first time (as runc does).
			if polls++; polls%8 == 0 {
				return false, host.WriteFile(file, value)
			}
			return false, nil
		}
	}
	if err := host.WriteFile(file, value); err != nil {
		return err
	}
	// Each process freezes itself when it next runs, so a freeze takes
	// about a scheduling round (well under a millisecond on an idle host,
	// some milliseconds on a busy one); there is no event to wait for on
	// v1, so poll, often: a read costs microseconds.
	for wait := 20 * time.Microsecond; ; wait = min(2*wait, 200*time.Microsecond) {
		ok, err := done()
		if ok || err != nil {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if frozen {
				cg.Thaw(id)
			}
			return fmt.Errorf("box %s still not %s: %w", id, map[bool]string{true: "frozen", false: "thawed"}[frozen], ctx.Err())
		}
	}
}

// Thaw lets the box's processes run if they were frozen, without waiting.
func (cg *cgroups) Thaw(id string) {
	if cg.V2 {
		host.WriteFile(filepath.Join(cg.dir(id, ""), "cgroup.freeze"), "0")
	} else if cg.freezer {
		host.WriteFile(filepath.Join(cg.dir(id, v1Freezer), "freezer.state"), "THAWED")
	}
}

// Frozen reports whether the box's processes are frozen (or freezing).
func (cg *cgroups) Frozen(id string) bool {
	if cg.V2 {
		b, _ := os.ReadFile(filepath.Join(cg.dir(id, ""), "cgroup.freeze"))
		return strings.TrimSpace(string(b)) == "1"
	}
	if !cg.freezer {
		return false
	}
	b, _ := os.ReadFile(filepath.Join(cg.dir(id, v1Freezer), "freezer.state"))
	s := strings.TrimSpace(string(b))
	return s == "FROZEN" || s == "FREEZING"
}

// joinFreezer gives a box started without a freezer group (by a daemon
// from before pausing existed) one holding all its processes.
func (cg *cgroups) joinFreezer(id string) error {
	d := cg.dir(id, v1Freezer)
	if err := os.Mkdir(d, 0o755); errors.Is(err, os.ErrExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("create cgroup: %w", err)
	}
	// A process forking meanwhile may leave a child behind: go again until
	// a pass finds nothing left to move.
	moved := map[int]bool{}
	for pass := 0; pass < 100; pass++ {
		more := false
		for _, pid := range cg.Procs(id) {
			if !moved[pid] {
				moved[pid], more = true, true
				host.WriteFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)) // it may have exited
			}
		}
		if !more {
			return nil
		}
	}
	return fmt.Errorf("box %s: its processes keep forking; cannot move them to a freezer group", id)
}
