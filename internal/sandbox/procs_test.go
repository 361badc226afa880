package sandbox

import (
	"sync"
	"testing"
	"time"

	"github.com/den-dev/den/api"
)

// The cache keeps each sandbox's last list with its time, replaces it,
// and forgets it.
func TestProcCache(t *testing.T) {
	var c procCache
	if _, ok := c.get("x"); ok {
		t.Fatal("empty cache has a list")
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c.put("x", []api.ProcessInfo{{ID: "p1"}}, t0)
	c.put("y", nil, t0) // a sandbox with no processes: kept, empty
	c.put("x", []api.ProcessInfo{{ID: "p2"}}, t0.Add(time.Second))
	l, ok := c.get("x")
	if !ok || !l.at.Equal(t0.Add(time.Second)) || len(l.procs) != 1 || l.procs[0].ID != "p2" {
		t.Fatalf("x: %+v, %v", l, ok)
	}
	if l, ok := c.get("y"); !ok || l.procs != nil {
		t.Fatalf("y: %+v, %v", l, ok)
	}
	c.drop("x")
	if _, ok := c.get("x"); ok {
		t.Fatal("dropped list still kept")
	}
	if _, ok := c.get("y"); !ok {
		t.Fatal("dropping x dropped y")
	}
}

// Lists put, read and dropped concurrently stay each sandbox's own.
func TestProcCacheConcurrent(t *testing.T) {
	var c procCache
	var wg sync.WaitGroup
	for w := range 8 {
		id := string(rune('a' + w))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				c.put(id, []api.ProcessInfo{{ID: id, Pid: i}}, time.Time{})
				if l, ok := c.get(id); !ok || l.procs[0].ID != id || l.procs[0].Pid != i {
					t.Errorf("%s round %d: %+v, %v", id, i, l, ok)
					return
				}
				c.drop("gone-" + id)
			}
		}()
	}
	wg.Wait()
	if len(c.lists) != 8 {
		t.Fatalf("%d lists, want 8", len(c.lists))
	}
}
