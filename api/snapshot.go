package api

import "time"

// Idle actions.
const (
	IdleStop      = "stop"
	IdlePause     = "pause"
	IdleHibernate = "hibernate"
)

// How a resume went (Sandbox.Resumed).
const (
	ResumedThawed    = "thawed"
	ResumedRestored  = "restored"
	ResumedRestarted = "restarted"
)

// Snapshot is a point-in-time copy of a sandbox's files (its writable
// layers; never the image beneath, never its volumes).
type Snapshot struct {
	ID      string `json:"id"`
	Name    string `json:"name,omitempty"`
	Sandbox string `json:"sandbox"` // the sandbox it was taken of
	// Owner is the scoped token whose snapshot it is; empty for the admin's.
	Owner string `json:"owner,omitempty"`
	Image string `json:"image"`
	// Size is the bytes the snapshot's files hold.
	Size Size `json:"size"`
	// Digest is the digest of the checksum manifest (every file's path,
	// type, mode, owner and SHA-256), verified whenever the snapshot is used.
	// Empty while the manifest is still being computed.
	Digest    string    `json:"digest,omitempty"`
	Files     int       `json:"files,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// Paused reports that the sandbox's processes were frozen for the
	// capture (false when it was stopped or hibernated: nothing to freeze).
	Paused bool `json:"paused"`
	// Runtime is the tier of the sandbox it was taken of; sandboxes
	// created from it default to it.
	Runtime string `json:"runtime,omitempty"`
	// Memory reports that the snapshot keeps the sandbox's running
	// processes and memory (gvisor and microvm tiers): sandboxes created
	// from it on the same tier, and restores, run on from that instant.
	Memory bool `json:"memory,omitempty"`
	// MemorySize is the bytes the saved memory takes on disk.
	MemorySize Size `json:"memory_size,omitempty"`
	// The sandbox's settings, applied to sandboxes created from it.
	Env     []string      `json:"env,omitempty"`
	Workdir string        `json:"workdir,omitempty"`
	User    string        `json:"user,omitempty"`
	Limits  Limits        `json:"limits"`
	Network NetworkPolicy `json:"network"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	Name string `json:"name,omitempty"`
	// Memory keeps the running processes and memory too, not only the
	// files (gvisor and microvm tiers; the linux tier answers
	// unsupported). The sandbox's processes are saved and restored in
	// place, so they pause for the length of the checkpoint.
	Memory bool `json:"memory,omitempty"`
}

// RestoreRequest is the body of POST /v1/sandboxes/{id}/restore.
type RestoreRequest struct {
	Snapshot string `json:"snapshot"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	// Count is how many forks to make (1 to 64; default 1).
	Count int `json:"count,omitempty"`
	// Labels are set on every fork (the source's labels are not copied).
	Labels map[string]string `json:"labels,omitempty"`
	// Memory makes forks that keep the source's running processes and
	// memory (gvisor and microvm tiers): each fork runs on from one
	// checkpoint of the source, with its own hostname and address
	// (connections that were open are not carried over).
	Memory bool `json:"memory,omitempty"`
}

// VolumeMount attaches a volume to a sandbox.
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"` // absolute, inside the sandbox
	ReadOnly bool   `json:"read_only,omitempty"`
}

// BindMount attaches a host directory the daemon's configuration allows.
type BindMount struct {
	Source   string `json:"source"` // host directory
	Target   string `json:"target"` // absolute, inside the sandbox
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Volume is persistent storage shared by sandboxes and outliving them.
type Volume struct {
	Name string `json:"name"`
	// Size caps the volume's bytes (0: no cap).
	Size      Size      `json:"size,omitempty"`
	Used      Size      `json:"used"`
	CreatedAt time.Time `json:"created_at"`
	// UsedBy lists the sandboxes that mount it.
	UsedBy []string `json:"used_by,omitempty"`
	// Owner is the scoped token whose volume it is; empty for the admin's.
	Owner string `json:"owner,omitempty"`
}

// VolumeRequest is the body of POST /v1/volumes.
type VolumeRequest struct {
	Name string `json:"name"`
	// Size is the volume's quota (btrfs storage only); 0: the daemon's
	// default disk quota, or a scoped token's disk cap.
	Size Size `json:"size,omitempty"`
}
