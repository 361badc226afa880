package sandbox

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/egress"
	"github.com/den-dev/den/internal/image"
)

// Removing a sandbox drops what every feature kept of it: its meter, slot
// and policy, process list, attribution ration, activity and lifecycle
// lock. (A feature whose state outlived its sandbox would leak, and a
// later sandbox given the same slot could be attributed the old policy.)
func TestRemoveForgetsFeatureState(t *testing.T) {
	ctx := context.Background()
	db, _, dir, log := testStoreEnv(t)
	imgs, err := image.NewStore(filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(ctx, Config{DataDir: dir, Runtime: noRuntime{}, Store: db, Images: imgs, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	id := newID()
	slot, err := m.net.alloc(id)
	if err != nil {
		t.Fatal(err)
	}
	// A stopped sandbox of an image that is gone: its teardown needs no
	// runtime and no image.
	rec := &record{Sandbox: api.Sandbox{ID: id, Image: "gone", Runtime: noRuntime{}.Name(), State: api.StateStopped}, UIDBase: uidStart + slot*65536}
	if err := m.put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	m.meters.start(id, api.Usage{}, now)
	m.net.setPolicy(id, egress.Policy{})
	m.procs.put(id, []api.ProcessInfo{{ID: "p"}}, now)
	m.attr.take(id, now)
	m.act.touch(id, now)
	m.locks.mutex(id)
	state := func() map[string]bool {
		_, meter := m.meters.total(id)
		_, _, slotted := m.net.lookup(slot)
		pol := slices.Contains(m.net.networkedIDs(), id)
		_, procs := m.procs.get(id)
		last, _ := m.act.state(id)
		m.attr.mu.Lock()
		_, ration := m.attr.buckets[id]
		m.attr.mu.Unlock()
		m.locks.mu.Lock()
		_, lock := m.locks.m[id]
		m.locks.mu.Unlock()
		return map[string]bool{"meter": meter, "slot": slotted, "policy": pol, "process list": procs, "ration": ration, "activity": !last.IsZero(), "lifecycle lock": lock}
	}
	for what, kept := range state() {
		if !kept {
			t.Fatalf("before remove: no %s", what)
		}
	}
	if err := m.Remove(ctx, id, false); err != nil {
		t.Fatal(err)
	}
	m.Close() // waits for the teardown, which frees the slot
	for what, kept := range state() {
		if kept {
			t.Errorf("after remove: the %s is kept", what)
		}
	}
	if got, ok := m.net.slots[slot]; ok {
		t.Errorf("after remove: slot %d still held by %s", slot, got)
	}
}
