package sandbox

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// A key's lock has one holder at a time; other keys are not held by it,
// and the table's own mutex is not held while a key's lock is (a long
// operation on one sandbox never blocks another's).
func TestKeyedLocksOneHolderPerKey(t *testing.T) {
	var k keyedLocks
	// Control: a key nobody holds can be taken.
	if l := k.mutex("a"); !l.TryLock() {
		t.Fatal("a free key could not be taken")
	} else {
		l.Unlock()
	}
	unlock := k.lock("a")
	if k.mutex("a").TryLock() {
		t.Fatal("a held key was taken a second time")
	}
	if l := k.mutex("b"); !l.TryLock() {
		t.Fatal("holding a blocks b")
	} else {
		l.Unlock()
	}
	if !k.mu.TryLock() {
		t.Fatal("the table's mutex is held while a key's lock is")
	}
	k.mu.Unlock()
	// A forgotten key gets a new mutex; the holder keeps the old one.
	k.forget("a")
	if l := k.mutex("a"); !l.TryLock() {
		t.Fatal("a forgotten key's new mutex is held")
	} else {
		l.Unlock()
	}
	unlock()
}

// Holders of one key run one at a time: a read-yield-write of a shared
// counter under the key's lock loses no update, while other keys are
// made and taken concurrently.
func TestKeyedLocksExclusive(t *testing.T) {
	var k keyedLocks
	const workers, rounds = 8, 200
	n := 0
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				unlock := k.lock("shared")
				v := n
				runtime.Gosched()
				n = v + 1
				unlock()
				k.lock(string(rune('a'+w)) + string(rune('0'+i%10)))()
			}
		}()
	}
	wg.Wait()
	if n != workers*rounds {
		t.Fatalf("counter %d, want %d: two holders of one key ran together", n, workers*rounds)
	}
	if len(k.m) != 1+workers*10 {
		t.Fatalf("%d keys, want %d", len(k.m), 1+workers*10)
	}
}

// activity: a sandbox is busy while any of its holds is open, each
// release counts as use at that moment, and forget drops the last use but
// not the holds in flight.
func TestActivity(t *testing.T) {
	var a activity
	if last, busy := a.state("x"); !last.IsZero() || busy {
		t.Fatalf("unknown sandbox: %v, %v", last, busy)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a.touch("x", t0)
	if last, busy := a.state("x"); !last.Equal(t0) || busy {
		t.Fatalf("touched: %v, %v", last, busy)
	}
	r1, r2 := a.hold("x"), a.hold("x")
	if _, busy := a.state("x"); !busy {
		t.Fatal("not busy with two holds open")
	}
	if _, busy := a.state("y"); busy {
		t.Fatal("another sandbox is busy")
	}
	r1()
	last, busy := a.state("x")
	if !busy {
		t.Fatal("not busy with one hold still open")
	}
	if !last.After(t0) {
		t.Fatalf("a release did not count as use: last %v", last)
	}
	a.forget("x")
	if last, busy := a.state("x"); !last.IsZero() || !busy {
		t.Fatalf("forgotten with a hold open: %v, %v", last, busy)
	}
	r2()
	if last, busy := a.state("x"); last.IsZero() || busy {
		t.Fatalf("all released: %v, %v", last, busy)
	}
}

// Holds opened and closed concurrently balance: no release is lost.
func TestActivityConcurrentHolds(t *testing.T) {
	var a activity
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				release := a.hold("x")
				a.touch(string(rune('a'+w)), time.Now())
				runtime.Gosched()
				release()
			}
		}()
	}
	keep := a.hold("x")
	wg.Wait()
	if _, busy := a.state("x"); !busy {
		t.Fatal("not busy with a hold open")
	}
	keep()
	if _, busy := a.state("x"); busy || len(a.busy) != 0 {
		t.Fatalf("busy after every hold was released: %v", a.busy)
	}
}
