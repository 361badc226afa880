package sandbox

import (
	"context"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/isolate"
)

// The warm pool: booted sandboxes of the host image, unclaimed (state
// warm, never shown to clients), that a create takes over instead of
// booting one (Config.WarmPool).

// pooled is one sandbox of the pool.
type pooled struct {
	rec *record
	box isolate.Box
}

// claim turns a pooled sandbox into the requested one. ok is false when
// the pool is empty (or off) and the caller must boot a fresh one.
func (m *Manager) claim(ctx context.Context, req *api.CreateRequest) (*api.Sandbox, error, bool) {
	if m.pool == nil {
		return nil, nil, false
	}
	if req.Name != "" {
		if _, err := m.db.GetSandbox(ctx, req.Name); err == nil {
			return nil, api.Errorf(api.KindExists, "a sandbox named %q already exists", req.Name), true
		}
	}
	var p *pooled
	select {
	case p = <-m.pool:
	default:
		return nil, nil, false
	}
	select {
	case m.poolWake <- struct{}{}:
	default:
	}
	rec, b := p.rec, p.box
	unlock := m.lock(rec.ID)
	defer unlock()
	select {
	case <-b.Done(): // died while pooled
		m.teardownAsync(rec, nil)
		return nil, nil, false
	default:
	}
	pooledHost, pooledLimits := rec.Hostname, rec.Limits
	m.applyRequest(rec, req, ScopeFrom(ctx).owner())
	rec.State, rec.StartedAt = api.StateRunning, rec.CreatedAt
	err := func() error {
		if rec.Limits != pooledLimits {
			if err := b.SetLimits(isolate.Limits{CPUs: rec.Limits.CPUs, Memory: int64(rec.Limits.Memory), Pids: rec.Limits.Pids}); err != nil {
				return err
			}
		}
		if rec.Hostname != pooledHost {
			if err := b.Agent().JSON(ctx, "POST", agent.PathHostname, nil, map[string]string{"hostname": rec.Hostname}, nil); err != nil {
				return err
			}
		}
		return m.put(ctx, rec)
	}()
	if err != nil {
		m.db.DeleteSandbox(context.Background(), rec.ID)
		m.teardownAsync(rec, b)
		return nil, err, true
	}
	m.mu.Lock()
	m.boxes[rec.ID] = b
	m.mu.Unlock()
	m.startMeter(rec)
	m.watch(rec.ID, b)
	m.event(rec.ID, "sandbox.create", map[string]any{"name": rec.Name, "image": rec.Image, "warm": true})
	return &rec.Sandbox, nil, true
}

// fillPool keeps the pool full, booting one sandbox at a time.
func (m *Manager) fillPool() {
	defer m.wg.Done()
	for {
		if len(m.pool) < cap(m.pool) {
			p, err := m.bootPooled()
			if err != nil {
				m.log.Warn("warm pool", "err", err)
			} else {
				select {
				case m.pool <- p:
				case <-m.stop:
					m.teardown(p.rec, p.box)
					return
				}
				continue
			}
		}
		select {
		case <-m.stop:
			return
		case <-m.poolWake:
		case <-time.After(5 * time.Second):
		}
	}
}

func (m *Manager) bootPooled() (*pooled, error) {
	ctx := context.Background()
	id := newID()
	slot, err := m.net.alloc(id)
	if err != nil {
		return nil, err
	}
	rec := &record{Sandbox: api.Sandbox{ID: id, Image: HostImage, Runtime: m.rt.Name(), State: stateWarm}, UIDBase: uidStart + slot*65536}
	m.applyRequest(rec, &api.CreateRequest{}, "")
	rec.State = stateWarm
	if err := m.put(ctx, rec); err != nil {
		m.net.free(slotOf(rec.UIDBase))
		return nil, err
	}
	spec, err := m.spec(ctx, rec)
	if err == nil {
		err = m.room()
	}
	if err == nil {
		err = m.newTree(spec.Dir)
		if err == nil {
			if err = m.setQuota(spec.Dir, rec.Limits.Disk); err != nil {
				m.deleteTree(spec.Dir)
			}
		}
	}
	if err != nil {
		m.db.DeleteSandbox(ctx, id)
		m.net.free(slotOf(rec.UIDBase))
		return nil, err
	}
	b, err := m.rt.Start(ctx, spec)
	if err != nil {
		m.db.DeleteSandbox(ctx, id)
		m.teardown(rec, nil)
		return nil, err
	}
	rec.Pid = b.Pid()
	m.put(ctx, rec)
	return &pooled{rec: rec, box: b}, nil
}
