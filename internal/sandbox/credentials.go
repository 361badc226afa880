package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/store"
)

// Credentials keeps, beside the secrets, the daemon's scoped API tokens and
// the SSH keys authorised for its SSH gateway: what they are in the store,
// and the events that record their changes. Who may make or see which is
// the API server's to decide; it calls these methods.
//
// A token is an object of kind "token". Only the SHA-256 of its secret is
// kept; its id is the first 16 hex digits of that hash, so a request's
// token is found by id and then compared in full, in constant time.
//
// An SSH key is an object of kind "sshkey" owned by the token that added it
// ("" for the admin). The gateway finds a key by its fingerprint and acts
// for the key's owner, narrowed to the key's sandbox when it has one.
type Credentials struct {
	db  *store.DB
	log *slog.Logger
}

// NewCredentials returns the credentials kept in db.
func NewCredentials(db *store.DB, log *slog.Logger) *Credentials {
	if log == nil {
		log = slog.Default()
	}
	return &Credentials{db: db, log: log}
}

const (
	tokenKind  = "token"
	sshKeyKind = "sshkey"
)

// TokenPrefix starts the secret of every scoped token.
const TokenPrefix = "den_"

// tokenDoc is a token as stored: never the secret, only its hash.
type tokenDoc struct {
	api.Token
	Hash string `json:"hash"`
}

// hashSecret is the id and the full hex SHA-256 of a token's secret.
func hashSecret(secret string) (id, hash string) {
	sum := sha256.Sum256([]byte(secret))
	hash = hex.EncodeToString(sum[:])
	return hash[:16], hash
}

// event records a change; a failure to record it is logged.
func (c *Credentials) event(ctx context.Context, sandbox, typ string, data any) {
	b, _ := json.Marshal(data)
	if err := c.db.AddEvent(context.WithoutCancel(ctx), &store.Event{Sandbox: sandbox, Type: typ, Data: b}); err != nil {
		c.log.Warn("event log", "type", typ, "err", err)
	}
}

// CreateToken makes a scoped token with req's name, quota and caps (checked
// by the caller). The answer holds its secret, which is kept nowhere.
func (c *Credentials) CreateToken(ctx context.Context, req api.TokenRequest) (*api.Token, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("token secret: %w", err)
	}
	secret := TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	id, hash := hashSecret(secret)
	doc := tokenDoc{Token: api.Token{ID: id, Name: req.Name, MaxSandboxes: req.MaxSandboxes, CPUs: req.CPUs, Memory: req.Memory, Disk: req.Disk,
		MaxVolumes: req.MaxVolumes, MaxSnapshots: req.MaxSnapshots, MaxImages: req.MaxImages, CreatedAt: time.Now().UTC()}, Hash: hash}
	raw, _ := json.Marshal(doc)
	err := c.db.PutObject(ctx, &store.Object{Kind: tokenKind, ID: id, Name: req.Name, CreatedAt: doc.CreatedAt, Doc: raw})
	if errors.Is(err, store.ErrExists) {
		return nil, api.Errorf(api.KindExists, "a token named %q already exists: pick another name, or den token rm %s first", req.Name, req.Name)
	}
	if err != nil {
		return nil, err
	}
	c.event(ctx, "", "token.create", map[string]any{"id": id, "name": req.Name})
	t := doc.Token
	t.Token = secret
	return &t, nil
}

func decodeToken(o *store.Object) (*tokenDoc, error) {
	var d tokenDoc
	if err := json.Unmarshal(o.Doc, &d); err != nil {
		return nil, fmt.Errorf("token %s: %w", o.ID, err)
	}
	return &d, nil
}

// token finds a token by its exact id.
func (c *Credentials) token(ctx context.Context, id string) (*tokenDoc, error) {
	o, err := c.db.GetObject(ctx, tokenKind, id)
	if err == nil && o.ID != id {
		err = store.ErrNotFound
	}
	if err != nil {
		return nil, api.Errorf(api.KindNotFound, "no token %q", id)
	}
	return decodeToken(o)
}

// Token is the token with exactly this id (not a prefix, not a name), or a
// not_found error.
func (c *Credentials) Token(ctx context.Context, id string) (*api.Token, error) {
	d, err := c.token(ctx, id)
	if err != nil {
		return nil, err
	}
	return &d.Token, nil
}

// TokenForSecret is the token whose secret this is, or a not_found error.
func (c *Credentials) TokenForSecret(ctx context.Context, secret string) (*api.Token, error) {
	id, hash := hashSecret(secret)
	d, err := c.token(ctx, id)
	if err != nil {
		return nil, err
	}
	if subtle.ConstantTimeCompare([]byte(d.Hash), []byte(hash)) != 1 {
		return nil, api.Errorf(api.KindNotFound, "no token %q", id)
	}
	return &d.Token, nil
}

// Tokens lists the tokens (a stored token that does not decode is left out).
func (c *Credentials) Tokens(ctx context.Context) ([]*api.Token, error) {
	objs, err := c.db.ListObjects(ctx, tokenKind, "")
	if err != nil {
		return nil, err
	}
	out := []*api.Token{}
	for _, o := range objs {
		if d, err := decodeToken(o); err == nil {
			out = append(out, &d.Token)
		}
	}
	return out, nil
}

// RemoveToken deletes a token (by id, unique id prefix or name), then calls
// revoke, which ends what the token still holds open and says how many
// requests that ended, and records the removal.
func (c *Credentials) RemoveToken(ctx context.Context, idOrName string, revoke func(id, name string) (ended int)) error {
	o, err := c.db.GetObject(ctx, tokenKind, idOrName)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return api.Errorf(api.KindNotFound, "no token %q: see den token ls", idOrName)
	case errors.Is(err, store.ErrConflict):
		return api.Errorf(api.KindConflict, "%v: use more of the id", err)
	case err != nil:
		return err
	}
	if err := c.db.DeleteObject(ctx, tokenKind, o.ID); err != nil {
		return err
	}
	ended := revoke(o.ID, o.Name)
	c.event(ctx, "", "token.remove", map[string]any{"id": o.ID, "name": o.Name, "requests_ended": ended})
	return nil
}

// SSHKeys returns every authorised key.
func (c *Credentials) SSHKeys(ctx context.Context) ([]*api.SSHKey, error) {
	objs, err := c.db.ListObjects(ctx, sshKeyKind, "")
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

// AddSSHKey stores key (checked by the caller, its Owner and Sandbox set)
// under a new id, which it sets with the key's CreatedAt, and records that
// the principal named by added it.
func (c *Credentials) AddSSHKey(ctx context.Context, key *api.SSHKey, by string) error {
	var b [16]byte
	rand.Read(b[:])
	key.ID = hex.EncodeToString(b[:])
	doc, err := json.Marshal(key)
	if err != nil {
		return err
	}
	o := &store.Object{Kind: sshKeyKind, ID: key.ID, Owner: key.Owner, Doc: doc}
	if err := c.db.PutObject(ctx, o); err != nil {
		return err
	}
	key.CreatedAt = o.CreatedAt
	c.sshKeyEvent(ctx, "sshkey.add", key, by)
	return nil
}

// RemoveSSHKey deletes key and records that the principal named by removed it.
func (c *Credentials) RemoveSSHKey(ctx context.Context, key *api.SSHKey, by string) error {
	if err := c.db.DeleteObject(ctx, sshKeyKind, key.ID); err != nil {
		return err
	}
	c.sshKeyEvent(ctx, "sshkey.rm", key, by)
	return nil
}

func (c *Credentials) sshKeyEvent(ctx context.Context, typ string, k *api.SSHKey, by string) {
	c.event(ctx, k.Sandbox, typ, map[string]string{"key": k.ID, "fingerprint": k.Fingerprint, "name": k.Name, "by": by})
}

// SSHKeyByFingerprint returns the authorised key with OpenSSH's SHA256
// fingerprint fp, or a not_found *api.Error: the SSH gateway's look-up.
func (c *Credentials) SSHKeyByFingerprint(ctx context.Context, fp string) (*api.SSHKey, error) {
	all, err := c.SSHKeys(ctx)
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

// FindSSHKey picks one of keys by id, name or id prefix (at least
// store.MinPrefix characters).
func FindSSHKey(keys []*api.SSHKey, ref string) (*api.SSHKey, error) {
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
