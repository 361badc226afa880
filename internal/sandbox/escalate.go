package sandbox

import (
	"context"
	"fmt"
	"slices"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/isolate"
)

// Escalate moves a sandbox to a stronger isolation tier (linux → gvisor →
// microvm), keeping its id, files, network policy, address and ports. Its
// processes end (no tier can carry another's processes); a sandbox that was
// up is started again on the new tier, with its services.
func (m *Manager) Escalate(ctx context.Context, id string, req api.EscalateRequest) (*api.Sandbox, error) {
	if req.Runtime == "" {
		return nil, api.FieldError("runtime", "missing: name the tier to move to (gvisor or microvm)")
	}
	to, err := m.tierByName(req.Runtime)
	if err != nil {
		return nil, err
	}
	rec, unlock, err := m.lockRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	from := rec.Runtime
	if from == "" {
		from = m.rt.Name()
	}
	if slices.Index(tierOrder, to.Name()) <= slices.Index(tierOrder, from) {
		if to.Name() == from {
			return nil, api.Errorf(api.KindConflict, "sandbox %s already runs on the %s runtime", rec.ID[:12], from)
		}
		return nil, api.Errorf(api.KindInvalid, "sandbox %s runs on %s, a stronger tier than %s: escalate only moves up (%s)", rec.ID[:12], from, to.Name(), "linux < gvisor < microvm")
	}
	switch rec.State {
	case api.StateRunning, api.StatePaused, api.StateHibernated, api.StateStopped, api.StateFailed:
	default:
		return nil, api.Errorf(api.KindConflict, "sandbox %s is %s", rec.ID[:12], rec.State)
	}
	wasUp := rec.State != api.StateStopped && rec.State != api.StateFailed
	// Stopping drops a hibernated sandbox's memory too: it belongs to the
	// old tier.
	if err := m.haltLocked(ctx, rec, api.StateStopped, stopGrace(rec, nil)); err != nil {
		return nil, err
	}
	spec, err := m.spec(ctx, rec)
	if err != nil {
		return nil, err
	}
	if old, err := m.tierByName(from); err == nil {
		// What the old tier keeps beside the files (its run state).
		old.Destroy(ctx, &isolate.Spec{ID: rec.ID, Net: spec.Net, NetSlot: spec.NetSlot})
	}
	if a, ok := to.(isolate.Adopter); ok {
		if err := a.Adopt(ctx, spec); err != nil {
			return nil, fmt.Errorf("move the sandbox's files to the %s runtime: %w", to.Name(), err)
		}
	}
	rec.Runtime = to.Name()
	rec.Resumed = ""
	if err := m.put(ctx, rec); err != nil {
		return nil, err
	}
	m.event(rec.ID, "sandbox.escalate", map[string]any{"from": from, "to": to.Name()})
	if wasUp {
		if err := m.boot(ctx, rec); err != nil {
			return nil, fmt.Errorf("sandbox %s moved to %s but did not start there (start it again with den start, or look at den info): %w", rec.ID[:12], to.Name(), err)
		}
		m.event(rec.ID, "sandbox.start", nil)
	}
	return &rec.Sandbox, nil
}
