package sandbox

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A sandbox gets attributeBurst attributions at once, then attributeRate
// a second; a long quiet time refills its bucket to the burst and no
// more; sandboxes have buckets of their own, and a dropped one starts
// full again.
func TestAttrRations(t *testing.T) {
	var r attrRations
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	takes := func(id string, at time.Time) int {
		n := 0
		for r.take(id, at) {
			n++
		}
		return n
	}
	if n := takes("x", t0); n != int(attributeBurst) {
		t.Fatalf("burst: %d, want %g", n, attributeBurst)
	}
	if n := takes("y", t0); n != int(attributeBurst) {
		t.Fatalf("another sandbox's burst: %d", n)
	}
	if n := takes("x", t0.Add(500*time.Millisecond)); n != int(attributeRate/2) {
		t.Fatalf("half a second later: %d, want %g", n, attributeRate/2)
	}
	if n := takes("x", t0.Add(time.Hour)); n != int(attributeBurst) {
		t.Fatalf("an hour later: %d, want the burst %g", n, attributeBurst)
	}
	r.drop("x")
	if n := takes("x", t0.Add(time.Hour)); n != int(attributeBurst) {
		t.Fatalf("dropped: %d, want a full bucket", n)
	}
}

// Concurrent takes at one moment grant the burst exactly: no token is
// given twice.
func TestAttrRationsConcurrent(t *testing.T) {
	var r attrRations
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var granted atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if r.take("x", t0) {
					granted.Add(1)
				}
				r.take(string(rune('a'+w)), t0)
			}
		}()
	}
	wg.Wait()
	if g := granted.Load(); g != int64(attributeBurst) {
		t.Fatalf("%d granted at one moment, want the burst %g", g, attributeBurst)
	}
}
