package confine

import (
	"fmt"
	"strconv"
	"strings"
)

// Cap is a Linux capability number (see capabilities(7)).
type Cap int

// Linux capabilities, numbered as in <linux/capability.h>.
const (
	CapChown             Cap = 0
	CapDacOverride       Cap = 1
	CapDacReadSearch     Cap = 2
	CapFowner            Cap = 3
	CapFsetid            Cap = 4
	CapKill              Cap = 5
	CapSetgid            Cap = 6
	CapSetuid            Cap = 7
	CapSetpcap           Cap = 8
	CapLinuxImmutable    Cap = 9
	CapNetBindService    Cap = 10
	CapNetBroadcast      Cap = 11
	CapNetAdmin          Cap = 12
	CapNetRaw            Cap = 13
	CapIpcLock           Cap = 14
	CapIpcOwner          Cap = 15
	CapSysModule         Cap = 16
	CapSysRawio          Cap = 17
	CapSysChroot         Cap = 18
	CapSysPtrace         Cap = 19
	CapSysPacct          Cap = 20
	CapSysAdmin          Cap = 21
	CapSysBoot           Cap = 22
	CapSysNice           Cap = 23
	CapSysResource       Cap = 24
	CapSysTime           Cap = 25
	CapSysTtyConfig      Cap = 26
	CapMknod             Cap = 27
	CapLease             Cap = 28
	CapAuditWrite        Cap = 29
	CapAuditControl      Cap = 30
	CapSetfcap           Cap = 31
	CapMacOverride       Cap = 32
	CapMacAdmin          Cap = 33
	CapSyslog            Cap = 34
	CapWakeAlarm         Cap = 35
	CapBlockSuspend      Cap = 36
	CapAuditRead         Cap = 37
	CapPerfmon           Cap = 38
	CapBpf               Cap = 39
	CapCheckpointRestore Cap = 40

	// maxCap is the highest capability number the 64-bit capability
	// sets of capset(2) version 3 can represent.
	maxCap Cap = 63
)

var capNames = [...]string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER",
	"CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP",
	"CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST",
	"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD",
	"CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP",
	"CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
	"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

// String returns the capability's name, e.g. "CAP_CHOWN", or "CAP_<n>" for a
// number this package has no name for.
func (c Cap) String() string {
	if c >= 0 && int(c) < len(capNames) {
		return capNames[c]
	}
	return "CAP_" + strconv.Itoa(int(c))
}

// ParseCap parses a capability name such as "CAP_NET_RAW", "net_raw" or a
// decimal number in 0..63.
func ParseCap(name string) (Cap, error) {
	s := strings.ToUpper(strings.TrimSpace(name))
	if !strings.HasPrefix(s, "CAP_") {
		s = "CAP_" + s
	}
	for i, n := range capNames {
		if n == s {
			return Cap(i), nil
		}
	}
	if n, err := strconv.Atoi(strings.TrimPrefix(s, "CAP_")); err == nil && n >= 0 && Cap(n) <= maxCap {
		return Cap(n), nil
	}
	return 0, fmt.Errorf("unknown capability %q", name)
}

// CapNames returns the names of caps, in the given order.
func CapNames(caps []Cap) []string {
	out := make([]string, len(caps))
	for i, c := range caps {
		out[i] = c.String()
	}
	return out
}

// CapMask returns caps as a bit mask (bit n set for capability n), the format
// of the Cap* lines in /proc/<pid>/status. It fails on a number outside 0..63.
func CapMask(caps []Cap) (uint64, error) {
	var m uint64
	for _, c := range caps {
		if c < 0 || c > maxCap {
			return 0, fmt.Errorf("invalid capability %d: must be in 0..%d", int(c), int(maxCap))
		}
		m |= 1 << uint(c)
	}
	return m, nil
}
