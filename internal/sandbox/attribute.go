package sandbox

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/isolate"
)

// Attribute names the process of a sandbox that owns the socket at src
// (the sandbox side of a connection den's proxy accepted, network "tcp",
// or of a DNS query den's DNS received, "udp"): the socket's inode from
// the sandbox's /proc/net/{tcp,tcp6} or {udp,udp6}, the process holding
// it, its process group, and the agent's process of that group. When it
// cannot tell, process is "" and unknown says why (the socket is gone,
// no process holds it, the attribution is rationed, …).
//
// It costs a few reads of /proc, so it is rationed: at most
// attributeRate per second per sandbox (a burst of attributeBurst); past
// that a connection goes unattributed rather than slowing the proxy.
func (m *Manager) Attribute(sandbox, network string, src netip.AddrPort) (process, unknown string) {
	b := m.box(sandbox)
	ok := m.attr.take(sandbox, time.Now())
	if b == nil {
		return "", "the sandbox is not running"
	}
	if !ok {
		return "", fmt.Sprintf("attribution rationed (more than %g connections and queries a second)", attributeRate)
	}
	// Only a box whose processes are the host's (the linux tier) has its
	// sockets in the host's kernel.
	pl, ok := b.(isolate.ProcLister)
	if !ok {
		return "", "the sandbox's tier has a network stack of its own (gVisor's, or the VM's kernel), whose sockets den cannot see from the host"
	}
	inode, why := socketInode(b.Pid(), network, src)
	if inode == "" {
		return "", why
	}
	hostPid := socketOwnerIn(pl.Procs(), inode)
	if hostPid == 0 {
		return "", "no process of the sandbox holds the socket any more (it was closed, or its process exited)"
	}
	// What names the process is read now: it may be gone by the time the
	// agent answers.
	pgid := statField(hostPid, 5) // host pid of the process group leader
	nsPgid := nsPid(pgid)
	byPid := fmt.Sprintf("pid %d (%s)", nsPid(hostPid), comm(hostPid))
	// The recent list first; a process started since is looked up afresh.
	for _, fresh := range []bool{false, true} {
		procs, cached := m.agentProcs(sandbox, b, fresh)
		for _, p := range procs {
			if p.Pid == nsPgid && p.State == api.ProcRunning {
				return fmt.Sprintf("%s (%s)", p.ID, strings.Join(p.Cmd, " ")), ""
			}
		}
		if !cached {
			break
		}
	}
	return byPid, ""
}

const (
	attributeRate  = 10.0
	attributeBurst = 20.0
)

type bucket struct {
	tokens float64
	at     time.Time
}

// attrRations is each sandbox's ration of attributions: a token bucket of
// attributeBurst tokens refilled at attributeRate a second.
type attrRations struct {
	// mu guards buckets.
	mu      sync.Mutex
	buckets map[string]*bucket
}

// take takes a token from id's bucket at now; false if it is empty.
func (r *attrRations) take(id string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.buckets == nil {
		r.buckets = map[string]*bucket{}
	}
	b := r.buckets[id]
	if b == nil {
		b = &bucket{tokens: attributeBurst, at: now}
		r.buckets[id] = b
	}
	b.tokens = min(attributeBurst, b.tokens+now.Sub(b.at).Seconds()*attributeRate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// drop forgets id's bucket.
func (r *attrRations) drop(id string) {
	r.mu.Lock()
	delete(r.buckets, id)
	r.mu.Unlock()
}

// agentProcs is the agent's process list of sandbox id: the one kept
// from the last second (cached true) unless fresh, else the agent's.
func (m *Manager) agentProcs(id string, b isolate.Box, fresh bool) (procs []api.ProcessInfo, cached bool) {
	c, ok := m.procs.get(id)
	if ok && !fresh && time.Since(c.at) < time.Second {
		return c.procs, true
	}
	return m.fetchProcs(id, b, 200*time.Millisecond), false
}

// fetchProcs asks a sandbox's agent for its process list, waiting at most
// wait, and keeps it in m.procs (nil, and none kept, if the agent does
// not answer).
func (m *Manager) fetchProcs(id string, b isolate.Box, wait time.Duration) []api.ProcessInfo {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var procs []api.ProcessInfo
	if err := b.Agent().JSON(ctx, "GET", agent.PathProcs, nil, nil, &procs); err != nil {
		m.procs.drop(id)
		return nil
	}
	m.procs.put(id, procs, time.Now())
	return procs
}

// socketInode finds the inode of the socket of network ("tcp" or "udp")
// whose local address is src in the network namespace of pid (for UDP, an
// unbound address on src's port too: a query sent from a socket that was
// never connected). why says why there is none.
func socketInode(pid int, network string, src netip.AddrPort) (inode, why string) {
	closed, read := false, 0
	for _, f := range []string{network, network + "6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil { // no IPv6 on this host: no tcp6 (the box's pid gone: neither)
			continue
		}
		read++
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) <= 9 {
				continue
			}
			local, ok := parseProcAddr(fs[1])
			if !ok || local.Port() != src.Port() {
				continue
			}
			if a := local.Addr().Unmap(); a != src.Addr().WithZone("").Unmap() && !(network == "udp" && a.IsUnspecified()) {
				continue
			}
			if fs[9] == "0" { // closed, in TIME_WAIT or the like: no file any more
				closed = true
				continue
			}
			return fs[9], ""
		}
	}
	switch {
	case read == 0:
		return "", "cannot read the sandbox's sockets in /proc"
	case closed:
		return "", "the socket was closed before den looked"
	}
	return "", "no such socket in the sandbox (it was closed before den looked, or the process exited)"
}

// parseProcAddr reads an address of /proc/net/{tcp,udp}[6]: hexadecimal
// 32-bit words in host byte order, a colon and the port in hexadecimal.
func parseProcAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	if !ok || err != nil || (len(h) != 8 && len(h) != 32) {
		return netip.AddrPort{}, false
	}
	var b [16]byte
	for i := 0; i < len(h)/8; i++ {
		w, err := strconv.ParseUint(h[8*i:8*i+8], 16, 32)
		if err != nil {
			return netip.AddrPort{}, false
		}
		binary.NativeEndian.PutUint32(b[4*i:], uint32(w))
	}
	a := netip.AddrFrom16(b)
	if len(h) == 8 {
		a = netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrPortFrom(a, uint16(port)), true
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
