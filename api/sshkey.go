package api

import "time"

// SSHKey is a public key authorised for den's SSH gateway. It acts for
// whoever added it (the admin, or one scoped token), narrowed to one
// sandbox when Sandbox is set.
type SSHKey struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// Type is the key's algorithm ("ssh-ed25519", "ssh-rsa", ...).
	Type string `json:"type"`
	// Fingerprint is OpenSSH's SHA256 fingerprint ("SHA256:...").
	Fingerprint string `json:"fingerprint"`
	// PublicKey is the key in authorized_keys form, without a comment.
	PublicKey string `json:"public_key"`
	// Sandbox, when set, is the id of the one sandbox the key reaches.
	Sandbox string `json:"sandbox,omitempty"`
	// Owner is the id of the token that added the key; "" for the admin.
	Owner     string    `json:"owner,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// SSHKeyRequest is the body of POST /v1/ssh-keys.
type SSHKeyRequest struct {
	// PublicKey is one line of an authorized_keys file or a .pub file
	// ("ssh-ed25519 AAAA... comment"); options are not accepted.
	PublicKey string `json:"public_key"`
	// Name labels the key (default: the key's comment); letters, digits
	// and . _ @ -, at most 64.
	Name string `json:"name,omitempty"`
	// Sandbox restricts the key to one sandbox (id, prefix or name).
	Sandbox string `json:"sandbox,omitempty"`
}
