package sandbox

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/isolate"
)

// A stop is graceful, as docker stop's: the stop signal to every process,
// a wait of up to the stop timeout for them to end, then SIGKILL (the
// tier's Stop) for what is left.
const (
	defaultStopTimeout = 10 * time.Second
	maxStopTimeout     = 5 * time.Minute
)

// checkStopSignal refuses a stop signal the agent would not know.
func checkStopSignal(sig string) error {
	if sig == "" {
		return nil
	}
	if _, err := agent.ParseSignal(sig); err != nil {
		return api.FieldError("stop_signal", "unknown signal %q (try TERM, INT, QUIT, HUP or a number)", sig)
	}
	return nil
}

// checkStopTimeout refuses a stop timeout below 0 or above maxStopTimeout
// (the sandbox stays locked while its stop waits).
func checkStopTimeout(field string, d *api.Duration) error {
	if d != nil && (d.D() < 0 || d.D() > maxStopTimeout) {
		return api.FieldError(field, "%s is outside 0s to %s: ask for a wait like 30s (0 kills at once)", d.D(), maxStopTimeout)
	}
	return nil
}

// stopGrace is how long a stop of rec waits for its processes: timeout
// when the request sets one, else the sandbox's stop timeout, else 10 s.
func stopGrace(rec *record, timeout *api.Duration) time.Duration {
	switch {
	case timeout != nil:
		return timeout.D()
	case rec.StopTimeout != nil:
		return rec.StopTimeout.D()
	}
	return defaultStopTimeout
}

// StopWithin stops a sandbox as Stop does, waiting up to timeout (nil:
// the sandbox's stop timeout) for its processes to end after the stop
// signal before it kills them.
func (m *Manager) StopWithin(ctx context.Context, id string, timeout *api.Duration) (*api.Sandbox, error) {
	if err := checkStopTimeout("timeout", timeout); err != nil {
		return nil, err
	}
	rec, unlock, err := m.lockRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := m.haltLocked(ctx, rec, api.StateStopped, stopGrace(rec, timeout)); err != nil {
		return nil, err
	}
	return &rec.Sandbox, nil
}

// signalStop is a graceful stop's first half: the agent ends the services'
// restarts, sends the stop signal to every process of the sandbox and
// waits up to grace for them to end. A failure is logged: the kill that
// follows ends the processes anyway. state is what the sandbox becomes
// (stopped, hibernated): a request whose command ends meanwhile answers
// that the sandbox was stopped while it ran (see stopWaits.stopping).
func (m *Manager) signalStop(ctx context.Context, rec *record, b isolate.Box, state string, grace time.Duration) {
	ag := b.Agent()
	if ag == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, grace+10*time.Second)
	defer cancel()
	m.stops.set(rec.ID, state, cancel) // cleared by haltLocked once the box is stopped
	req := agent.StopRequest{Signal: cmp.Or(rec.StopSignal, "TERM"), Timeout: api.Duration(grace)}
	var res agent.StopResult
	if err := ag.JSON(ctx, "POST", agent.PathStop, nil, req, &res); err != nil {
		m.log.Warn("graceful stop", "id", rec.ID, "err", err)
		return
	}
	if res.Left > 0 {
		m.log.Info("stop timeout: killing what is left", "id", rec.ID, "left", res.Left, "timeout", grace)
	}
}

// stopWaits holds each graceful stop's wait, by sandbox: a removal with
// force cuts the wait short (den rm -f kills at once, even while a stop
// waits), and a command that ends during the wait is known to have ended
// because its sandbox is being stopped.
type stopWaits struct {
	mu    sync.Mutex // guards waits
	waits map[string]stopWait
}

// A stopWait is one graceful stop in progress.
type stopWait struct {
	state  string // what the sandbox becomes: stopped, hibernated
	cancel context.CancelFunc
}

// set records id's wait (cancel nil: it is over).
func (w *stopWaits) set(id, state string, cancel context.CancelFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if cancel == nil {
		delete(w.waits, id)
		return
	}
	if w.waits == nil {
		w.waits = map[string]stopWait{}
	}
	w.waits[id] = stopWait{state, cancel}
}

// cut ends id's wait, if one runs; the stop then kills at once.
func (w *stopWaits) cut(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if sw, ok := w.waits[id]; ok {
		sw.cancel()
	}
}

// stopping says whether a graceful stop of id is under way, and what the
// sandbox becomes.
func (w *stopWaits) stopping(id string) (state string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	sw, ok := w.waits[id]
	return sw.state, ok
}

// idSet is a set of sandbox ids, safe for concurrent use.
type idSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

// add puts id in the set; false when it was there already.
func (s *idSet) add(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids[id] {
		return false
	}
	if s.ids == nil {
		s.ids = map[string]bool{}
	}
	s.ids[id] = true
	return true
}

func (s *idSet) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ids, id)
}

// cutStopWait ends the wait of a graceful stop of sandbox id (an id,
// prefix or name) that runs now, so that a removal with force, which
// waits for the sandbox's lock, kills at once.
func (m *Manager) cutStopWait(ctx context.Context, id string) {
	if rec, err := m.get(ctx, id); err == nil {
		m.stops.cut(rec.ID)
	}
}
