package agent

import (
	"bytes"
	"errors"
	"os"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// A process's tree is everything it started that still lives, wherever it
// went: the descendants that left its process group or session (setsid, a
// daemon's double fork) and those re-parented to the agent (PID 1) because
// their parent ended. Each command starts with procMarkEnv=<process id> in
// its environment, which its descendants inherit through fork, exec,
// setsid and re-parenting; a process is in the tree of p when it carries
// p's mark, or when it descends (by parent pid) from p's running command or
// from a process of the tree (so a child that cleared its environment is
// still found while its parent lives). The same mechanism works on every
// tier: it needs only /proc, which the linux tier's pid namespace, gVisor's
// sentry and a microVM's guest kernel all provide.
//
// The mark lives in the process's initial environment block: a descendant
// that both loses its parent (re-parented to the agent) and replaces its
// environment (exec with a cleared environment, or a program that rewrites
// the block for its title) is no longer found.
const procMarkEnv = "DEN_PROCESS"

// procEntry is one process of the sandbox as /proc shows it.
type procEntry struct {
	pid, ppid int
	mark      string // the value of procMarkEnv in its environment, if any
}

// procTable is one reading of /proc.
type procTable struct {
	byMark   map[string][]int
	children map[int][]int
}

// readProcs reads every process of the sandbox but the agent itself.
func readProcs() procTable {
	t := procTable{byMark: map[string][]int{}, children: map[int][]int{}}
	d, err := os.Open("/proc")
	if err != nil {
		return t
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	self := os.Getpid()
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self {
			continue
		}
		e, ok := readProc(pid)
		if !ok {
			continue
		}
		t.children[e.ppid] = append(t.children[e.ppid], pid)
		if e.mark != "" {
			t.byMark[e.mark] = append(t.byMark[e.mark], pid)
		}
	}
	return t
}

func readProc(pid int) (procEntry, bool) {
	st := procStat(pid)
	if !st.ok {
		return procEntry{}, false
	}
	e := procEntry{pid: pid, ppid: st.ppid}
	if env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ"); err == nil { // empty for zombies and kernel threads
		e.mark = envValue(env, procMarkEnv)
	}
	return e, true
}

// envValue finds key's value in a NUL-separated environment block.
func envValue(env []byte, key string) string {
	prefix := []byte(key + "=")
	for len(env) > 0 {
		kv := env
		if i := bytes.IndexByte(env, 0); i >= 0 {
			kv, env = env[:i], env[i+1:]
		} else {
			env = nil
		}
		if v, ok := bytes.CutPrefix(kv, prefix); ok {
			return string(v)
		}
	}
	return ""
}

// tree returns the pids of p's tree, not counting p's own command, sorted.
func (t procTable) tree(p *Process) []int {
	seen := map[int]bool{}
	var out []int
	var add func(pid int)
	add = func(pid int) {
		if seen[pid] {
			return
		}
		seen[pid] = true
		if pid != p.Pid {
			out = append(out, pid)
		}
		for _, c := range t.children[pid] {
			add(c)
		}
	}
	if !isDone(p) { // a finished command's pid may be another's now
		add(p.Pid)
	}
	for _, pid := range t.byMark[p.ID] {
		add(pid)
	}
	sort.Ints(out)
	return out
}

// maxStopRounds bounds killTree's rounds of stopping newly found
// processes; a tree that still grows after that is killed as found.
const maxStopRounds = 100

// signalTree sends sig to p's process group (while p runs) and to every
// process of its tree. SIGKILL first stops the tree, round after round until
// a reading of /proc finds no process not yet stopped, so that none forks a
// child the kill would miss (a fork with a signal pending is aborted), and
// then kills what it stopped.
func signalTree(p *Process, sig syscall.Signal) error {
	hasGroup := groupAlive(p)
	group := func(sig syscall.Signal) error {
		if !hasGroup {
			return nil
		}
		return syscall.Kill(-p.Pid, sig)
	}
	if sig != syscall.SIGKILL {
		err := group(sig)
		for _, pid := range readProcs().tree(p) {
			syscall.Kill(pid, sig)
		}
		return err
	}
	err := group(syscall.SIGSTOP)
	// Stop what the readings find until two in a row find nothing new (a
	// reading of /proc while processes come and go may miss one).
	stopped := map[int]bool{}
	quiet := 0
	for round := 0; round < maxStopRounds && quiet < 2; round++ {
		quiet++
		for _, pid := range readProcs().tree(p) {
			if !stopped[pid] {
				syscall.Kill(pid, syscall.SIGSTOP)
				stopped[pid], quiet = true, 0
			}
		}
	}
	group(syscall.SIGKILL)
	for pid := range stopped {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	// Wait until the tree is empty and what was killed is reaped (until
	// then it counts against the pids limit: a command started right after
	// the kill of a fork bomb would fail), killing any the readings missed.
	for deadline := time.Now().Add(killWait); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		left := false
		for _, pid := range readProcs().tree(p) {
			if !stopped[pid] {
				syscall.Kill(pid, syscall.SIGKILL)
				stopped[pid] = true
			}
			left = true
		}
		for pid := range stopped {
			if syscall.Kill(pid, 0) == nil {
				left = true
				break
			}
		}
		if !left {
			break
		}
	}
	if errors.Is(err, syscall.ESRCH) && len(stopped) > 0 {
		err = nil // the group was gone, not its tree
	}
	return err
}

// groupAlive reports whether p's process group is there to signal: while
// p runs, or after it ended when processes it left are still in the group
// (the group's id, p's pid, is then taken: no new process gets it; and if
// a process has that pid, the group is that process's now).
func groupAlive(p *Process) bool {
	if !isDone(p) {
		return true
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(p.Pid)); err == nil {
		return false
	}
	return syscall.Kill(-p.Pid, 0) == nil
}

// leftAlive reports whether a finished p left processes running.
func leftAlive(p *Process) bool {
	return groupAlive(p) || len(readProcs().tree(p)) > 0
}

// killWait bounds how long a kill waits for the processes it killed to be
// reaped.
const killWait = 5 * time.Second
