package server_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/storage"
	"github.com/den-dev/den/internal/testenv/e2e"
)

// TestDefaultDiskQuota: a sandbox created without --disk gets the daemon's
// default quota, so filling its disk stops at that quota while another
// sandbox still writes, a new sandbox can be created and the daemon still
// records snapshots and events. Volumes without a size get it too.
func TestDefaultDiskQuota(t *testing.T) {
	e := newBtrfsEnvWith(t, func(e *env) { e.defDisk = 256 << 20 })
	ctx := context.Background()
	a := e.create(t, api.CreateRequest{})
	b := e.create(t, api.CreateRequest{})
	// Control: the sandbox writes freely below its quota.
	if out := string(e.sh(t, a.ID, "dd if=/dev/zero of=/root/small bs=1M count=100 2>&1; echo rc=$?; sync").Stdout); !strings.HasSuffix(out, "rc=0\n") {
		t.Fatalf("writing 100 MiB under a 256 MiB quota: %q", out)
	}
	out := string(e.sh(t, a.ID, "dd if=/dev/zero of=/root/big bs=1M count=1000 2>&1; echo rc=$?; sync").Stdout)
	if !strings.Contains(out, "rc=1") || !strings.Contains(out, "quota exceeded") {
		t.Fatalf("a sandbox without --disk wrote 1000 MiB on a 2 GiB storage with a 256 MiB default quota: %q", out)
	}
	if a.Limits.Disk != 256<<20 {
		t.Fatalf("a sandbox without --disk has disk limit %v, want the default 256m", a.Limits.Disk)
	}
	if got := string(e.sh(t, b.ID, "dd if=/dev/zero of=/root/f bs=1M count=50 2>&1; echo rc=$?").Stdout); !strings.HasSuffix(got, "rc=0\n") {
		t.Fatalf("another sandbox cannot write beside a full one: %q", got)
	}
	c := e.create(t, api.CreateRequest{})
	if got := string(e.sh(t, c.ID, "echo fresh > /root/f && cat /root/f").Stdout); got != "fresh\n" {
		t.Fatalf("a new sandbox beside a full one: %q", got)
	}
	snap, err := e.c.Snapshot(ctx, a.ID, api.SnapshotRequest{})
	if err != nil {
		t.Fatalf("snapshot of the full sandbox: %v", err)
	}
	evs, err := e.c.Events(ctx, client.EventFilter{Type: "snapshot."})
	if err != nil || len(evs) == 0 {
		t.Fatalf("the daemon's events after a sandbox filled its quota: %v %v", evs, err)
	}
	forks, err := e.c.Fork(ctx, a.ID, api.ForkRequest{})
	if err != nil || forks[0].Limits.Disk != 256<<20 {
		t.Fatalf("fork of the full sandbox: %v", err)
	}
	e.c.RemoveSnapshot(ctx, snap.ID)
	v, err := e.c.CreateVolume(ctx, api.VolumeRequest{Name: "plain"})
	if err != nil || v.Size != 256<<20 {
		t.Fatalf("a volume without a size: %+v %v, want the default 256m", v, err)
	}
}

// TestDefaultDiskWarmPool: a sandbox served from the warm pool (what most
// creates are) has the default disk quota enforced too.
func TestDefaultDiskWarmPool(t *testing.T) {
	e := newBtrfsEnvWith(t, func(e *env) { e.defDisk, e.pool = 64<<20, 1 })
	ctx := context.Background()
	var sb *api.Sandbox
	for i := 0; i < 100 && sb == nil; i++ { // until the pool has filled
		sb = e.create(t, api.CreateRequest{})
		evs, _ := e.c.Events(ctx, client.EventFilter{Sandbox: sb.ID, Type: "sandbox.create"})
		if len(evs) != 1 || !strings.Contains(string(evs[0].Data), `"warm":true`) {
			e.c.Remove(ctx, sb.ID, true)
			sb = nil
			time.Sleep(200 * time.Millisecond)
		}
	}
	if sb == nil {
		t.Fatal("no create was served from the warm pool")
	}
	out := string(e.sh(t, sb.ID, "dd if=/dev/zero of=/root/big bs=1M count=200 2>&1; echo rc=$?").Stdout)
	if sb.Limits.Disk != 64<<20 || !strings.Contains(out, "quota exceeded") {
		t.Fatalf("a pooled sandbox with disk limit %v wrote past it: %q", sb.Limits.Disk, out)
	}
}

// TestStorageReserve: with quotas off for sandboxes (--default-disk 0, said
// by the admin), a sandbox filling den's storage stops at the reserve
// (EDQUOT, not ENOSPC): the filesystem keeps working, the daemon still
// snapshots and records events, new sandboxes are refused with an error
// that says the storage is full, and are made again once space is freed.
func TestStorageReserve(t *testing.T) {
	e := newBtrfsEnvWith(t, func(e *env) {})
	ctx := context.Background()
	a := e.create(t, api.CreateRequest{})
	b := e.create(t, api.CreateRequest{})
	if a.Limits.Disk != 0 {
		t.Fatalf("disk limit %v with no default", a.Limits.Disk)
	}
	out := string(e.sh(t, a.ID, "dd if=/dev/zero of=/root/big bs=1M count=3000 2>&1; echo rc=$?; sync").Stdout)
	if !strings.Contains(out, "rc=1") || !strings.Contains(out, "quota exceeded") {
		t.Fatalf("filling den's 2 GiB storage: %q, want a quota error from the reserve", out)
	}
	if _, err := e.c.Snapshot(ctx, b.ID, api.SnapshotRequest{Name: "after-full"}); err != nil {
		t.Fatalf("snapshot with the storage full: %v", err)
	}
	if evs, err := e.c.Events(ctx, client.EventFilter{Type: "snapshot."}); err != nil || len(evs) == 0 {
		t.Fatalf("events with the storage full: %v %v", evs, err)
	}
	_, err := e.c.Create(ctx, api.CreateRequest{})
	if ae := wantKind(t, err, api.KindConflict); !strings.Contains(ae.Message, "den's storage is full") || !strings.Contains(ae.Message, "den rm") {
		t.Fatalf("create with the storage full: %s", ae.Message)
	}
	_, err = e.c.CreateVolume(ctx, api.VolumeRequest{Name: "v"})
	wantKind(t, err, api.KindConflict)
	e.sh(t, a.ID, "rm /root/big; sync")
	var c *api.Sandbox
	for i := 0; i < 100 && c == nil; i++ {
		// Freed extents count at the next commits.
		e.sh(t, b.ID, "sync; sleep 0.1")
		c, err = e.c.Create(ctx, api.CreateRequest{})
	}
	if err != nil {
		t.Fatalf("create after space was freed: %v", err)
	}
	if got := string(e.sh(t, c.ID, "dd if=/dev/zero of=/root/f bs=1M count=50 2>&1; echo rc=$?").Stdout); !strings.HasSuffix(got, "rc=0\n") {
		t.Fatalf("writing after space was freed: %q", got)
	}
}

// TestTokenStorageCaps: a token's disk cap bounds (and is the default of)
// its sandboxes' and volumes' disk, and its volumes, snapshots and images
// are bounded in number, exactly so under parallel requests, with errors
// naming the cap; the admin has no such bounds.
func TestTokenStorageCaps(t *testing.T) {
	te := tokenEnvFor(t, newBtrfsEnv(t))
	ctx := context.Background()
	_, c := te.newToken(t, api.TokenRequest{Name: "store", Disk: 64 << 20, MaxVolumes: 2, MaxSnapshots: 2, MaxImages: 1})

	_, err := c.Create(ctx, api.CreateRequest{Limits: api.Limits{Disk: 1 << 30}})
	if ae := wantKind(t, err, api.KindInvalid); ae.Field != "limits.disk" || !strings.Contains(ae.Message, "disk cap of 64m") {
		t.Fatalf("disk above the cap: %+v", ae)
	}
	sb, err := c.Create(ctx, api.CreateRequest{})
	if err != nil || sb.Limits.Disk != 64<<20 {
		t.Fatalf("a create without --disk: %+v %v, want the cap 64m", sb, err)
	}
	r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "dd if=/dev/zero of=/root/big bs=1M count=200 2>&1; echo rc=$?"})
	if err != nil || !strings.Contains(string(r.Stdout), "quota exceeded") {
		t.Fatalf("writing past the token's disk cap: %q %v", r.Stdout, err)
	}
	_, err = c.CreateVolume(ctx, api.VolumeRequest{Name: "huge", Size: 1 << 30})
	if ae := wantKind(t, err, api.KindInvalid); ae.Field != "size" || !strings.Contains(ae.Message, "64m") {
		t.Fatalf("volume above the cap: %+v", ae)
	}

	// n parallel requests of each kind: exactly the bound succeed.
	parallel := func(what string, n, want int, do func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var ok int
		var refused []error
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := do(i)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					refused = append(refused, err)
				} else {
					ok++
				}
			}()
		}
		wg.Wait()
		if ok != want || len(refused) != n-want {
			t.Fatalf("%d parallel %s under a bound of %d: %d made, refused %v", n, what, want, ok, refused)
		}
		for _, err := range refused {
			if ae := wantKind(t, err, api.KindConflict); !strings.Contains(ae.Message, fmt.Sprintf("at most %d %s", want, what)) {
				t.Fatalf("%s bound error: %s", what, ae.Message)
			}
		}
	}
	parallel("volumes", 5, 2, func(i int) error {
		v, err := c.CreateVolume(ctx, api.VolumeRequest{Name: fmt.Sprintf("vol%d", i)})
		if err == nil && v.Size != 64<<20 {
			t.Errorf("volume without a size: %v, want the cap", v.Size)
		}
		return err
	})
	// Snapshots of two sandboxes, so that the sandboxes' own locks do not
	// serialise them.
	sb2, err := c.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	parallel("snapshots", 4, 2, func(i int) error {
		_, err := c.Snapshot(ctx, []string{sb.ID, sb2.ID}[i%2], api.SnapshotRequest{})
		return err
	})
	archive := busyboxImage(t)
	parallel("images", 3, 1, func(i int) error {
		_, err := c.ImportImage(ctx, fmt.Sprintf("token-img-%d", i), bytes.NewReader(archive), nil)
		return err
	})
	// Committing is making an image too.
	_, err = c.Commit(ctx, sb.ID, api.CommitRequest{Name: "token-commit"})
	if ae := wantKind(t, err, api.KindConflict); !strings.Contains(ae.Message, "at most 1 images") {
		t.Fatalf("commit past the image bound: %s", ae.Message)
	}
	imgs, _ := te.admin.Images(ctx)
	owned := 0
	for _, i := range imgs {
		if i.Owner != "" {
			owned++
		}
	}
	if owned != 1 {
		t.Fatalf("%d images owned by the token, want 1", owned)
	}
	// Another token sees the shared image, not whose it is.
	_, other := te.newToken(t, api.TokenRequest{Name: "other"})
	imgs, _ = other.Images(ctx)
	for _, i := range imgs {
		if i.Owner != "" {
			t.Fatalf("another token sees image %s's owner %s", i.Name, i.Owner)
		}
	}
	// Room again once one is removed.
	snaps, _ := c.Snapshots(ctx, "")
	if err := c.RemoveSnapshot(ctx, snaps[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Snapshot(ctx, sb.ID, api.SnapshotRequest{}); err != nil {
		t.Fatalf("snapshot after removing one: %v", err)
	}
	// The admin has none of the token's bounds.
	for i := 0; i < 3; i++ {
		if _, err := te.admin.CreateVolume(ctx, api.VolumeRequest{Name: fmt.Sprintf("admin%d", i)}); err != nil {
			t.Fatalf("admin volume %d: %v", i, err)
		}
	}
	if _, err := te.admin.ImportImage(ctx, "admin-img", bytes.NewReader(archive), nil); err != nil {
		t.Fatalf("admin import: %v", err)
	}
}

// TestDiskQuotaTiers: on the gvisor and microvm tiers too, a sandbox
// filling its disk quota sees a full disk (a write error it can recover
// from by deleting), not I/O errors that leave its files read-only; a
// microVM's disk image is sized under the quota.
func TestDiskQuotaTiers(t *testing.T) {
	e := newBtrfsEnvWith(t, func(e *env) { addTiers(t, e) })
	img := e2e.BusyboxImage(t, e.c)
	for _, tier := range []string{"gvisor", "microvm"} {
		t.Run(tier, func(t *testing.T) {
			e.need(t, tier)
			sb := e.create(t, api.CreateRequest{Image: img, Runtime: tier, Limits: api.Limits{Disk: 64 << 20}})
			// Control: it writes below the quota.
			if out := string(e.sh(t, sb.ID, "dd if=/dev/zero of=/small bs=1M count=8 2>&1; echo rc=$?").Stdout); !strings.HasSuffix(out, "rc=0\n") {
				t.Fatalf("writing 8 MiB under a 64 MiB quota: %q", out)
			}
			out := string(e.sh(t, sb.ID, "dd if=/dev/zero of=/big bs=1M count=200 2>&1; echo rc=$?; sync").Stdout)
			if !strings.Contains(out, "rc=1") || !(strings.Contains(out, "No space left") || strings.Contains(out, "quota exceeded")) {
				t.Fatalf("writing 200 MiB under a 64 MiB quota: %q", out)
			}
			if got := string(e.sh(t, sb.ID, "rm -f /big; sync; echo after > /f && cat /f").Stdout); got != "after\n" {
				t.Fatalf("after filling the quota and deleting: %q", got)
			}
		})
	}
}

// TestStorageFullDir: with plain-directory storage (no quotas) a sandbox
// can fill the filesystem, but once its free space falls into the
// reserve new sandboxes are refused with an error that says so, and are
// made again once space is freed. (A 1 GiB ext4 image stands for the
// host's disk.)
func TestStorageFullDir(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 is not installed")
	}
	e := newEnvWith(t, 0, func(e *env) {
		img := filepath.Join(t.TempDir(), "disk.img")
		mnt := t.TempDir()
		if out, err := exec.Command("sh", "-c", "truncate -s 1G "+img+" && mkfs.ext4 -q -F "+img+" && mount -o loop "+img+" "+mnt).CombinedOutput(); err != nil {
			t.Skipf("no loop-mounted ext4 here: %v: %s", err, out)
		}
		t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
		st, err := storage.Open(storage.Config{Dir: mnt, Mode: "dir"})
		if err != nil {
			t.Fatal(err)
		}
		e.st = st
	})
	ctx := context.Background()
	a := e.create(t, api.CreateRequest{})
	out := string(e.sh(t, a.ID, "dd if=/dev/zero of=/root/big bs=1M count=2000 2>&1; echo rc=$?; sync").Stdout)
	if !strings.Contains(out, "rc=1") || !strings.Contains(out, "No space left") {
		t.Fatalf("filling a 1 GiB storage: %q", out)
	}
	_, err := e.c.Create(ctx, api.CreateRequest{})
	if ae := wantKind(t, err, api.KindConflict); !strings.Contains(ae.Message, "den's storage is nearly full") {
		t.Fatalf("create with the storage full: %s", ae.Message)
	}
	e.sh(t, a.ID, "rm /root/big; sync")
	b := e.create(t, api.CreateRequest{})
	if got := string(e.sh(t, b.ID, "echo ok > /root/f && cat /root/f").Stdout); got != "ok\n" {
		t.Fatalf("a sandbox made after space was freed: %q", got)
	}
}
