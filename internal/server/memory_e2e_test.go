package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// Snapshots and forks that keep processes, on each tier with memory
// checkpoints; the linux tier refuses them by name.
func TestMemorySnapshots(t *testing.T) {
	for _, tier := range []string{"gvisor", "microvm"} {
		t.Run(tier, func(t *testing.T) { testMemorySnapshots(t, tier) })
	}
}

func testMemorySnapshots(t *testing.T, tier string) {
	e := newTierEnv(t)
	e.need(t, tier)
	ctx := context.Background()
	sb := e.createOn(t, tier)
	defer e.c.Remove(ctx, sb.ID, true)
	e.sh(t, sb.ID, "mkdir -p /root && echo one > /root/f")
	e.ticker(t, sb.ID)
	n := e.waitCount(t, sb.ID, 3)

	// A snapshot with memory; the source runs on where it was.
	snap, err := e.c.Snapshot(ctx, sb.ID, api.SnapshotRequest{Name: "warm-" + tier, Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Memory || snap.MemorySize <= 0 || snap.Runtime != tier {
		t.Fatalf("snapshot: %+v (want memory kept, of %s)", snap, tier)
	}
	if _, err := os.Stat(filepath.Join(e.data, "memory", snap.ID)); err != nil {
		t.Fatalf("the snapshot's memory: %v", err)
	}
	cur, err := e.c.Get(ctx, sb.ID)
	if err != nil || cur.State != api.StateRunning || cur.Resumed != "" {
		t.Fatalf("source after the snapshot: %+v %v", cur, err)
	}
	atSnap := e.count(t, sb.ID)
	if atSnap < n {
		t.Fatalf("source counter went back from %d to %d", n, atSnap)
	}
	e.waitCount(t, sb.ID, atSnap+2)
	e.sh(t, sb.ID, "echo two > /root/f")

	// Forks that keep processes: each runs on from the source's state,
	// with its own hostname, independent of the others.
	forks, err := e.c.Fork(ctx, sb.ID, api.ForkRequest{Count: 2, Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		defer e.c.Remove(ctx, f.ID, true)
	}
	atFork := e.count(t, sb.ID)
	for i, f := range forks {
		if f.Resumed != api.ResumedRestored || f.Runtime != tier {
			t.Fatalf("fork %d: %+v (want restored on %s)", i, f, tier)
		}
		if c := e.count(t, f.ID); c < atSnap+2 {
			t.Fatalf("fork %d's counter is %d, the source's was at least %d: the process did not come along", i, c, atSnap+2)
		}
		res := e.sh(t, f.ID, "cat /root/f; hostname")
		if want := "two\n" + f.Hostname + "\n"; string(res.Stdout) != want {
			t.Fatalf("fork %d: %q, want %q", i, res.Stdout, want)
		}
		e.waitCount(t, f.ID, e.count(t, f.ID)+2)
	}
	e.sh(t, forks[0].ID, "echo mine > /root/f")
	for _, id := range []string{forks[1].ID, sb.ID} {
		if res := e.sh(t, id, "cat /root/f"); string(res.Stdout) != "two\n" {
			t.Fatalf("%s sees the fork's write: %q", id, res.Stdout)
		}
	}
	if c := e.count(t, sb.ID); c < atFork {
		t.Fatalf("the source's counter went back after the fork: %d < %d", c, atFork)
	}

	// A sandbox created from the snapshot runs on from its instant, on
	// the snapshot's tier by default.
	made := e.create(t, api.CreateRequest{From: snap.Name})
	defer e.c.Remove(ctx, made.ID, true)
	if made.Runtime != tier || made.Resumed != api.ResumedRestored {
		t.Fatalf("created from the snapshot: %+v", made)
	}
	if res := e.sh(t, made.ID, "cat /root/f; hostname"); string(res.Stdout) != "one\n"+made.Hostname+"\n" {
		t.Fatalf("created from the snapshot: %q", res.Stdout)
	}
	if c := e.count(t, made.ID); c < n || c > atFork {
		t.Fatalf("created from the snapshot: counter %d, want the snapshot's (%d..%d)", c, n, atFork)
	}
	e.waitCount(t, made.ID, e.count(t, made.ID)+2)

	// Restore in place: files and processes go back to the snapshot.
	got, err := e.c.Restore(ctx, sb.ID, snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Resumed != api.ResumedRestored || got.State != api.StateRunning {
		t.Fatalf("restored: %+v", got)
	}
	if res := e.sh(t, sb.ID, "cat /root/f; hostname"); string(res.Stdout) != "one\n"+sb.Hostname+"\n" {
		t.Fatalf("after restore: %q", res.Stdout)
	}
	e.waitCount(t, sb.ID, e.count(t, sb.ID)+2)

	// A paused sandbox is snapshotted and stays paused.
	if _, err := e.c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	ps, err := e.c.Snapshot(ctx, sb.ID, api.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatalf("memory snapshot of a paused sandbox: %v", err)
	}
	defer e.c.RemoveSnapshot(ctx, ps.ID)
	if cur, err := e.c.Get(ctx, sb.ID); err != nil || cur.State != api.StatePaused {
		t.Fatalf("after a memory snapshot of a paused sandbox: %+v %v", cur, err)
	}
	if _, err := e.c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.waitCount(t, sb.ID, e.count(t, sb.ID)+2)

	// Saved memory that was damaged on disk: a sandbox made from it boots
	// with the snapshot's files, says so, and the daemon goes on.
	filepath.WalkDir(filepath.Join(e.data, "memory", ps.ID), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if st, err := os.Stat(p); err == nil && st.Size() > 64 {
				os.Truncate(p, st.Size()/2)
			}
		}
		return nil
	})
	broken := e.create(t, api.CreateRequest{From: ps.ID})
	defer e.c.Remove(ctx, broken.ID, true)
	if broken.Resumed != api.ResumedRestarted || broken.State != api.StateRunning {
		t.Fatalf("created from damaged memory: %+v (want running, restarted)", broken)
	}
	if res := e.sh(t, broken.ID, "cat /root/f"); string(res.Stdout) != "one\n" {
		t.Fatalf("files of a sandbox whose memory was damaged: %q", res.Stdout)
	}
	evs, err := e.c.Events(ctx, client.EventFilter{Sandbox: broken.ID, Type: "sandbox.restore_failed"})
	if err != nil || len(evs) == 0 {
		t.Fatalf("no restore_failed event for damaged memory: %v %v", evs, err)
	}

	// A stopped sandbox has no processes to keep; nothing is lost.
	if _, err := e.c.Stop(ctx, made.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Snapshot(ctx, made.ID, api.SnapshotRequest{Memory: true})
	if ae := wantKind(t, err, api.KindConflict); !strings.Contains(ae.Message, "stopped") {
		t.Fatalf("memory snapshot of a stopped sandbox: %v", ae)
	}
	_, err = e.c.Fork(ctx, made.ID, api.ForkRequest{Memory: true})
	wantKind(t, err, api.KindConflict)
	if list, _ := e.c.Snapshots(ctx, made.ID); len(list) != 0 {
		t.Fatalf("a refused snapshot was recorded: %+v", list)
	}

	// The linux tier says it cannot, by name.
	lx := e.create(t, api.CreateRequest{})
	defer e.c.Remove(ctx, lx.ID, true)
	_, err = e.c.Snapshot(ctx, lx.ID, api.SnapshotRequest{Memory: true})
	if ae := wantKind(t, err, api.KindUnsupported); !strings.Contains(ae.Message, "linux runtime") {
		t.Fatalf("memory snapshot on linux: %v", ae)
	}
	_, err = e.c.Fork(ctx, lx.ID, api.ForkRequest{Memory: true})
	wantKind(t, err, api.KindUnsupported)
	if tier == "gvisor" {
		// A linux sandbox from the memory snapshot starts with its files
		// (a microVM's files are a disk image only a microVM reads).
		fl := e.create(t, api.CreateRequest{From: snap.ID, Runtime: "linux"})
		defer e.c.Remove(ctx, fl.ID, true)
		if fl.Resumed == api.ResumedRestored {
			t.Fatalf("a linux sandbox restored gvisor memory: %+v", fl)
		}
		if res := e.sh(t, fl.ID, "cat /root/f"); string(res.Stdout) != "one\n" {
			t.Fatalf("linux sandbox from the snapshot: %q", res.Stdout)
		}
	}

	// Removing the snapshot removes its memory.
	if err := e.c.RemoveSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.data, "memory", snap.ID)); !os.IsNotExist(err) {
		t.Fatalf("memory left after the snapshot's removal: %v", err)
	}
	if err := e.c.RemoveSnapshot(ctx, ps.ID); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.data, "memory")); len(ents) != 0 {
		t.Fatalf("left in the memory directory: %v", ents)
	}
}
