package microvm

import (
	"sync"
	"time"
)

func rdtsc() uint64

var tscOnce struct {
	sync.Once
	khz int64
}

// hostTSCkHz measures the host's TSC rate. A TCG guest's TSC runs at the
// host's (QEMU reads the host TSC), and a guest kernel that cannot
// calibrate its TSC (no reliable PIT under emulation, no HPET on microvm)
// may hang at boot; den tells it the rate (tsc_early_khz).
func hostTSCkHz() int64 {
	tscOnce.Do(func() {
		var best int64
		for i := 0; i < 3; i++ {
			t0, c0 := time.Now(), rdtsc()
			time.Sleep(20 * time.Millisecond)
			t1, c1 := time.Now(), rdtsc()
			khz := int64(float64(c1-c0) / float64(t1.Sub(t0).Nanoseconds()) * 1e6)
			if i == 0 || khz < best {
				best = khz // the least disturbed sample is the slowest
			}
		}
		tscOnce.khz = best
	})
	return tscOnce.khz
}
