package sandbox

import (
	"context"
	"encoding/json"
	"strings"
	"sync"

	"github.com/den-dev/den/api"
)

// Scope is what one request may see and use: every sandbox (the admin),
// the sandboxes one scoped token created, or one sandbox only. A context
// without a Scope acts for the daemon itself (expiry, idle timeouts, the
// warm pool); the API server gives every request one, and a request with
// the zero Scope sees nothing.
//
// Every lookup of a sandbox, snapshot, volume or secret goes through Sees
// (sandboxes) or its siblings below, so a scoped request that names
// something it may not see gets not_found, as if it did not exist.
type Scope struct {
	// All sees every sandbox (the admin).
	All bool
	// Owner is the scoped token's id: it sees the sandboxes it created.
	Owner string
	// Sandbox, when set, narrows the scope further to that one sandbox id.
	Sandbox string
	// MaxSandboxes bounds the sandboxes Owner may have at once (0: no
	// bound); MaxVolumes, MaxSnapshots and MaxImages its volumes,
	// snapshots and images.
	MaxSandboxes, MaxVolumes, MaxSnapshots, MaxImages int
	// Caps bound the CPUs, memory and disk of each sandbox Owner creates
	// (zero: no cap); a create without limits gets the caps as its limits.
	// Caps.Disk also bounds (and is the default size of) its volumes.
	Caps api.Limits
}

type scopeKey struct{}

// WithScope returns ctx carrying s.
func WithScope(ctx context.Context, s *Scope) context.Context {
	return context.WithValue(ctx, scopeKey{}, s)
}

// ScopeFrom is the scope of ctx; nil for the daemon's own work.
func ScopeFrom(ctx context.Context) *Scope {
	s, _ := ctx.Value(scopeKey{}).(*Scope)
	return s
}

// Sees is the one answer to "may this request see the sandbox with this
// id and owner". A nil scope is the daemon and sees everything.
func (s *Scope) Sees(id, owner string) bool {
	if s == nil {
		return true
	}
	if s.Sandbox != "" && s.Sandbox != id {
		return false
	}
	return s.All || s.Owner != "" && owner == s.Owner
}

// IsAdmin reports whether s may use daemon-wide things (host bind mounts,
// the daemon's environment for secret headers, tokens, metrics).
func (s *Scope) IsAdmin() bool { return s == nil || s.All && s.Sandbox == "" }

// owner is the owner recorded on what s creates: "" for the admin.
func (s *Scope) owner() string {
	if s == nil || s.All {
		return ""
	}
	return s.Owner
}

// seesOwned answers for objects that belong to an owner and, maybe, to a
// sandbox (a snapshot): the admin sees all, a token its own, a request
// narrowed to one sandbox only that sandbox's.
func (s *Scope) seesOwned(owner, sandbox string) bool {
	if s == nil {
		return true
	}
	if s.Sandbox != "" {
		return sandbox == s.Sandbox && (s.All || owner == s.Owner)
	}
	return s.All || s.Owner != "" && owner == s.Owner
}

// secretKey is where the secret name of owner is kept in the store: the
// admin's under their own name, a token's under "TOKENID:NAME" (a colon is
// never part of a secret name, so the namespaces cannot meet).
func secretKey(owner, name string) string {
	if owner == "" {
		return name
	}
	return owner + ":" + name
}

// secretName is the inverse of secretKey for owner: ok is false for
// another owner's secret.
func secretName(owner, key string) (string, bool) {
	o, n, found := strings.Cut(key, ":")
	if !found {
		return key, owner == ""
	}
	return n, o == owner && owner != ""
}

// mayCreate refuses new sandboxes to a request narrowed to one sandbox.
func mayCreate(ctx context.Context) error {
	if sc := ScopeFrom(ctx); sc != nil && sc.Sandbox != "" {
		return api.Errorf(api.KindUnauthorized, "this credential is for sandbox %s only: it cannot create sandboxes", short(sc.Sandbox))
	}
	return nil
}

// applyCaps gives a scoped create the scope's caps as limits where it sets
// none, and refuses limits above them.
func (s *Scope) applyCaps(l *api.Limits) error {
	if s == nil {
		return nil
	}
	c := s.Caps
	if c.CPUs > 0 {
		if l.CPUs == 0 {
			l.CPUs = c.CPUs
		} else if l.CPUs > c.CPUs {
			return api.FieldError("limits.cpus", "%g is above this token's cap of %g CPUs", l.CPUs, c.CPUs)
		}
	}
	if c.Memory > 0 {
		if l.Memory == 0 {
			l.Memory = c.Memory
		} else if l.Memory > c.Memory {
			return api.FieldError("limits.memory", "%s is above this token's cap of %s", l.Memory, c.Memory)
		}
	}
	return s.capDisk("limits.disk", &l.Disk)
}

// capDisk gives a scoped request the scope's disk cap where it asks for no
// size, and refuses a size above the cap (field names the request's
// field).
func (s *Scope) capDisk(field string, size *api.Size) error {
	if s == nil || s.Caps.Disk <= 0 {
		return nil
	}
	if *size == 0 {
		*size = s.Caps.Disk
	} else if *size > s.Caps.Disk {
		return api.FieldError(field, "%s is above this token's disk cap of %s", *size, s.Caps.Disk)
	}
	return nil
}

// A bounded is a kind of thing a scoped token may have a bounded number of.
type bounded struct {
	what  string                                                           // plural, for messages: "sandboxes"
	max   func(*Scope) int                                                 // the scope's bound (0: none)
	count func(m *Manager, ctx context.Context, owner string) (int, error) // how many owner has
	free  string                                                           // how to make room, for messages
}

var (
	boundSandboxes = bounded{"sandboxes", func(s *Scope) int { return s.MaxSandboxes }, (*Manager).CountOwned, "remove one (den rm) first"}
	boundVolumes   = bounded{"volumes", func(s *Scope) int { return s.MaxVolumes }, (*Manager).countVolumes, "remove one (den volume rm) first"}
	boundSnapshots = bounded{"snapshots", func(s *Scope) int { return s.MaxSnapshots }, (*Manager).countSnapshots, "remove one (den snapshot rm) first"}
	boundImages    = bounded{"images", func(s *Scope) int { return s.MaxImages }, (*Manager).countImages, "ask the admin to remove one (den image rm)"}
)

// admit checks that the scope's owner may have n more sandboxes. On
// success the caller records them and then calls done (which releases the
// owner's admission lock); on failure nothing is held.
func (m *Manager) admit(ctx context.Context, n int) (done func(), err error) {
	return m.admitN(ctx, boundSandboxes, n)
}

// mayAdd refuses early, before long work, a request that would make one
// more of b than the scope may have (admitN checks again when it is
// recorded).
func (m *Manager) mayAdd(ctx context.Context, b bounded) error {
	done, err := m.admitN(ctx, b, 1)
	if err == nil {
		done()
	}
	return err
}

// admitN is admit for any bounded kind.
func (m *Manager) admitN(ctx context.Context, b bounded, n int) (done func(), err error) {
	s := ScopeFrom(ctx)
	if s == nil || s.Owner == "" || s.All || b.max(s) <= 0 {
		return func() {}, nil
	}
	key := s.Owner + "/" + b.what
	unlock := m.adm.lock(key)
	have, err := b.count(m, ctx, s.Owner)
	if err != nil {
		unlock()
		return nil, err
	}
	if max := b.max(s); have+n > max {
		unlock()
		return nil, api.Errorf(api.KindConflict, "quota: this token may have at most %d %s and has %d: %s", max, b.what, have, b.free)
	}
	var once sync.Once
	return func() { once.Do(unlock) }, nil
}

// CountOwned is how many sandboxes owner has, in any state.
func (m *Manager) CountOwned(ctx context.Context, owner string) (int, error) {
	all, err := m.db.ListSandboxes(ctx, nil)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range all {
		if rec, err := decodeRecord(s); err == nil && rec.State != stateWarm && rec.Owner == owner {
			n++
		}
	}
	return n, nil
}

// countVolumes is how many volumes owner has.
func (m *Manager) countVolumes(ctx context.Context, owner string) (int, error) {
	return m.countObjects(ctx, kindVolume, owner)
}

// countSnapshots is how many snapshots owner has.
func (m *Manager) countSnapshots(ctx context.Context, owner string) (int, error) {
	return m.countObjects(ctx, kindSnapshot, owner)
}

// countObjects counts the objects of kind whose document names owner as
// its Owner.
func (m *Manager) countObjects(ctx context.Context, kind, owner string) (int, error) {
	objs, err := m.db.ListObjects(ctx, kind, "")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, o := range objs {
		if ownedBy(o.Doc, owner) {
			n++
		}
	}
	return n, nil
}

// ownedBy reports whether the API document doc has owner as its Owner.
func ownedBy(doc []byte, owner string) bool {
	var d struct {
		Owner string `json:"owner"`
	}
	return json.Unmarshal(doc, &d) == nil && d.Owner == owner
}

// countImages is how many images owner has (build caches not counted).
func (m *Manager) countImages(ctx context.Context, owner string) (int, error) {
	all, err := m.db.ListImages(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, i := range all {
		if !strings.HasPrefix(i.Name, cachePrefix) && ownedBy(i.Doc, owner) {
			n++
		}
	}
	return n, nil
}
