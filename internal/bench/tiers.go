package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// Issue 7's targets: a gVisor sandbox's cold start ≤ 1.2× a raw runsc run
// of the same root filesystem; checkpoint + restore of an idle gVisor
// sandbox ≤ 500 ms. (The microVM's, against a raw QEMU boot, is a go test
// benchmark of internal/isolate/microvm.)
const (
	tierN        = 20
	tierRatio    = 1.2
	checkpointN  = 10
	checkpointMs = 500
	busyboxTag   = "den-bench-busybox:2"
)

// tierInfo returns the daemon's description of a tier, or an error saying
// why the scenario cannot run.
func (b *runner) tierInfo(ctx context.Context, name string) (*api.RuntimeInfo, error) {
	info, err := b.cl.Info(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range info.Runtimes {
		if r.Name == name {
			if !r.Available {
				return nil, fmt.Errorf("the daemon cannot run the %s tier: %s", name, r.Reason)
			}
			return &r, nil
		}
	}
	return nil, fmt.Errorf("the daemon does not know the %s tier (an older den?)", name)
}

// busyboxImage builds (once) an image holding only /bin/busybox and
// /bin/sh, the same root file system the raw peers boot.
func (b *runner) busyboxImage(ctx context.Context, busybox string) error {
	if _, err := b.cl.Image(ctx, busyboxTag); err == nil {
		return nil
	}
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	df := "FROM scratch\nCOPY busybox /bin/busybox\nCOPY busybox /bin/sh\nCOPY passwd /etc/passwd\n"
	for name, data := range map[string][]byte{"Dockerfile": []byte(df), "busybox": bin, "passwd": []byte("root:x:0:0:root:/root:/bin/sh\n")} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg})
		tw.Write(data)
	}
	tw.Close()
	_, err = b.cl.BuildImage(ctx, &buf, client.BuildOptions{Tag: busyboxTag}, nil)
	return err
}

// createExec is the den side of a cold start: create a sandbox of the
// busybox image on tier and run true in it, until the answer; the removal
// that follows is not timed.
func (b *runner) createExec(tier string) func(ctx context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		t0 := time.Now()
		sb, err := b.cl.Create(ctx, api.CreateRequest{Image: busyboxTag, Runtime: tier, Labels: b.labels()})
		if err != nil {
			return 0, err
		}
		res, err := b.cl.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"/bin/busybox", "true"}})
		d := time.Since(t0)
		b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d in a %s sandbox", res.ExitCode, tier)
		}
		return d, err
	}
}

// gvisorScenario: cold start against raw runsc, and hibernate + resume
// (checkpoint + restore) of an idle sandbox.
func (b *runner) gvisorScenario(ctx context.Context) error {
	ti, err := b.tierInfo(ctx, "gvisor")
	if err != nil {
		return err
	}
	// The peer is the daemon's own runsc where this host has it (den serve
	// --runsc), else the one on PATH.
	runsc := ti.Details["runsc_path"]
	if _, err := os.Stat(runsc); runsc == "" || err != nil {
		if runsc, err = exec.LookPath("runsc"); err != nil {
			return fmt.Errorf("runsc not found in PATH (apt-get install runsc)")
		}
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox not found in PATH (apt-get install busybox-static)")
	}
	if err := b.busyboxImage(ctx, busybox); err != nil {
		return fmt.Errorf("build the busybox image: %w", err)
	}
	if b.runsc == nil || b.runsc.argv == nil {
		b.runsc = &Peer{Name: "runsc"}
		b.rep.Peers = append(b.rep.Peers, b.runsc)
		if err := b.makeBundle(runsc, busybox); err != nil {
			return err
		}
	}
	platform := ti.Details["platform"]
	argv := append([]string(nil), b.runsc.argv...)
	for i, a := range argv {
		if strings.HasPrefix(a, "--platform=") && platform != "" {
			argv[i] = "--platform=" + platform
		}
	}
	n := b.iterations(tierN)
	var den, raw []time.Duration
	err = b.loop(ctx, "gvisor", n,
		timed(&den, b.createExec("gvisor")),
		timed(&raw, func(ctx context.Context) (time.Duration, error) {
			b.runscSeq++
			id := fmt.Sprintf("den-bench-%s-g%d", b.runID, b.runscSeq)
			d, err := timeExec(ctx, append(append([]string(nil), argv...), id), "")
			if err != nil {
				del := append(append([]string(nil), argv[:3]...), "delete", "--force", id)
				exec.Command(del[0], del[1:]...).Run()
			}
			return d, err
		}),
	)
	if len(den) > 0 && len(raw) > 0 {
		dr := statsRow("gvisor", "den create --runtime gvisor + exec true (busybox image, SDK)", den)
		rr := statsRow("gvisor", fmt.Sprintf("runsc run of the same busybox root, %s (peer)", platform), raw)
		ratio := dr.compare(rr, "runsc p50")
		dr.judge(fmt.Sprintf("≤ %g× runsc p50", tierRatio), ratio, tierRatio)
		b.add(dr, rr)
	}
	if err != nil {
		return err
	}
	// Checkpoint + restore: hibernate and resume of an idle sandbox.
	sb, err := b.cl.Create(ctx, api.CreateRequest{Image: busyboxTag, Runtime: "gvisor", Labels: b.labels()})
	if err != nil {
		return err
	}
	defer b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
	var hib, res, both []time.Duration
	for i := 0; i < b.iterations(checkpointN); i++ {
		t0 := time.Now()
		if _, err := b.cl.Hibernate(ctx, sb.ID); err != nil {
			return err
		}
		t1 := time.Now()
		got, err := b.cl.Resume(ctx, sb.ID)
		if err != nil {
			return err
		}
		t2 := time.Now()
		if got.Resumed != api.ResumedRestored {
			return fmt.Errorf("resume of a hibernated gVisor sandbox was %q, not restored from its checkpoint", got.Resumed)
		}
		hib, res, both = append(hib, t1.Sub(t0)), append(res, t2.Sub(t1)), append(both, t2.Sub(t0))
	}
	br := statsRow("gvisor", "hibernate + resume of an idle gVisor sandbox (checkpoint + restore, API)", both)
	br.judge(fmt.Sprintf("p50 ≤ %d ms", checkpointMs), br.p50(), checkpointMs)
	b.add(br, statsRow("gvisor", "  of which hibernate (runsc checkpoint)", hib), statsRow("gvisor", "  of which resume (runsc restore)", res))
	return b.memoryForks(ctx, "gvisor", sb.ID)
}

// memoryForks times, on one running sandbox, a snapshot that keeps its
// processes and a fork that does (until the fork answers an exec), beside
// a files-only fork (which boots its fork afresh) in the same run.
func (b *runner) memoryForks(ctx context.Context, tier, id string) error {
	var snaps, memForks, fileForks []time.Duration
	fork := func(memory bool) (time.Duration, error) {
		t0 := time.Now()
		list, err := b.cl.Fork(ctx, id, api.ForkRequest{Memory: memory, Labels: b.labels()})
		if err != nil {
			return 0, err
		}
		_, err = b.cl.Exec(ctx, list[0].ID, api.ExecRequest{Cmd: []string{"/bin/busybox", "true"}})
		d := time.Since(t0)
		b.cl.Remove(context.WithoutCancel(ctx), list[0].ID, true)
		if err == nil && memory && list[0].Resumed != api.ResumedRestored {
			err = fmt.Errorf("a fork with memory was %q, not restored from the checkpoint", list[0].Resumed)
		}
		return d, err
	}
	for i := 0; i < b.iterations(checkpointN); i++ {
		t0 := time.Now()
		snap, err := b.cl.Snapshot(ctx, id, api.SnapshotRequest{Memory: true})
		if err != nil {
			return err
		}
		snaps = append(snaps, time.Since(t0))
		b.cl.RemoveSnapshot(context.WithoutCancel(ctx), snap.ID)
		d, err := fork(true)
		if err != nil {
			return err
		}
		memForks = append(memForks, d)
		if d, err = fork(false); err != nil {
			return err
		}
		fileForks = append(fileForks, d)
	}
	fr := statsRow(tier, "fork --memory of an idle sandbox until the fork answers exec (API)", memForks)
	ff := statsRow(tier, "fork of files only, booted afresh, until it answers exec (same run)", fileForks)
	fr.compare(ff, "files-only fork p50")
	b.add(statsRow(tier, "snapshot --memory of an idle sandbox (checkpoint, copy, restore; API)", snaps), fr, ff)
	return nil
}
