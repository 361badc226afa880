package sandbox

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/egress"
)

// Slots go lowest free first, a freed one is given again, one taken at
// start-up is skipped, and a full table is a conflict saying what to do.
func TestNetTableSlots(t *testing.T) {
	var nt netTable
	for want := range 3 {
		if got, err := nt.alloc(newID()); err != nil || got != want {
			t.Fatalf("alloc: %d, %v; want %d", got, err, want)
		}
	}
	nt.free(1)
	if got, _ := nt.alloc("again"); got != 1 {
		t.Fatalf("freed slot 1 not given again: %d", got)
	}
	nt.take(3, "recovered")
	if got, _ := nt.alloc("next"); got != 4 {
		t.Fatalf("slot taken at start-up given again: %d", got)
	}
	for i := 5; i < maxSlots; i++ {
		nt.take(i, "x")
	}
	_, err := nt.alloc("one too many")
	if err == nil || api.KindOf(err) != api.KindConflict || !strings.Contains(err.Error(), "id ranges are in use: remove sandboxes") {
		t.Fatalf("full table: %v (%s)", err, api.KindOf(err))
	}
	if slotOf(uidStart+7*65536) != 7 {
		t.Fatalf("slotOf: %d", slotOf(uidStart+7*65536))
	}
}

// A slot's sandbox is found with its policy only while it has one (is
// networked); a slot no sandbox holds finds nothing.
func TestNetTableLookup(t *testing.T) {
	var nt netTable
	slot, _ := nt.alloc("sb")
	if id, _, ok := nt.lookup(slot + 1); ok || id != "" {
		t.Fatalf("free slot: %q, %v", id, ok)
	}
	if id, _, ok := nt.lookup(slot); ok || id != "sb" {
		t.Fatalf("not networked: %q, %v", id, ok)
	}
	pol := egress.Policy{Mode: egress.Mode(api.NetAllow), Allow: []string{"example.com"}}
	nt.setPolicy("sb", pol)
	id, got, ok := nt.lookup(slot)
	if !ok || id != "sb" || !slices.Equal(got.Allow, pol.Allow) {
		t.Fatalf("networked: %q, %+v, %v", id, got, ok)
	}
	if ids := nt.networkedIDs(); !slices.Equal(ids, []string{"sb"}) {
		t.Fatalf("networkedIDs: %v", ids)
	}
	nt.drop("sb")
	if _, _, ok := nt.lookup(slot); ok {
		t.Fatal("policy dropped but still found")
	}
	nt.setPolicy("sb", pol)
	nt.free(slot)
	if _, _, ok := nt.lookup(slot); ok {
		t.Fatal("slot freed but still found")
	}
}

// Concurrent allocations never give one slot twice, and lookups run
// alongside.
func TestNetTableConcurrentAlloc(t *testing.T) {
	var nt netTable
	const workers, each = 8, 100
	got := make([][]int, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				id := newID()
				s, err := nt.alloc(id)
				if err != nil {
					t.Error(err)
					return
				}
				nt.setPolicy(id, egress.Policy{})
				if gid, _, ok := nt.lookup(s); !ok || gid != id {
					t.Errorf("slot %d: %q, %v; want %q", s, gid, ok, id)
				}
				got[w] = append(got[w], s)
			}
		}()
	}
	wg.Wait()
	all := slices.Sorted(slices.Values(slices.Concat(got...)))
	for i, s := range all {
		if s != i {
			t.Fatalf("slots given: %v...; slot %d given twice or skipped", all[:min(len(all), i+2)], i)
		}
	}
	if len(all) != workers*each || len(nt.networkedIDs()) != workers*each {
		t.Fatalf("%d slots, %d policies; want %d", len(all), len(nt.networkedIDs()), workers*each)
	}
}
