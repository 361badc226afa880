package sandbox

import (
	"slices"
	"strings"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/isolate"
)

// The isolation tiers this daemon runs, by name.

// RuntimeName is the name of the default isolation tier.
func (m *Manager) RuntimeName() string { return m.rt.Name() }

// Runtimes names the tiers this daemon runs, the default first.
func (m *Manager) Runtimes() []string {
	names := []string{m.rt.Name()}
	for _, n := range tierOrder {
		if _, ok := m.cfg.Tiers[n]; ok && n != m.rt.Name() {
			names = append(names, n)
		}
	}
	return names
}

// tierOrder lists the tiers from the weakest boundary to the strongest.
var tierOrder = []string{"linux", "gvisor", "microvm"}

// tierByName returns the runtime called name, or an error that says why
// there is none.
func (m *Manager) tierByName(name string) (isolate.Runtime, error) {
	if name == "" || name == m.rt.Name() {
		return m.rt, nil
	}
	if rt, ok := m.cfg.Tiers[name]; ok {
		return rt, nil
	}
	if why, ok := m.cfg.Unavailable[name]; ok {
		return nil, api.Errorf(api.KindUnsupported, "the %s runtime is not available on this host: %s (see den info)", name, why)
	}
	if slices.Contains(tierOrder, name) {
		return nil, api.Errorf(api.KindUnsupported, "this daemon does not run the %s runtime (see den info)", name)
	}
	return nil, api.FieldError("runtime", "%q is not a runtime: use %s", name, strings.Join(tierOrder, ", "))
}

// tier is the runtime of a sandbox.
func (m *Manager) tier(rec *record) (isolate.Runtime, error) { return m.tierByName(rec.Runtime) }
