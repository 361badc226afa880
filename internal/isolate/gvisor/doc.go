// Package gvisor is den's gVisor isolation tier: each box is a runsc
// sandbox, so its processes talk to gVisor's user-space kernel (the
// sentry), never to the host's. The root filesystem is the same overlay
// layout as the linux tier's (spec.Dir/upper/<name>, work/<name>), mounted
// on the host without id mapping: runsc's gofer runs as host root and
// stores the ids the box sees, so uppers hold canonical ids and a box can
// move between tiers with its files. den writes the OCI bundle itself;
// volumes are host bind mounts (read-only, nosuid, nodev as asked, never
// their submounts) handed to runsc as OCI binds. The den binary, copied
// once per version into a root-owned host directory, is bind-mounted
// read-only at /dev/.den (gVisor's own tmpfs) and runs as the box's PID 1.
// The daemon reaches it over an agent.Link on the box's stdin and stdout,
// two FIFOs in the box's run directory: they carry no host socket (which
// gVisor cannot checkpoint), survive a daemon restart (Load reopens them)
// and are handed anew to runsc restore. A networked box's sandbox joins a
// network namespace pinned in its run directory, whose eth0 is den's
// bridge slot; gVisor's netstack takes that interface over, so den's
// nftables rules and egress proxy apply as on the linux tier (a network
// cannot be attached or detached while the box runs: no Networker).
// Limits are runsc's cgroups (under the daemon's parent, as the linux
// tier's; SetLimits writes them directly); gVisor's kernel sizes its memory by the limit,
// and a box exceeding it is OOM-killed as a whole. Pause, checkpoint and
// restore are runsc's; a checkpoint that keeps the box running restores it
// at once into a new sandbox (this runsc's --leave-running cannot be used
// with detached stdio). runsc keeps its state under RunDir/state.
package gvisor
