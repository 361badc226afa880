package sandbox

import (
	"bytes"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/egress"
	"github.com/den-dev/den/internal/isolate"
)

// Every method of each feature's state type takes that type's mutex
// (the test runs without -race, which needs cgo): with the mutex held
// by the test, each call must wait for it. A method that touched its
// maps without the mutex would run to the end instead.
func TestFeatureLockContract(t *testing.T) {
	var (
		k  keyedLocks
		a  activity
		ms meterSet
		nt netTable
		r  attrRations
		pc procCache
		mu Manager
	)
	release := a.hold("x") // for the release call below
	t0 := time.Now()
	calls := []struct {
		name string
		mu   *sync.Mutex
		call func()
	}{
		{"keyedLocks.mutex", &k.mu, func() { k.mutex("a") }},
		{"keyedLocks.lock", &k.mu, func() { k.lock("b")() }},
		{"keyedLocks.forget", &k.mu, func() { k.forget("a") }},
		{"activity.touch", &a.mu, func() { a.touch("x", t0) }},
		{"activity.hold", &a.mu, func() { a.hold("y") }},
		{"activity.hold's release", &a.mu, release},
		{"activity.forget", &a.mu, func() { a.forget("x") }},
		{"activity.state", &a.mu, func() { a.state("x") }},
		{"meterSet.start", &ms.mu, func() { ms.start("x", api.Usage{}, t0) }},
		{"meterSet.fold", &ms.mu, func() { ms.fold("x", isolate.Stats{}, t0, t0, false) }},
		{"meterSet.total", &ms.mu, func() { ms.total("x") }},
		{"meterSet.copy", &ms.mu, func() { ms.copy() }},
		{"meterSet.drop", &ms.mu, func() { ms.drop("x") }},
		{"netTable.alloc", &nt.mu, func() { nt.alloc("x") }},
		{"netTable.take", &nt.mu, func() { nt.take(5, "y") }},
		{"netTable.free", &nt.mu, func() { nt.free(5) }},
		{"netTable.setPolicy", &nt.mu, func() { nt.setPolicy("x", egress.Policy{}) }},
		{"netTable.lookup", &nt.mu, func() { nt.lookup(0) }},
		{"netTable.networkedIDs", &nt.mu, func() { nt.networkedIDs() }},
		{"netTable.drop", &nt.mu, func() { nt.drop("x") }},
		{"attrRations.take", &r.mu, func() { r.take("x", t0) }},
		{"attrRations.drop", &r.mu, func() { r.drop("x") }},
		{"procCache.put", &pc.mu, func() { pc.put("x", nil, t0) }},
		{"procCache.get", &pc.mu, func() { pc.get("x") }},
		{"procCache.drop", &pc.mu, func() { pc.drop("x") }},
		{"Manager.box", &mu.mu, func() { mu.box("x") }},
		{"Manager.running", &mu.mu, func() { mu.running() }},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) { waitsFor(t, c.mu, c.call) })
	}
}

// waitsFor fails t unless call, run while mu is held, blocks on a mutex
// until mu is released. It looks at the goroutine's stack, not at the
// clock: it waits until the call has either finished (a failure: it did
// not need mu) or is parked in Mutex.Lock.
func waitsFor(t *testing.T, mu *sync.Mutex, call func()) {
	t.Helper()
	mu.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		lockContractCall(call)
	}()
	for {
		select {
		case <-done:
			mu.Unlock()
			t.Fatal("ran to the end while its type's mutex was held")
		default:
		}
		if blockedInLock("lockContractCall") {
			break
		}
		runtime.Gosched()
	}
	mu.Unlock()
	<-done
}

// lockContractCall names the goroutine of a call under test in stacks.
//
//go:noinline
func lockContractCall(call func()) { call() }

// blockedInLock reports whether a goroutine running fn waits in
// sync.Mutex.Lock.
func blockedInLock(fn string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		s := string(g)
		if strings.Contains(s, "."+fn+"(") && strings.Contains(s, "sync.(*Mutex).Lock") && strings.Contains(strings.SplitN(s, "\n", 2)[0], "[sync.Mutex.Lock") {
			return true
		}
	}
	return false
}
