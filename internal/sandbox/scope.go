package sandbox

import (
	"context"
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
	// MaxSandboxes bounds the sandboxes Owner may have at once (0: no bound).
	MaxSandboxes int
	// Caps bound the CPUs and memory of each sandbox Owner creates (zero:
	// no cap); a create without limits gets the caps as its limits.
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
	return nil
}

// admission serialises, per owner, the count of an owner's sandboxes and
// the recording of a new one, so parallel creates cannot pass a quota
// together.
type admission struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// admit checks that the scope's owner may have n more sandboxes. On
// success the caller records them and then calls done (which releases the
// owner's admission lock); on failure nothing is held.
func (m *Manager) admit(ctx context.Context, n int) (done func(), err error) {
	s := ScopeFrom(ctx)
	if s == nil || s.Owner == "" || s.MaxSandboxes <= 0 || s.All {
		return func() {}, nil
	}
	m.adm.mu.Lock()
	if m.adm.locks == nil {
		m.adm.locks = map[string]*sync.Mutex{}
	}
	l, ok := m.adm.locks[s.Owner]
	if !ok {
		l = &sync.Mutex{}
		m.adm.locks[s.Owner] = l
	}
	m.adm.mu.Unlock()
	l.Lock()
	have, err := m.CountOwned(ctx, s.Owner)
	if err != nil {
		l.Unlock()
		return nil, err
	}
	if have+n > s.MaxSandboxes {
		l.Unlock()
		return nil, api.Errorf(api.KindConflict, "quota: this token may have at most %d sandboxes and has %d: remove one (den rm) first", s.MaxSandboxes, have)
	}
	var once sync.Once
	return func() { once.Do(l.Unlock) }, nil
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
