package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/den-dev/den/api"
)

// Issue 6's targets: snapshot and fork of a sandbox holding 1 GiB it wrote
// p50 ≤ 300 ms each and not growing with the size; 10 forks ≤ 1 s in all;
// pause and resume ≤ 20 ms each.
const (
	snapN        = 10
	snapLimitMs  = 300
	fork10Ms     = 1000
	pauseN       = 20
	pauseLimitMs = 20
	// snapGrowth bounds snapshot p50 of the 1 GiB sandbox over that of
	// an empty one: "not growing with the size of the image" (or data).
	snapGrowth = 2.0
)

// snapshot: snapshot and fork of a sandbox holding 1 GiB against an empty
// one, 10 forks at once, and a full copy of the same files (what copying a
// disk to fork costs) as the peer.
func (b *runner) snapshot(ctx context.Context) error {
	n := b.iterations(snapN)
	fmt.Fprintln(b.errw, "snapshot: writing 1 GiB (16 × 64 MiB files) in a sandbox")
	big, err := b.filled(ctx, "mkdir -p /root/data && for i in $(seq 16); do head -c 67108864 /dev/urandom > /root/data/f$i; done; sync")
	if err != nil {
		return err
	}
	empty, err := b.filled(ctx, "true")
	if err != nil {
		return err
	}
	var snaps []string
	defer func() {
		for _, s := range snaps {
			b.cl.RemoveSnapshot(context.WithoutCancel(ctx), s)
		}
	}()
	snap := func(id string, dst *[]time.Duration) step {
		return timed(dst, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			s, err := b.cl.Snapshot(ctx, id, api.SnapshotRequest{})
			d := time.Since(t0)
			if err == nil {
				snaps = append(snaps, s.ID)
			}
			return d, err
		})
	}
	fork := func(id string, dst *[]time.Duration) step {
		return timed(dst, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			list, err := b.cl.Fork(ctx, id, api.ForkRequest{Labels: b.labels()})
			d := time.Since(t0)
			for _, f := range list {
				b.cl.Remove(context.WithoutCancel(ctx), f.ID, true)
			}
			return d, err
		})
	}
	// The first snapshot of a sandbox hashes all its files for the
	// manifest, in the background; later ones hash only changed files.
	// Measure the steady state: wait for that first manifest.
	for _, id := range []string{big.ID, empty.ID} {
		s, err := b.cl.Snapshot(ctx, id, api.SnapshotRequest{})
		if err != nil {
			return err
		}
		snaps = append(snaps, s.ID)
		for i := 0; i < 600; i++ {
			if got, err := b.cl.GetSnapshot(ctx, s.ID); err != nil || got.Digest != "" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	var sBig, sEmpty, fBig, fEmpty []time.Duration
	if err := b.loop(ctx, "snapshot", n, snap(big.ID, &sBig), snap(empty.ID, &sEmpty), fork(big.ID, &fBig), fork(empty.ID, &fEmpty)); err != nil {
		return err
	}
	// 10 forks in one call, three times.
	var ten []time.Duration
	for i := 0; i < 3; i++ {
		t0 := time.Now()
		list, err := b.cl.Fork(ctx, big.ID, api.ForkRequest{Count: 10, Labels: b.labels()})
		ten = append(ten, time.Since(t0))
		for _, f := range list {
			b.cl.Remove(context.WithoutCancel(ctx), f.ID, true)
		}
		if err != nil {
			return err
		}
	}
	sb := statsRow("snapshot", "snapshot of a sandbox holding 1 GiB it wrote (den snapshot)", sBig)
	se := statsRow("snapshot", "snapshot of an empty sandbox", sEmpty)
	sb.compare(se, "empty sandbox p50")
	sb.judge(fmt.Sprintf("p50 ≤ %d ms", snapLimitMs), sb.p50(), snapLimitMs)
	se.judge(fmt.Sprintf("1 GiB p50 ≤ %g× this", snapGrowth), *sb.Ratio, snapGrowth)
	fb := statsRow("snapshot", "fork of a sandbox holding 1 GiB (den fork, until the fork runs)", fBig)
	fe := statsRow("snapshot", "fork of an empty sandbox", fEmpty)
	fb.compare(fe, "empty sandbox p50")
	fb.judge(fmt.Sprintf("p50 ≤ %d ms", snapLimitMs), fb.p50(), snapLimitMs)
	tr := statsRow("snapshot", "10 forks of the 1 GiB sandbox in one call, total", ten)
	tr.judge(fmt.Sprintf("p50 ≤ %d ms", fork10Ms), tr.p50(), fork10Ms)
	rows := []*Row{sb, se, fb, fe, tr}
	// The peer: a plain copy of the same files, as a fork by copying does.
	if info, err := b.cl.Get(ctx, big.ID); err == nil && info.Pid > 0 {
		src := fmt.Sprintf("/proc/%d/root/root/data", info.Pid)
		if dst, err := os.MkdirTemp("/var/tmp", "den-bench-copy-"); err == nil {
			t0 := time.Now()
			err := exec.CommandContext(ctx, "cp", "-a", "--reflink=never", src, filepath.Join(dst, "data")).Run()
			d := time.Since(t0)
			os.RemoveAll(dst)
			if err == nil {
				cp := statsRow("snapshot", "peer: cp -a of the same 1 GiB (copying to fork)", []time.Duration{d})
				sb.Note = fmt.Sprintf("cp -a takes %.0f× as long", float64(d)/float64(time.Duration(sb.p50()*float64(time.Millisecond))))
				rows = append(rows, cp)
			}
		}
	}
	b.add(rows...)
	return nil
}

// filled creates a sandbox (labelled for this run) and runs the shell
// script fill in it; the sandbox is returned even when fill fails.
func (b *runner) filled(ctx context.Context, fill string) (*api.Sandbox, error) {
	sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
	if err != nil {
		return nil, err
	}
	res, err := b.cl.Exec(ctx, sb.ID, api.ExecRequest{Shell: fill, Timeout: api.Duration(10 * time.Minute)})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("%s: exit %d %s", fill, res.ExitCode, res.Stderr)
	}
	return sb, err
}

// pause: pause and resume of a sandbox running a busy process.
func (b *runner) pause(ctx context.Context) error {
	n := b.iterations(pauseN)
	sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
	if err != nil {
		return err
	}
	if _, err := b.cl.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "while :; do :; done"}); err != nil {
		return err
	}
	var p, r []time.Duration
	call := func(dst *[]time.Duration, f func(context.Context, string) (*api.Sandbox, error)) step {
		return timed(dst, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			_, err := f(ctx, sb.ID)
			return time.Since(t0), err
		})
	}
	if err := b.loop(ctx, "pause", n, call(&p, b.cl.Pause), call(&r, b.cl.Resume)); err != nil {
		return err
	}
	pr := statsRow("pause", "den pause of a sandbox running a busy loop (API round trip)", p)
	rr := statsRow("pause", "den resume of it", r)
	pr.judge(fmt.Sprintf("p50 ≤ %d ms", pauseLimitMs), pr.p50(), pauseLimitMs)
	rr.judge(fmt.Sprintf("p50 ≤ %d ms", pauseLimitMs), rr.p50(), pauseLimitMs)
	b.add(pr, rr)
	return nil
}
