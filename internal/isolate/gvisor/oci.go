package gvisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/host"
	"github.com/den-dev/den/internal/isolate"
)

// The parts of an OCI runtime configuration (config.json) den writes.
type ociSpec struct {
	OCIVersion string     `json:"ociVersion"`
	Process    ociProcess `json:"process"`
	Root       ociRoot    `json:"root"`
	Hostname   string     `json:"hostname,omitempty"`
	Mounts     []ociMount `json:"mounts"`
	Linux      ociLinux   `json:"linux"`
}

type ociProcess struct {
	User            ociUser    `json:"user"`
	Args            []string   `json:"args"`
	Env             []string   `json:"env"`
	Cwd             string     `json:"cwd"`
	Capabilities    ociCaps    `json:"capabilities"`
	Rlimits         []ociLimit `json:"rlimits,omitempty"`
	NoNewPrivileges bool       `json:"noNewPrivileges"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCaps struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Inheritable []string `json:"inheritable"`
	Permitted   []string `json:"permitted"`
}

type ociLimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces  []ociNamespace `json:"namespaces"`
	CgroupsPath string         `json:"cgroupsPath,omitempty"`
	Resources   *ociResources  `json:"resources,omitempty"`
}

type ociNamespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

type ociResources struct {
	Memory *ociMemory `json:"memory,omitempty"`
	CPU    *ociCPU    `json:"cpu,omitempty"`
	Pids   *ociPids   `json:"pids,omitempty"`
}

type ociMemory struct {
	Limit *int64 `json:"limit,omitempty"`
}

type ociCPU struct {
	Quota  *int64  `json:"quota,omitempty"`
	Period *uint64 `json:"period,omitempty"`
}

type ociPids struct {
	Limit int64 `json:"limit"`
}

// The agent's capabilities inside the sandbox (gVisor's own kernel): all
// of them; its launcher drops commands to den's container set.
var agentCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
	"CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
	"CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
	"CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
}

const cpuPeriod = 100000

func ociLimits(l isolate.Limits) *ociResources {
	res := &ociResources{}
	if l.Memory > 0 {
		m := l.Memory
		res.Memory = &ociMemory{Limit: &m}
	}
	if l.CPUs > 0 {
		q, p := int64(l.CPUs*cpuPeriod), uint64(cpuPeriod)
		res.CPU = &ociCPU{Quota: &q, Period: &p}
	}
	if l.Pids > 0 {
		res.Pids = &ociPids{Limit: hostPids(l.Pids)} // enforced inside too: pids.go
	}
	return res
}

// bundle is what a box's config.json is made of.
type bundle struct {
	spec     *isolate.Spec
	rootfs   string
	agentDir string   // host directory with the den binary, mounted read-only at agentDir
	binds    []string // host bind mounts of spec.Mounts, in order
	netns    string   // pinned network namespace, "" for none
	cgroup   string   // cgroups path
	tmpBind  bool     // bind the root's own /tmp over gVisor's tmpfs
}

func writeBundle(dir string, b bundle) error {
	all := append([]string(nil), agentCaps...)
	s := ociSpec{
		OCIVersion: "1.0.2",
		Process: ociProcess{
			Args: []string{agentPath, agentArg, pidsArg + strconv.Itoa(b.spec.Limits.Pids)},
			// As the linux tier's init: a small heap for an agent that
			// mostly waits.
			Env:          []string{"GOMAXPROCS=1", "GOGC=50", "GODEBUG=madvdontneed=1"},
			Cwd:          "/",
			Capabilities: ociCaps{Bounding: all, Effective: all, Inheritable: nil, Permitted: all},
			// The agent sets the same limit; this one holds from the start.
			Rlimits: []ociLimit{{Type: "RLIMIT_NOFILE", Hard: agent.FileLimit, Soft: agent.FileLimit}},
		},
		Root:     ociRoot{Path: b.rootfs},
		Hostname: b.spec.Hostname,
		Mounts: []ociMount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: append([]string{"nosuid", "noexec", "nodev"}, strings.Split(host.ShmOptions(b.spec.ShmSize), ",")...)},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: agentDir, Type: "bind", Source: b.agentDir, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		},
		Linux: ociLinux{
			Namespaces: []ociNamespace{
				{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"},
				{Type: "network", Path: b.netns},
			},
			CgroupsPath: b.cgroup,
			Resources:   ociLimits(b.spec.Limits),
		},
	}
	if b.tmpBind {
		s.Mounts = append(s.Mounts, ociMount{Destination: "/tmp", Type: "bind", Source: filepath.Join(b.rootfs, "tmp"), Options: []string{"bind", "rw", "nosuid", "nodev"}})
	}
	for i, m := range b.spec.Mounts {
		opts := []string{"bind", "rw", "nosuid", "nodev"}
		if m.ReadOnly {
			opts[1] = "ro"
		}
		s.Mounts = append(s.Mounts, ociMount{Destination: m.Target, Type: "bind", Source: b.binds[i], Options: opts})
	}
	data, err := json.MarshalIndent(s, "", "\t")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		return fmt.Errorf("write OCI config: %w", err)
	}
	return nil
}
