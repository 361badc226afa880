package storage

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// BenchmarkSnapshot times the snapshot-and-fork of a sandbox holding 1 GiB
// it wrote: a read-only snapshot of the sandbox's subvolume, then a writable
// snapshot of that (the fork). "synced": the data was committed before;
// "dirty": it was written just before, still in the page cache, so the
// snapshot must write it out first. Run with
//
//	go test -run XXX -bench Snapshot -benchtime 10x ./internal/storage/
func BenchmarkSnapshot(b *testing.B) {
	for _, layout := range []struct {
		name  string
		files int
	}{{"64files", 64}, {"10000files", 10000}} {
		for _, dirty := range []bool{false, true} {
			name := layout.name + "/synced"
			if dirty {
				name = layout.name + "/dirty"
			}
			b.Run(name, func(b *testing.B) {
				if v := os.Getenv("DEN_DIRTY_LIMIT"); v != "" {
					fmt.Sscan(v, &dirtyLimit)
				}
				fullQgroups = os.Getenv("DEN_FULL_QGROUPS") != ""
				s := newBtrfs(b, 12<<30)
				fullQgroups = false
				sb := filepath.Join(s.Root(), "sandbox")
				must(b, s.Create(sb))
				size := (1 << 30) / layout.files
				// New files each time: btrfs starts writeback on close of a
				// file that was truncated, which would hide dirty data.
				gen := filepath.Join(sb, "gen0")
				write := func(seed byte) {
					old := gen
					gen = filepath.Join(sb, fmt.Sprint("gen", seed))
					must(b, os.Mkdir(gen, 0o755))
					for i := range layout.files {
						writeFile(b, filepath.Join(gen, fmt.Sprintf("f%05d", i)), size, seed)
					}
					os.RemoveAll(old)
				}
				t0 := time.Now()
				write(0)
				wrote := time.Since(t0)
				syncFS(b, s)
				b.Logf("writing 1 GiB: %v, and syncing it: %v (dirty limit %d)", wrote, time.Since(t0), dirtyLimit)
				var times []time.Duration
				b.ResetTimer()
				for i := range b.N {
					b.StopTimer()
					if dirty {
						write(byte(i + 1))
					}
					snap, fork := filepath.Join(s.Root(), "snap"), filepath.Join(s.Root(), "fork")
					b.StartTimer()
					t0 := time.Now()
					must(b, s.Snapshot(sb, snap, true))
					must(b, s.Snapshot(snap, fork, false))
					times = append(times, time.Since(t0))
					b.StopTimer()
					must(b, s.Delete(fork))
					must(b, s.Delete(snap))
					syncFS(b, s)
					b.StartTimer()
				}
				b.StopTimer()
				slices.Sort(times)
				b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(times[len(times)-1].Microseconds())/1000, "max-ms")
				b.Logf("%s: %d runs, p50 %v, max %v, loop flags %#x, options %s, quotas %s", name, len(times), times[len(times)/2], times[len(times)-1], loopFlags, mountOptions, s.QuotaMode())
				u, _ := s.Usage(sb)
				b.Logf("sandbox usage %d MiB", u>>20)
			})
		}
	}
}

// BenchmarkRoom times the check a create makes before it makes a tree (a
// qgroup read from sysfs and two statfs on btrfs):
//
//	go test -run XXX -bench Room ./internal/storage/
func BenchmarkRoom(b *testing.B) {
	s := newBtrfs(b, 1<<30)
	if !s.ReserveEnforced() {
		b.Skipf("no reserve: %s", s.Why())
	}
	for b.Loop() {
		if err := s.Room(); err != nil {
			b.Fatal(err)
		}
	}
}
