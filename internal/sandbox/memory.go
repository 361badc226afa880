package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/storage"
)

// Snapshots and forks that keep processes: on tiers with memory
// checkpoints (isolate.Checkpointer: gvisor, microvm) the source's
// processes and memory are saved with its box stopped, its files are
// copied while nothing runs, and the source is restored from the same
// checkpoint, so files and memory are one instant. Sandboxes made from it
// (forks, den create --from, den restore) boot through the tier's Restore,
// which gives each its own hostname and address.

// checkpointer is rec's tier as a Checkpointer, or an unsupported error
// naming the tier.
func (m *Manager) checkpointer(rec *record) (isolate.Checkpointer, error) {
	rt, err := m.tier(rec)
	if err != nil {
		return nil, err
	}
	cp, ok := rt.(isolate.Checkpointer)
	if !ok {
		return nil, api.Errorf(api.KindUnsupported, "the %s runtime cannot keep processes and memory: leave out memory (files only), or move the sandbox to gvisor or microvm first (den escalate)", rec.Runtime)
	}
	return cp, nil
}

// withCheckpoint saves a running or paused sandbox's processes and memory
// into dir, runs fn while its box is stopped (nothing changes its files),
// and restores the sandbox from dir. Call with the sandbox locked. If the
// checkpoint fails and takes the box with it, the sandbox is started again
// with its files and the error says so.
func (m *Manager) withCheckpoint(ctx context.Context, rec *record, dir string, fn func() error) error {
	if rec.State != api.StateRunning && rec.State != api.StatePaused {
		return api.Errorf(api.KindConflict, "sandbox %s is %s: only a running or paused sandbox has processes to keep (start it, or leave out memory)", rec.ID[:12], rec.State)
	}
	cp, err := m.checkpointer(rec)
	if err != nil {
		return err
	}
	b := m.box(rec.ID)
	if b == nil {
		return api.Errorf(api.KindConflict, "sandbox %s has no box: stop and start it", rec.ID[:12])
	}
	wasPaused := rec.State == api.StatePaused
	// repause leaves a paused sandbox paused when nothing was saved.
	repause := func() {}
	if wasPaused {
		if p, ok := b.(isolate.Pauser); ok {
			if err := p.Resume(ctx); err != nil {
				return fmt.Errorf("resume for the checkpoint: %w", err)
			}
			repause = func() { p.Pause(context.Background()) }
		}
	}
	// Writes the sandbox's kernel caches reach the files copied.
	if err := b.Agent().JSON(ctx, "POST", agent.PathSync, nil, nil, nil); err != nil {
		repause()
		return fmt.Errorf("sync the sandbox's files before the checkpoint: %w", err)
	}
	if err := saveCheckpoint(ctx, cp, b, dir); err != nil {
		select {
		case <-b.Done():
			m.log.Warn("checkpoint failed and the box ended: starting it again", "id", rec.ID, "err", err)
			m.dropBox(ctx, rec, b)
			rec.Resumed = api.ResumedRestarted
			if berr := m.boot(ctx, rec); berr != nil {
				m.failed(rec, berr)
				return fmt.Errorf("checkpoint: %w; the sandbox ended and could not start again: %v", err, berr)
			}
			return fmt.Errorf("checkpoint: %w (the sandbox's processes ended with it: it was started again with its files)", err)
		default:
		}
		repause()
		return fmt.Errorf("checkpoint: %w", err)
	}
	m.dropBox(ctx, rec, b)
	ferr := fn()
	resumed := rec.Resumed // the source was not resumed: keep what it says
	if m.restoreFrom(ctx, rec, dir) {
		rec.Resumed = resumed
		m.put(ctx, rec)
	} else {
		rec.Resumed = api.ResumedRestarted
		if err := m.boot(ctx, rec); err != nil {
			m.failed(rec, err)
			return fmt.Errorf("the sandbox's processes could not be restored after the checkpoint, nor could it start again: %w", err)
		}
		if ferr == nil {
			ferr = api.Errorf(api.KindInternal, "the sandbox's processes could not be restored after the checkpoint: it was started again with its files (see den events)")
		}
		return ferr
	}
	if wasPaused {
		if p, ok := m.box(rec.ID).(isolate.Pauser); ok && p.Pause(ctx) == nil {
			rec.State = api.StatePaused
			m.put(ctx, rec)
		}
	}
	return ferr
}

// saveCheckpoint writes box b's processes and memory into dir (replacing
// what is there), which stops the box; on failure dir is removed.
func saveCheckpoint(ctx context.Context, cp isolate.Checkpointer, b isolate.Box, dir string) error {
	storage.RemoveTree(dir)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	if err := cp.Checkpoint(ctx, b, dir, false); err != nil {
		storage.RemoveTree(dir)
		return err
	}
	return nil
}

// restoreFrom boots rec's box from the checkpoint in dir (taken of it or
// of the sandbox its files were copied from) and records it running with
// Resumed "restored". It reports false, with an event saying why, when it
// cannot; the caller then boots the sandbox afresh. Call with the
// sandbox locked.
func (m *Manager) restoreFrom(ctx context.Context, rec *record, dir string) bool {
	fail := func(what string, err error) bool {
		m.log.Warn(what+": starting afresh", "id", rec.ID, "err", err)
		m.event(rec.ID, "sandbox.restore_failed", map[string]any{"error": err.Error()})
		return false
	}
	cp, err := m.checkpointer(rec)
	if err != nil {
		return fail("no restore", err)
	}
	spec, err := m.spec(ctx, rec)
	if err != nil {
		return fail("no restore", err)
	}
	b, err := cp.Restore(ctx, spec, dir)
	if err != nil {
		return fail("restore from checkpoint failed", err)
	}
	rec.Resumed = api.ResumedRestored
	if err := m.booted(ctx, rec, spec, b, true); err != nil {
		if rt, terr := m.tier(rec); terr == nil {
			rt.Destroy(ctx, &isolate.Spec{ID: rec.ID, Net: spec.Net, NetSlot: spec.NetSlot})
		}
		return fail("restored sandbox could not be recorded", err)
	}
	return true
}

// dropBox takes a box that a checkpoint stopped out of the manager's view
// (so its end is not taken for a failure); the sandbox is about to be
// booted again. Call with the sandbox locked.
func (m *Manager) dropBox(ctx context.Context, rec *record, b isolate.Box) {
	m.mu.Lock()
	if m.boxes[rec.ID] == b {
		delete(m.boxes, rec.ID)
	}
	m.mu.Unlock()
	retire(b, rec.ID, api.StateStopped)
	b.Stop(ctx)
	rec.State, rec.Pid = api.StateStopped, 0
}

// failed records that a sandbox could not be booted again.
func (m *Manager) failed(rec *record, err error) {
	rec.State, rec.Pid, rec.Error = api.StateFailed, 0, err.Error()
	m.put(context.Background(), rec)
}

// memoryUsable reports whether a sandbox can run on from a snapshot's
// saved memory: a snapshot with memory, of the sandbox's tier. When not,
// an event says why (the sandbox then boots with the snapshot's files).
func (m *Manager) memoryUsable(rec *record, snap *api.Snapshot) bool {
	if !snap.Memory {
		return false
	}
	if snap.Runtime != rec.Runtime {
		m.event(rec.ID, "sandbox.restore_failed", map[string]any{"snapshot": snap.ID,
			"error": fmt.Sprintf("the snapshot's memory is of the %s runtime and this sandbox runs %s: it starts with the snapshot's files only", snap.Runtime, rec.Runtime)})
		return false
	}
	return true
}
