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
)

// Attribute names the process of a sandbox that owns the TCP connection
// from src (the sandbox side of a connection den's proxy accepted): the
// socket's inode from the sandbox's /proc/net/tcp, the process holding it,
// its process group, and the agent's process of that group. "" when it
// cannot tell (the socket is gone, or a process outside the agent's).
func (m *Manager) Attribute(sandbox string, src netip.AddrPort) string {
	m.mu.Lock()
	b := m.boxes[sandbox]
	m.mu.Unlock()
	if b == nil {
		return ""
	}
	pid := b.Pid()
	inode := socketInode(pid, src.Port())
	if inode == "" {
		return ""
	}
	hostPid := socketOwner(pid, inode)
	if hostPid == 0 {
		return ""
	}
	pgid := statField(hostPid, 5) // host pid of the process group leader
	nsPgid := nsPid(pgid)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var procs []api.ProcessInfo
	if err := b.Agent().JSON(ctx, "GET", "/procs", nil, nil, &procs); err == nil {
		for _, p := range procs {
			if p.Pid == nsPgid && p.State == api.ProcRunning {
				return fmt.Sprintf("%s (%s)", p.ID, strings.Join(p.Cmd, " "))
			}
		}
	}
	return fmt.Sprintf("pid %d (%s)", nsPid(hostPid), comm(hostPid))
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
