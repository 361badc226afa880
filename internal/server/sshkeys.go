package server

import (
	"context"
	"crypto/rsa"
	"net/http"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/sandbox"
)

// SSH keys authorised for den's SSH gateway: the routes and their checks.
// The keys are kept by sandbox.Credentials, owned by the token that added
// them ("" for the admin). The gateway finds a key by its fingerprint
// (SSHKeyByFingerprint) and acts for the key's owner, narrowed to the
// key's sandbox when it has one.

// minRSABits is the smallest RSA key accepted.
const minRSABits = 2048

func (s *Server) sshKeyRoutes() {
	h := s.mux.HandleFunc
	h("POST /v1/ssh-keys", s.addSSHKey)
	h("GET /v1/ssh-keys", s.listSSHKeys)
	h("DELETE /v1/ssh-keys/{id}", s.removeSSHKey)
}

// keyManager returns the principal of a request that may manage SSH keys:
// the admin or a scoped token, not a session of an SSH key itself.
func keyManager(r *http.Request) (*Principal, error) {
	p := PrincipalFrom(r.Context())
	switch {
	case p == nil:
		return nil, api.Errorf(api.KindUnauthorized, "no credentials: SSH keys are managed with the admin's or a scoped token")
	case p.Sandbox != "":
		return nil, api.Errorf(api.KindUnauthorized, "a principal confined to sandbox %s cannot manage SSH keys", p.Sandbox)
	}
	return p, nil
}

func (s *Server) addSSHKey(w http.ResponseWriter, r *http.Request) {
	p, err := keyManager(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req api.SSHKeyRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	key, err := parseSSHKey(req)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx := r.Context()
	if req.Sandbox != "" {
		sb, err := s.m.Get(ctx, req.Sandbox)
		if err != nil {
			writeError(w, api.FieldError("sandbox", "%v", err))
			return
		}
		key.Sandbox = sb.ID
	}
	all, err := s.creds.SSHKeys(ctx)
	if err != nil {
		writeError(w, err)
		return
	}
	for _, k := range all {
		if k.Fingerprint != key.Fingerprint {
			continue
		}
		if p.Admin || k.Owner == p.TokenID {
			writeError(w, api.Errorf(api.KindExists, "key %s is already authorised as %s: remove it first (den ssh-key rm %s)", key.Fingerprint, k.ID, k.ID))
		} else {
			writeError(w, api.Errorf(api.KindExists, "key %s is already authorised by another token: one key acts for one principal", key.Fingerprint))
		}
		return
	}
	key.Owner = p.TokenID
	if err := s.creds.AddSSHKey(ctx, key, p.Name); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 201, key)
}

// parseSSHKey validates a request and describes the key it names.
func parseSSHKey(req api.SSHKeyRequest) (*api.SSHKey, error) {
	line := strings.TrimSpace(req.PublicKey)
	if line == "" {
		return nil, api.FieldError("public_key", "no key: give one line of a .pub or authorized_keys file, like \"ssh-ed25519 AAAA... you@host\"")
	}
	if strings.HasPrefix(line, "-----BEGIN") {
		return nil, api.FieldError("public_key", "this is a private key: give the public one (the .pub file)")
	}
	if strings.ContainsAny(line, "\r\n") {
		return nil, api.FieldError("public_key", "one key at a time: the value has more than one line")
	}
	pub, comment, opts, rest, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return nil, api.FieldError("public_key", "not an OpenSSH public key (%v): give one line of a .pub file, like \"ssh-ed25519 AAAA... you@host\"", err)
	}
	if len(opts) > 0 || len(rest) > 0 {
		return nil, api.FieldError("public_key", "authorized_keys options (%s) are not accepted: give the key alone; restrict it with sandbox", strings.Join(opts, ","))
	}
	if _, ok := pub.(*ssh.Certificate); ok {
		return nil, api.FieldError("public_key", "certificates are not accepted: give the plain public key")
	}
	if ck, ok := pub.(ssh.CryptoPublicKey); ok {
		if rk, ok := ck.CryptoPublicKey().(*rsa.PublicKey); ok && rk.N.BitLen() < minRSABits {
			return nil, api.FieldError("public_key", "an RSA key of %d bits is too weak: use at least %d bits, or ed25519", rk.N.BitLen(), minRSABits)
		}
	}
	if pub.Type() == ssh.KeyAlgoDSA {
		return nil, api.FieldError("public_key", "DSA keys are not accepted: use ed25519, ecdsa or RSA")
	}
	name := req.Name
	if name == "" && validKeyName(comment) {
		name = comment
	} else if name != "" && !validKeyName(name) {
		return nil, api.FieldError("name", "%q: use 1 to 64 letters, digits and . _ @ -", name)
	}
	return &api.SSHKey{
		Name:        name,
		Type:        pub.Type(),
		Fingerprint: ssh.FingerprintSHA256(pub),
		PublicKey:   strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))),
	}, nil
}

func validKeyName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._@-", c)) {
			return false
		}
	}
	return true
}

func (s *Server) listSSHKeys(w http.ResponseWriter, r *http.Request) {
	p, err := keyManager(r)
	if err != nil {
		writeError(w, err)
		return
	}
	all, err := s.creds.SSHKeys(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := []*api.SSHKey{}
	for _, k := range all {
		if p.Admin || k.Owner == p.TokenID {
			out = append(out, k)
		}
	}
	writeJSON(w, 200, out)
}

func (s *Server) removeSSHKey(w http.ResponseWriter, r *http.Request) {
	p, err := keyManager(r)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx := r.Context()
	all, err := s.creds.SSHKeys(ctx)
	if err != nil {
		writeError(w, err)
		return
	}
	var mine []*api.SSHKey
	for _, k := range all {
		if p.Admin || k.Owner == p.TokenID {
			mine = append(mine, k)
		}
	}
	k, err := sandbox.FindSSHKey(mine, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if err := s.creds.RemoveSSHKey(ctx, k, p.Name); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}

// SSHKeyByFingerprint returns the authorised key with OpenSSH's SHA256
// fingerprint fp, or a not_found *api.Error: the SSH gateway's look-up.
func (s *Server) SSHKeyByFingerprint(ctx context.Context, fp string) (*api.SSHKey, error) {
	return s.creds.SSHKeyByFingerprint(ctx, fp)
}
