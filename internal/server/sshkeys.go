package server

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/store"
)

// SSH keys authorised for den's SSH gateway are objects of kind "sshkey"
// owned by the token that added them ("" for the admin). The gateway finds
// a key by its fingerprint (SSHKeyByFingerprint) and acts for the key's
// owner, narrowed to the key's sandbox when it has one.

const sshKeyKind = "sshkey"

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
	all, err := s.sshKeys(ctx)
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
	var b [16]byte
	rand.Read(b[:])
	key.ID, key.Owner = hex.EncodeToString(b[:]), p.TokenID
	doc, err := json.Marshal(key)
	if err != nil {
		writeError(w, err)
		return
	}
	o := &store.Object{Kind: sshKeyKind, ID: key.ID, Owner: key.Owner, Doc: doc}
	if err := s.db.PutObject(ctx, o); err != nil {
		writeError(w, err)
		return
	}
	key.CreatedAt = o.CreatedAt
	s.sshKeyEvent(ctx, key.Sandbox, "sshkey.add", p, key)
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
	all, err := s.sshKeys(r.Context())
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
	all, err := s.sshKeys(ctx)
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
	k, err := findSSHKey(mine, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if err := s.db.DeleteObject(ctx, sshKeyKind, k.ID); err != nil {
		writeError(w, err)
		return
	}
	s.sshKeyEvent(ctx, k.Sandbox, "sshkey.rm", p, k)
	w.WriteHeader(204)
}

// findSSHKey picks a key by id, name or id prefix (at least 4 characters).
func findSSHKey(keys []*api.SSHKey, ref string) (*api.SSHKey, error) {
	var byName, byPrefix []*api.SSHKey
	for _, k := range keys {
		switch {
		case k.ID == ref:
			return k, nil
		case k.Name == ref:
			byName = append(byName, k)
		case len(ref) >= store.MinPrefix && strings.HasPrefix(k.ID, ref):
			byPrefix = append(byPrefix, k)
		}
	}
	for _, list := range [][]*api.SSHKey{byName, byPrefix} {
		switch len(list) {
		case 0:
			continue
		case 1:
			return list[0], nil
		default:
			return nil, api.Errorf(api.KindConflict, "%q names %d SSH keys: use the id (see den ssh-key ls)", ref, len(list))
		}
	}
	return nil, api.Errorf(api.KindNotFound, "no SSH key %q: see den ssh-key ls", ref)
}

// sshKeys returns every authorised key.
func (s *Server) sshKeys(ctx context.Context) ([]*api.SSHKey, error) {
	objs, err := s.db.ListObjects(ctx, sshKeyKind, "")
	if err != nil {
		return nil, err
	}
	out := make([]*api.SSHKey, 0, len(objs))
	for _, o := range objs {
		var k api.SSHKey
		if err := json.Unmarshal(o.Doc, &k); err != nil {
			return nil, fmt.Errorf("ssh key %s: %w", o.ID, err)
		}
		k.ID, k.Owner, k.CreatedAt = o.ID, o.Owner, o.CreatedAt
		out = append(out, &k)
	}
	return out, nil
}

// SSHKeyByFingerprint returns the authorised key with OpenSSH's SHA256
// fingerprint fp, or a not_found *api.Error: the SSH gateway's look-up.
func (s *Server) SSHKeyByFingerprint(ctx context.Context, fp string) (*api.SSHKey, error) {
	all, err := s.sshKeys(ctx)
	if err != nil {
		return nil, err
	}
	for _, k := range all {
		if k.Fingerprint == fp {
			return k, nil
		}
	}
	return nil, api.Errorf(api.KindNotFound, "no SSH key with fingerprint %s", fp)
}

// sshKeyEvent records who added or removed a key.
func (s *Server) sshKeyEvent(ctx context.Context, sandbox, typ string, p *Principal, k *api.SSHKey) {
	b, _ := json.Marshal(map[string]string{"key": k.ID, "fingerprint": k.Fingerprint, "name": k.Name, "by": p.Name})
	if err := s.db.AddEvent(context.WithoutCancel(ctx), &store.Event{Sandbox: sandbox, Type: typ, Data: b}); err != nil {
		s.log.Warn("event log", "type", typ, "err", err)
	}
}
