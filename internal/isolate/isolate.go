// Package isolate is the seam between den's sandbox manager and its
// isolation tiers. A Runtime boots a Box from a Spec (its root filesystem
// layers, limits and identity) and hands back a client of the den agent
// running as PID 1 inside it; everything above this seam (exec, files,
// lifecycle) is the same for every tier. Optional abilities of a tier are
// separate small interfaces, declared here and asserted where used; each
// tier asserts at compile time every one it has (var _ isolate.Loader =
// (*Runtime)(nil)), and docs/design.md's table lists them by tier
// (TestAbilitiesDocumented checks both). The tiers share the host's
// plumbing through internal/host, never each other (TestTiersIndependent).
package isolate

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/storage"
)

// Spec describes one box.
type Spec struct {
	ID       string
	Hostname string
	// Dir is the box's persistent state directory: the writable layers
	// (upper/<name>, with the ids the box sees, and work/<name>).
	Dir string
	// Layers is the root filesystem: overlays mounted in order, the first
	// at "/". Each has read-only lower directories (bottom first) and gets
	// its own writable upper directory under Dir.
	Layers []Overlay
	Limits Limits
	// UIDBase is the first host uid (and gid) of the box's 65536 ids; root
	// inside is UIDBase outside. Tiers without a user namespace ignore it.
	UIDBase int
	// Net gives the box a network interface (slot NetSlot) whose traffic
	// goes through den's egress proxy; without it the box has loopback only.
	Net     bool
	NetSlot int
	// NetBandwidth limits the network each way, bytes/second (0: none).
	NetBandwidth int64
	// Mounts are volumes and host directories mounted into the box after
	// its layers, in order (so a later one may sit inside an earlier one).
	Mounts []Mount
	// ShmSize is the size of the box's /dev/shm in bytes (0: 64 MiB).
	ShmSize int64
}

// Mount puts a host directory into a box.
type Mount struct {
	// Source is the host directory mounted (not its submounts).
	Source string
	// Target is the absolute path inside the box where it appears. It is
	// resolved inside the box's root (symlinks in the image cannot lead it
	// out); missing directories on the way are created, owned by root
	// inside.
	Target string
	// ReadOnly refuses every write through the mount (EROFS), to the box's
	// root too. Every mount is nosuid and nodev.
	ReadOnly bool
	// IDMapped shifts owners by the box's id mapping, so the directory
	// stores canonical ids (root inside is uid 0 on disk, uid 1000 inside
	// is 1000 on disk) as upper layers do, and any box sees its files with
	// the same owners: volumes want this. Without it, files keep host ids:
	// ids outside the box's range appear as the overflow id (65534)
	// inside and the box cannot create files owned by them.
	IDMapped bool
}

// Overlay is one copy-on-write mount of the root filesystem. Its upper
// directory stores canonical ids (what the box sees: root inside is uid 0
// on disk), so it can be copied to another box (fork, restore) or committed
// as a layer without a change of owners.
type Overlay struct {
	Target string   // "/" or an absolute path inside the box, like "/usr"
	Lowers []string // host directories, bottom first
	Name   string   // name of the writable upper directory under Spec.Dir
}

// Limits are resource limits. Zero means unlimited.
type Limits struct {
	CPUs   float64
	Memory int64
	Pids   int
	// Disk is the quota on the box's directory (0: none), which the
	// storage enforces; a tier that keeps a disk image there sizes it to
	// fit, so the box sees a full disk rather than I/O errors.
	Disk int64
}

// Runtime is one isolation tier.
type Runtime interface {
	Name() string
	// Start boots a box. Its writable layers persist in spec.Dir, so
	// starting again after Stop finds the files as they were.
	Start(ctx context.Context, spec *Spec) (Box, error)
	// Destroy removes a box's storage. It is idempotent.
	Destroy(ctx context.Context, spec *Spec) error
}

// Box is a running sandbox.
type Box interface {
	Agent() *agent.Client
	// Pid is the host pid of the box's first process.
	Pid() int
	// Stop kills every process of the box and keeps its storage. Idempotent.
	Stop(ctx context.Context) error
	// Done is closed when the box's processes are gone.
	Done() <-chan struct{}
	// OOMKills counts out-of-memory kills in the box so far.
	OOMKills() uint64
	// SetLimits changes the box's resource limits while it runs.
	SetLimits(Limits) error
}

// Pauser is the optional ability of a box to be frozen in place: Pause
// stops every process of the box, its agent included (which so answers
// nothing until Resume), and returns once all of them are frozen; a
// paused box uses no CPU and keeps its memory, files and network state.
// Resume lets them all run on from where they were. Both are idempotent.
// Stop works on a paused box. Boxes of every tier: linux (the cgroup
// freezer), gvisor (runsc pause), microvm (QMP stop).
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// Checkpointer is the optional ability of a runtime to save a running
// box's processes and memory to a directory and boot them again from it:
// hibernate, and snapshots and forks that keep running processes.
// Runtimes: gvisor (runsc checkpoint), microvm (QEMU migration).
type Checkpointer interface {
	// Checkpoint writes box b's state into dir (which it creates). With
	// keepRunning the box runs on afterwards; otherwise it is stopped as by
	// Stop (its storage stays).
	Checkpoint(ctx context.Context, b Box, dir string, keepRunning bool) error
	// Restore boots spec's box from a checkpoint in dir, taken of it or of
	// the box its files were copied from (a fork), with the processes
	// running on where they were.
	Restore(ctx context.Context, spec *Spec, dir string) (Box, error)
}

// Stats is a box's live resource use.
type Stats struct {
	CPU        time.Duration // CPU time used since the box started
	Memory     int64         // bytes of memory in use
	Pids       int           // processes and threads
	NetRxBytes int64         // bytes received on the box's interfaces
	NetTxBytes int64         // bytes sent
}

// Statser is the optional ability of a box to report its resource use.
// Boxes of every tier.
type Statser interface {
	Stats() (Stats, error)
}

// Networker is the optional ability of a box to gain or lose its network
// interface while it runs. Boxes: linux.
type Networker interface {
	AttachNet() (addr string, err error)
	DetachNet() error
	SetBandwidth(bytesPerSecond int64) error
}

// Dialer is the optional ability to open a TCP connection to a port inside
// the box as its own loopback sees it (servers bound to 127.0.0.1 too).
// Boxes: linux (a socket made in its network namespace), microvm
// (through the agent's link). Without it, den asks the box's agent to
// dial (agent.Client.DialPort).
type Dialer interface {
	DialInside(ctx context.Context, port int) (net.Conn, error)
}

// Cleaner is the optional ability of a runtime to remove what a box left
// outside its storage (processes, cgroups, network, mounts and run
// directory) when its daemon died in the middle of an operation; it
// returns the mount points it detached. Runtimes: linux, gvisor; a
// runtime without it is cleaned up by Destroy.
type Cleaner interface {
	Clean(ctx context.Context, spec *Spec) (unmounted []string, err error)
}

// Loader is the optional ability of a runtime to reattach to a box that
// outlived the daemon that started it: pid is what the box's Pid returned,
// and the box's agent must answer (a paused box's once it is resumed).
// Without it, the new daemon cleans up after the box and records it
// stopped. Runtimes: every tier.
type Loader interface {
	Load(ctx context.Context, spec *Spec, pid int) (Box, error)
}

// Adopter is the optional ability of a runtime to take over the files of a
// box another tier kept (escalation): Adopt makes spec's writable layers,
// as the other tier left them in spec.Dir, its own. Runtimes: microvm
// (moves the upper directories into its disk image); the linux and gvisor
// tiers share one layout and need nothing.
type Adopter interface {
	Adopt(ctx context.Context, spec *Spec) error
}

// Canonicalizer is the optional ability of a runtime to convert a stopped
// box's writable layers to the canonical id layout (files stored with the
// ids the box sees), which older daemons did not use; whoever copies a
// stopped box's layers (commit, snapshot, fork) calls it first. Runtimes:
// linux.
type Canonicalizer interface {
	Canonicalize(spec *Spec) error
}

// UDPAllower is the optional ability of a box to forward the UDP sent to
// the destinations its network policy's allow_cidr rules name; all other
// UDP but DNS is dropped. nil takes every allowance away. Boxes: linux.
type UDPAllower interface {
	AllowUDP(cidrs []netip.Prefix) error
}

// FrozenReporter is the optional ability of a box to say whether its
// processes are frozen (or freezing) whoever froze them: a daemon that
// died during a snapshot's capture leaves a running box frozen, and the
// next one thaws it. Boxes: linux.
type FrozenReporter interface {
	Frozen() bool
}

// ProcLister is the optional ability of a box whose processes are host
// processes to list them (host pids), so den can find which one holds a
// socket in the host's kernel. Boxes: linux (gVisor's and a VM's kernel
// keep their sockets and processes to themselves).
type ProcLister interface {
	Procs() []int
}

// RemoveStorage removes a box's storage, spec.Dir (nothing if it is
// empty): the last step of every tier's Destroy, once what the box left
// outside it is gone. Idempotent.
func RemoveStorage(spec *Spec) error {
	if spec.Dir == "" {
		return nil
	}
	if err := storage.RemoveTree(spec.Dir); err != nil {
		return fmt.Errorf("remove box storage: %w", err)
	}
	return nil
}

// TestStall is a test hook: when $DEN_TEST_STALL names a file that holds
// point, the operation on box id that reaches point creates FILE.ID and
// waits for ever, so a test can kill the daemon at that instant. Points:
// "mounted" (a linux box's root is mounted in the daemon's mount
// namespace), "frozen" (a snapshot or fork has frozen its source and copied
// its files, and has not thawed it yet), "teardown" (a removed sandbox's
// teardown, which the daemon's shutdown waits for, begins).
func TestStall(point, id string) {
	f := os.Getenv("DEN_TEST_STALL")
	if f == "" {
		return
	}
	if b, err := os.ReadFile(f); err != nil || strings.TrimSpace(string(b)) != point {
		return
	}
	os.WriteFile(f+"."+id, nil, 0o600)
	select {}
}
