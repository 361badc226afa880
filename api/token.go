package api

import "time"

// TokenRequest is the body of POST /v1/tokens: a scoped API token for one
// agent, which sees and controls only the sandboxes it creates.
type TokenRequest struct {
	// Name labels the token (unique; letters, digits, '_', '.', '-').
	Name string `json:"name"`
	// MaxSandboxes bounds the sandboxes the token may have at once, in any
	// state (0: no bound). Creates and forks beyond it are refused.
	MaxSandboxes int `json:"max_sandboxes,omitempty"`
	// CPUs, Memory and Disk cap each of its sandboxes' limits (0: no
	// cap); a create without limits gets the caps as its limits. Disk also
	// caps the size of each volume it creates, and is the size of one
	// created without.
	CPUs   float64 `json:"cpus,omitempty"`
	Memory Size    `json:"memory,omitempty"`
	Disk   Size    `json:"disk,omitempty"`
	// MaxVolumes, MaxSnapshots and MaxImages bound the volumes, snapshots
	// and images (imported, built or committed) the token may have at
	// once (0: no bound).
	MaxVolumes   int `json:"max_volumes,omitempty"`
	MaxSnapshots int `json:"max_snapshots,omitempty"`
	MaxImages    int `json:"max_images,omitempty"`
}

// Token is a scoped API token as the admin sees it. The secret is in
// Token only in the answer of POST /v1/tokens: den keeps a hash of it.
type Token struct {
	ID           string    `json:"id"`
	Name         string    `json:"name"`
	MaxSandboxes int       `json:"max_sandboxes,omitempty"`
	CPUs         float64   `json:"cpus,omitempty"`
	Memory       Size      `json:"memory,omitempty"`
	Disk         Size      `json:"disk,omitempty"`
	MaxVolumes   int       `json:"max_volumes,omitempty"`
	MaxSnapshots int       `json:"max_snapshots,omitempty"`
	MaxImages    int       `json:"max_images,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	// Sandboxes is how many sandboxes the token has now.
	Sandboxes int `json:"sandboxes"`
	// Token is the secret to send as "Authorization: Bearer TOKEN", shown
	// once, when the token is made.
	Token string `json:"token,omitempty"`
}
