package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/storage"
)

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
	p, ok := m.box(rec.ID).(isolate.Pauser)
	if !ok {
		return nil, api.Errorf(api.KindUnsupported, "the %s runtime cannot pause sandboxes", rec.Runtime)
	}
	start := time.Now()
	m.fetchProcs(rec.ID, m.box(rec.ID), 2*time.Second) // what ps shows while it sleeps
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

// Hibernate frees a sandbox's memory and keeps its files. On tiers with
// memory checkpoints (gvisor, microvm) its processes and memory are saved
// to disk and resume restores them where they were (Resumed "restored");
// on the linux tier, or when the checkpoint fails, its processes end and
// resume starts it again with its files and services (Resumed
// "restarted").
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
	start := time.Now()
	if b := m.box(rec.ID); b != nil && rec.State == api.StateRunning {
		m.fetchProcs(rec.ID, b, 2*time.Second) // what ps shows while it sleeps
	}
	saved, why := m.checkpoint(ctx, rec)
	// A sandbox whose memory was saved comes back where it was: its
	// processes must not see a stop signal first (their files would then
	// disagree with their memory). Without a checkpoint it stops gracefully.
	grace := stopGrace(rec, nil)
	if saved {
		grace = 0
	}
	if err := m.haltLocked(ctx, rec, api.StateHibernated, grace); err != nil {
		return nil, err
	}
	if rec.Checkpoint != saved {
		rec.Checkpoint = saved
		if err := m.put(ctx, rec); err != nil {
			return nil, err
		}
	}
	m.event(rec.ID, "sandbox.hibernate", map[string]any{"memory": saved, "note": why, "ms": msSince(start)})
	return &rec.Sandbox, nil
}

// checkpointDir keeps a hibernated sandbox's memory.
func (m *Manager) checkpointDir(id string) string {
	return filepath.Join(m.cfg.DataDir, "checkpoints", id)
}

// checkpoint saves a running sandbox's processes and memory where its tier
// can, stopping its box. It reports whether it did and, if not, why.
func (m *Manager) checkpoint(ctx context.Context, rec *record) (bool, string) {
	rt, err := m.tier(rec)
	if err != nil {
		return false, err.Error()
	}
	cp, ok := rt.(isolate.Checkpointer)
	b := m.box(rec.ID)
	if !ok || b == nil {
		return false, fmt.Sprintf("the %s runtime keeps no memory: processes end, resume restarts them", rec.Runtime)
	}
	if rec.State == api.StatePaused {
		if p, ok := b.(isolate.Pauser); ok {
			p.Resume(ctx)
		}
	}
	if err := saveCheckpoint(ctx, cp, b, m.checkpointDir(rec.ID)); err != nil {
		m.log.Warn("checkpoint failed: hibernating without memory", "id", rec.ID, "err", err)
		return false, fmt.Sprintf("checkpoint failed (%v): processes end, resume restarts them", err)
	}
	return true, ""
}

// restore boots a hibernated sandbox from its checkpoint; false when there
// is none or it cannot be restored (the caller then boots it afresh).
func (m *Manager) restore(ctx context.Context, rec *record) bool {
	if !rec.Checkpoint {
		return false
	}
	rec.Checkpoint = false
	dir := m.checkpointDir(rec.ID)
	defer storage.RemoveTree(dir)
	return m.restoreFrom(ctx, rec, dir)
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
		p, ok := m.box(rec.ID).(isolate.Pauser)
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
		if m.restore(ctx, rec) {
			break
		}
		rec.Resumed = api.ResumedRestarted
		if err := m.boot(ctx, rec); err != nil {
			return err
		}
	default:
		return nil
	}
	m.act.touch(rec.ID, time.Now())
	m.event(rec.ID, "sandbox.resume", map[string]any{"resumed": rec.Resumed, "ms": msSince(start)})
	return nil
}

func msSince(t time.Time) float64 {
	return float64(time.Since(t).Microseconds()) / 1000
}

// SleepingProcesses is the process list of a paused sandbox, or of one
// hibernated with its memory, as its agent gave it when the sandbox went
// to sleep; the processes that were running are in the sandbox's state
// (paused or hibernated). ok is false when the sandbox is awake, its
// processes ended (hibernated without memory), or the list is not known
// (the daemon restarted since).
func (m *Manager) SleepingProcesses(ctx context.Context, id string) (list []api.ProcessInfo, ok bool, err error) {
	rec, err := m.get(ctx, id)
	if err != nil {
		return nil, false, err
	}
	if rec.State != api.StatePaused && !(rec.State == api.StateHibernated && rec.Checkpoint) {
		return nil, false, nil
	}
	c, ok := m.procs.get(rec.ID)
	if !ok || c.procs == nil {
		return nil, false, nil
	}
	list = make([]api.ProcessInfo, len(c.procs))
	for i, p := range c.procs {
		if p.State == api.ProcRunning {
			p.State = rec.State
		}
		list[i] = p
	}
	return list, true, nil
}
