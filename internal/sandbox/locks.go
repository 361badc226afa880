package sandbox

import (
	"sync"
	"time"
)

// keyedLocks hands out one mutex per key, made on first use: a sandbox's
// (or snapshot's, volume's) lifecycle lock, one operation at a time, and
// an owner's admission lock per kind of thing (scope.go).
type keyedLocks struct {
	// mu guards m: the map, not the mutexes in it (those are taken with
	// mu released, so a long operation never blocks another key).
	mu sync.Mutex
	m  map[string]*sync.Mutex
}

// mutex is key's mutex, made on first use.
func (k *keyedLocks) mutex(key string) *sync.Mutex {
	k.mu.Lock()
	defer k.mu.Unlock()
	l, ok := k.m[key]
	if !ok {
		if k.m == nil {
			k.m = map[string]*sync.Mutex{}
		}
		l = &sync.Mutex{}
		k.m[key] = l
	}
	return l
}

// lock takes key's mutex and returns what releases it.
func (k *keyedLocks) lock(key string) func() {
	l := k.mutex(key)
	l.Lock()
	return l.Unlock
}

// forget drops key's mutex (its sandbox is gone); a holder keeps the one
// it has, and the next lock of key makes a new one.
func (k *keyedLocks) forget(key string) {
	k.mu.Lock()
	delete(k.m, key)
	k.mu.Unlock()
}

// activity is when each running sandbox was last used through the API and
// how many long requests (an exec, a followed log) are in flight on it:
// the idle timeout's clock (stopIdle) and the meters' active time.
type activity struct {
	// mu guards seen and busy.
	mu   sync.Mutex
	seen map[string]time.Time // last API activity
	busy map[string]int       // requests in flight
}

// touch records activity on id at now.
func (a *activity) touch(id string, now time.Time) {
	a.mu.Lock()
	if a.seen == nil {
		a.seen = map[string]time.Time{}
	}
	a.seen[id] = now
	a.mu.Unlock()
}

// hold marks id busy until the returned func is called, which also counts
// as activity at that moment.
func (a *activity) hold(id string) func() {
	a.mu.Lock()
	if a.busy == nil {
		a.busy = map[string]int{}
	}
	a.busy[id]++
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.busy[id]--
		if a.busy[id] <= 0 {
			delete(a.busy, id)
		}
		if a.seen == nil {
			a.seen = map[string]time.Time{}
		}
		a.seen[id] = time.Now() // in the same hold: stopIdle never sees it idle between
	}
}

// forget drops id's last activity (it stopped: its clock starts again
// when it starts). Requests in flight end their holds on their own.
func (a *activity) forget(id string) {
	a.mu.Lock()
	delete(a.seen, id)
	a.mu.Unlock()
}

// state is id's last activity and whether a request is in flight on it.
func (a *activity) state(id string) (last time.Time, busy bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.seen[id], a.busy[id] > 0
}
