// Package isolate is the seam between den's sandbox manager and its
// isolation tiers. A Runtime boots a Box from a Spec (its root filesystem
// layers, limits and identity) and hands back a client of the den agent
// running as PID 1 inside it; everything above this seam (exec, files,
// lifecycle) is the same for every tier. Optional abilities of a tier are
// separate small interfaces, asserted where used.
package isolate

import (
	"context"
	"net"
	"time"

	"github.com/den-dev/den/internal/agent"
)

// Spec describes one box.
type Spec struct {
	ID       string
	Hostname string
	// Dir is the box's persistent state directory (writable layers).
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
}

// Overlay is one copy-on-write mount of the root filesystem.
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

// Stats is a box's live resource use.
type Stats struct {
	CPU        time.Duration // CPU time used since the box started
	Memory     int64         // bytes of memory in use
	Pids       int           // processes and threads
	NetRxBytes int64         // bytes received on the box's interfaces
	NetTxBytes int64         // bytes sent
}

// Statser is the optional ability of a box to report its resource use.
type Statser interface {
	Stats() (Stats, error)
}

// Networker is the optional ability of a box to gain or lose its network
// interface while it runs.
type Networker interface {
	AttachNet() (addr string, err error)
	DetachNet() error
	SetBandwidth(bytesPerSecond int64) error
}

// Dialer is the optional ability to open a TCP connection to a port inside
// the box as its own loopback sees it (servers bound to 127.0.0.1 too).
type Dialer interface {
	DialInside(ctx context.Context, port int) (net.Conn, error)
}
