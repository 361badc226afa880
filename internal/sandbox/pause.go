package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/den-dev/den/api"
)

// pauser is the optional ability of a box to freeze every process it has
// (isolate.Pauser; declared here by shape so the manager needs no more).
type pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// Pause freezes every process of a running sandbox: no CPU is used, memory
// and connections are kept, and any use of the sandbox resumes it.
func (m *Manager) Pause(ctx context.Context, id string) (*api.Sandbox, error) {
	rec, unlock, err := m.lockRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	switch rec.State {
	case api.StatePaused:
		return &rec.Sandbox, nil
	case api.StateRunning:
	default:
		return nil, api.Errorf(api.KindConflict, "sandbox %s is %s: only a running sandbox can be paused", rec.ID[:12], rec.State)
	}
	p, ok := m.box(rec.ID).(pauser)
	if !ok {
		return nil, api.Errorf(api.KindUnsupported, "the %s runtime cannot pause sandboxes", m.rt.Name())
	}
	start := time.Now()
	if err := p.Pause(ctx); err != nil {
		return nil, fmt.Errorf("pause sandbox: %w", err)
	}
	rec.State = api.StatePaused
	if err := m.put(ctx, rec); err != nil {
		p.Resume(context.Background())
		return nil, err
	}
	m.event(rec.ID, "sandbox.pause", map[string]any{"ms": msSince(start)})
	return &rec.Sandbox, nil
}

// Hibernate frees a sandbox's memory and keeps its files. On this tier
// (no memory checkpoints) its processes end; resume starts it again with
// its files and services, and says so (Resumed "restarted").
func (m *Manager) Hibernate(ctx context.Context, id string) (*api.Sandbox, error) {
	rec, unlock, err := m.lockRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	switch rec.State {
	case api.StateHibernated:
		return &rec.Sandbox, nil
	case api.StateRunning, api.StatePaused:
	default:
		return nil, api.Errorf(api.KindConflict, "sandbox %s is %s: only a running or paused sandbox can hibernate", rec.ID[:12], rec.State)
	}
	if err := m.haltLocked(ctx, rec, api.StateHibernated); err != nil {
		return nil, err
	}
	m.event(rec.ID, "sandbox.hibernate", nil)
	return &rec.Sandbox, nil
}

// Resume brings a paused or hibernated sandbox back. Resuming a running
// sandbox does nothing.
func (m *Manager) Resume(ctx context.Context, id string) (*api.Sandbox, error) {
	rec, unlock, err := m.lockRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := m.resumeLocked(ctx, rec); err != nil {
		return nil, err
	}
	return &rec.Sandbox, nil
}

func (m *Manager) resumeLocked(ctx context.Context, rec *record) error {
	start := time.Now()
	switch rec.State {
	case api.StatePaused:
		p, ok := m.box(rec.ID).(pauser)
		if !ok {
			return api.Errorf(api.KindConflict, "sandbox %s is paused but has no box: stop and start it", rec.ID[:12])
		}
		if err := p.Resume(ctx); err != nil {
			return fmt.Errorf("resume sandbox: %w", err)
		}
		rec.State, rec.Resumed = api.StateRunning, api.ResumedThawed
		if err := m.put(ctx, rec); err != nil {
			return err
		}
	case api.StateHibernated:
		rec.Resumed = api.ResumedRestarted
		if err := m.boot(ctx, rec); err != nil {
			return err
		}
	default:
		return nil
	}
	m.mu.Lock()
	m.seen[rec.ID] = time.Now()
	m.mu.Unlock()
	m.event(rec.ID, "sandbox.resume", map[string]any{"resumed": rec.Resumed, "ms": msSince(start)})
	return nil
}

func msSince(t time.Time) float64 {
	return float64(time.Since(t).Microseconds()) / 1000
}
