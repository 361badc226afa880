package sandbox

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/isolate"
)

// fold turns readings into totals: the time between readings is alive
// time, active time too when the sandbox was busy or used since the last
// reading, CPU and bytes sent are the counters' growth (all of a counter
// that restarted with its box), memory is integrated over time.
func TestMeterFold(t *testing.T) {
	var ms meterSet
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if ms.fold("x", isolate.Stats{}, t0, time.Time{}, false) {
		t.Fatal("a sandbox without a meter is due to be saved")
	}
	if _, ok := ms.total("x"); ok {
		t.Fatal("a sandbox without a meter has totals")
	}
	ms.start("x", api.Usage{CPUSeconds: 100}, time.Time{}) // recovered: no reading yet
	ms.start("x", api.Usage{}, t0)                         // a second start keeps the first
	ms.fold("x", isolate.Stats{CPU: 5 * time.Second, NetTxBytes: 50}, t0, time.Time{}, false)
	if u, _ := ms.total("x"); u != (api.Usage{CPUSeconds: 100}) {
		t.Fatalf("the first reading is the baseline only: %+v", u)
	}
	// 10 s, idle: 3 s of CPU, 1 GiB held, 1000 bytes sent.
	ms.fold("x", isolate.Stats{CPU: 8 * time.Second, Memory: 1 << 30, NetTxBytes: 1050}, t0.Add(10*time.Second), t0.Add(-time.Second), false)
	u, _ := ms.total("x")
	want := api.Usage{CPUSeconds: 103, MemoryGiBHours: 10.0 / 3600, AliveSeconds: 10, EgressBytes: 1000}
	if !usageNear(u, want) {
		t.Fatalf("idle 10 s: %+v, want %+v", u, want)
	}
	// 10 s, busy; then 10 s with use since the last reading; then 10 s
	// with use before it only.
	ms.fold("x", isolate.Stats{CPU: 8 * time.Second, NetTxBytes: 1050}, t0.Add(20*time.Second), time.Time{}, true)
	ms.fold("x", isolate.Stats{CPU: 8 * time.Second, NetTxBytes: 1050}, t0.Add(30*time.Second), t0.Add(25*time.Second), false)
	ms.fold("x", isolate.Stats{CPU: 8 * time.Second, NetTxBytes: 1050}, t0.Add(40*time.Second), t0.Add(25*time.Second), false)
	u, _ = ms.total("x")
	want.AliveSeconds, want.ActiveSeconds = 40, 20
	if !usageNear(u, want) {
		t.Fatalf("busy, used, idle: %+v, want %+v", u, want)
	}
	// The box restarted: its counters are counted from zero.
	ms.fold("x", isolate.Stats{CPU: 2 * time.Second, NetTxBytes: 7}, t0.Add(50*time.Second), time.Time{}, false)
	u, _ = ms.total("x")
	want.CPUSeconds, want.EgressBytes, want.AliveSeconds = 105, 1007, 50
	if !usageNear(u, want) {
		t.Fatalf("restarted counters: %+v, want %+v", u, want)
	}
	ms.drop("x")
	if _, ok := ms.total("x"); ok {
		t.Fatal("dropped meter still has totals")
	}
}

func usageNear(a, b api.Usage) bool {
	near := func(x, y float64) bool { return math.Abs(x-y) < 1e-9 }
	return near(a.CPUSeconds, b.CPUSeconds) && near(a.MemoryGiBHours, b.MemoryGiBHours) && near(a.AliveSeconds, b.AliveSeconds) &&
		near(a.ActiveSeconds, b.ActiveSeconds) && a.EgressBytes == b.EgressBytes
}

// Totals are due to be saved every sixth reading after they were last
// read for saving (total).
func TestMeterSaveDue(t *testing.T) {
	var ms meterSet
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms.start("x", api.Usage{}, t0)
	due := func(n int) []bool {
		var out []bool
		for range n {
			t0 = t0.Add(time.Second)
			out = append(out, ms.fold("x", isolate.Stats{}, t0, time.Time{}, false))
		}
		return out
	}
	if got := due(6); got[4] || !got[5] {
		t.Fatalf("readings 1-6 due: %v", got)
	}
	ms.total("x")
	if got := due(6); got[4] || !got[5] {
		t.Fatalf("after a save, readings 1-6 due: %v", got)
	}
}

// copy is a snapshot: changing a meter afterwards does not change it.
func TestMeterCopy(t *testing.T) {
	var ms meterSet
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms.start("x", api.Usage{}, t0)
	ms.fold("x", isolate.Stats{Pids: 3}, t0.Add(time.Second), time.Time{}, false)
	c := ms.copy()
	ms.fold("x", isolate.Stats{Pids: 9}, t0.Add(2*time.Second), time.Time{}, false)
	if c["x"].last.Pids != 3 || c["x"].total.AliveSeconds != 1 || len(c) != 1 {
		t.Fatalf("copy changed with the meter: %+v", c)
	}
}

// Readings of many sandboxes folded concurrently, with totals and copies
// read alongside, all count.
func TestMeterConcurrent(t *testing.T) {
	var ms meterSet
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const workers, rounds = 8, 300
	var wg sync.WaitGroup
	for w := range workers {
		id := string(rune('a' + w))
		ms.start(id, api.Usage{}, t0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= rounds; i++ {
				ms.fold(id, isolate.Stats{NetTxBytes: int64(i)}, t0.Add(time.Duration(i)*time.Second), time.Time{}, i%2 == 0)
				ms.fold("shared-absent", isolate.Stats{}, t0, time.Time{}, false)
				ms.total(id)
				_ = ms.copy()
			}
		}()
	}
	wg.Wait()
	for w := range workers {
		u, _ := ms.total(string(rune('a' + w)))
		if u.AliveSeconds != rounds || u.ActiveSeconds != rounds/2 || u.EgressBytes != rounds {
			t.Fatalf("sandbox %c: %+v", 'a'+w, u)
		}
	}
}
