package sandbox

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/isolate"
)

// Attribute names the process of a sandbox that owns the TCP connection
// from src (the sandbox side of a connection den's proxy accepted): the
// socket's inode from the sandbox's /proc/net/tcp, the process holding it,
// its process group, and the agent's process of that group. "" when it
// cannot tell (the socket is gone, or a process outside the agent's).
//
// It costs a few reads of /proc, so it is rationed: at most
// attributeRate per second per sandbox (a burst of attributeBurst); past
// that a connection goes unattributed rather than slowing the proxy.
func (m *Manager) Attribute(sandbox string, src netip.AddrPort) string {
	m.mu.Lock()
	b := m.boxes[sandbox]
	ok := m.attributeToken(sandbox)
	m.mu.Unlock()
	if b == nil || !ok {
		return ""
	}
	pid := b.Pid()
	inode := socketInode(pid, src.Port())
	if inode == "" {
		return ""
	}
	var hostPid int
	if pl, ok := b.(interface{ Procs() []int }); ok {
		hostPid = socketOwnerIn(pl.Procs(), inode)
	} else {
		hostPid = socketOwner(pid, inode)
	}
	if hostPid == 0 {
		return ""
	}
	pgid := statField(hostPid, 5) // host pid of the process group leader
	nsPgid := nsPid(pgid)
	for _, p := range m.agentProcs(sandbox, b) {
		if p.Pid == nsPgid && p.State == api.ProcRunning {
			return fmt.Sprintf("%s (%s)", p.ID, strings.Join(p.Cmd, " "))
		}
	}
	return fmt.Sprintf("pid %d (%s)", nsPid(hostPid), comm(hostPid))
}

const (
	attributeRate  = 10.0
	attributeBurst = 20.0
)

type bucket struct {
	tokens float64
	at     time.Time
}

// attributeToken takes a token from the sandbox's bucket. Call with m.mu held.
func (m *Manager) attributeToken(id string) bool {
	if m.attrBuckets == nil {
		m.attrBuckets = map[string]*bucket{}
	}
	b := m.attrBuckets[id]
	now := time.Now()
	if b == nil {
		b = &bucket{tokens: attributeBurst, at: now}
		m.attrBuckets[id] = b
	}
	b.tokens = min(attributeBurst, b.tokens+now.Sub(b.at).Seconds()*attributeRate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// procCache keeps each sandbox's process list briefly: attribution runs
// for every connection and must stay cheap.
type procCache struct {
	at    time.Time
	procs []api.ProcessInfo
}

func (m *Manager) agentProcs(id string, b isolate.Box) []api.ProcessInfo {
	m.mu.Lock()
	c, ok := m.procCache[id]
	m.mu.Unlock()
	if ok && time.Since(c.at) < time.Second {
		return c.procs
	}
	return m.fetchProcs(id, b, 200*time.Millisecond)
}

// fetchProcs asks a sandbox's agent for its process list, waiting at most
// wait, and keeps it in procCache (nil, and none kept, if the agent does
// not answer).
func (m *Manager) fetchProcs(id string, b isolate.Box, wait time.Duration) []api.ProcessInfo {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var procs []api.ProcessInfo
	if err := b.Agent().JSON(ctx, "GET", "/procs", nil, nil, &procs); err != nil {
		m.mu.Lock()
		delete(m.procCache, id)
		m.mu.Unlock()
		return nil
	}
	m.mu.Lock()
	if m.procCache == nil {
		m.procCache = map[string]procCache{}
	}
	m.procCache[id] = procCache{time.Now(), procs}
	m.mu.Unlock()
	return procs
}

// socketInode finds the inode of the TCP socket bound to port in the
// network namespace of pid.
func socketInode(pid int, port uint16) string {
	want := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) > 9 && strings.HasSuffix(fs[1], want) {
				return fs[9]
			}
		}
	}
	return ""
}

// socketOwner is the host pid of a process in init's pid namespace
// holding socket inode.
func socketOwner(initPid int, inode string) int {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", initPid))
	if err != nil {
		return 0
	}
	target := "socket:[" + inode + "]"
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == initPid {
			continue
		}
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); l != ns {
			continue
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			if l, _ := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name())); l == target {
				return pid
			}
		}
	}
	return 0
}

// socketOwnerIn is the pid among pids holding socket inode.
func socketOwnerIn(pids []int, inode string) int {
	target := "socket:[" + inode + "]"
	for _, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		fds, _ := os.ReadDir(dir)
		for _, fd := range fds {
			if l, _ := os.Readlink(filepath.Join(dir, fd.Name())); l == target {
				return pid
			}
		}
	}
	return 0
}

// statField reads field n (1-based) of /proc/PID/stat, after the comm.
func statField(pid, n int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	fs := strings.Fields(s[i+1:])
	if n-3 < 0 || n-3 >= len(fs) {
		return 0
	}
	v, _ := strconv.Atoi(fs[n-3])
	return v
}

// nsPid is the pid of host pid as its own (innermost) namespace sees it.
func nsPid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			fs := strings.Fields(v)
			if len(fs) > 0 {
				n, _ := strconv.Atoi(fs[len(fs)-1])
				return n
			}
		}
	}
	return 0
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}
