package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// cold: den run --rm -- true end to end vs bwrap, with the SDK calls that
// make up a den run timed in-process for comparison.
func (b *runner) cold(ctx context.Context) error {
	n := b.iterations(DefaultColdN)
	var den, bw, create, execd, remove, sdk []time.Duration
	steps := []step{timed(&den, func(ctx context.Context) (time.Duration, error) {
		d, err := timeExec(ctx, b.den.argv, "")
		if err != nil {
			return d, denFailed(err)
		}
		return d, nil
	})}
	if b.bwrap.Missing == "" {
		steps = append(steps, timed(&bw, func(ctx context.Context) (time.Duration, error) {
			return timeExec(ctx, b.bwrap.argv, "")
		}))
	}
	steps = append(steps, func(ctx context.Context, warm bool) error {
		ds, err := b.sdkCycle(ctx)
		if err != nil {
			return err
		}
		if !warm {
			create, execd, remove = append(create, ds[0]), append(execd, ds[1]), append(remove, ds[2])
			sdk = append(sdk, ds[0]+ds[1]+ds[2])
		}
		return nil
	})
	err := b.loop(ctx, "cold", n, steps...)
	if len(den) == 0 {
		return err
	}
	dr := statsRow("cold", "den run --rm -- true", den)
	b.add(dr)
	if b.bwrap.Missing == "" {
		br := statsRow("cold", "bwrap (peer)", bw)
		ratio := dr.compare(br, "bwrap p50")
		dr.judge(fmt.Sprintf("p50 ≤ %g× bwrap", coldRatio), ratio, coldRatio)
		b.add(br)
	} else {
		dr.Target, dr.Verdict, dr.Note = fmt.Sprintf("p50 ≤ %g× bwrap", coldRatio), "n/a", b.bwrap.Missing
	}
	first := statsRow("cold", "  SDK create", create)
	first.Note = "the SDK rows are timed in-process in the same loop, to show where den run's time goes"
	b.add(first,
		statsRow("cold", "  SDK exec true (stream)", execd),
		statsRow("cold", "  SDK remove", remove),
		statsRow("cold", "  SDK create+exec+remove", sdk))
	return err
}

// sdkCycle creates a sandbox, runs true in it and removes it, like den
// run --rm, timing each call.
func (b *runner) sdkCycle(ctx context.Context) ([3]time.Duration, error) {
	var ds [3]time.Duration
	t0 := time.Now()
	sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
	ds[0] = time.Since(t0)
	if err != nil {
		return ds, fmt.Errorf("create a sandbox: %w", err)
	}
	t1 := time.Now()
	st, err := b.cl.ExecStream(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}, nil, nil)
	ds[1] = time.Since(t1)
	if err == nil && (st.Reason != api.ReasonExited || st.ExitCode != 0) {
		err = fmt.Errorf("true ended %s %d %s", st.Reason, st.ExitCode, st.Error)
	}
	t2 := time.Now()
	rerr := b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
	ds[2] = time.Since(t2)
	if err != nil {
		return ds, fmt.Errorf("exec in sandbox %s: %w", shortID(sb.ID), err)
	}
	if rerr != nil {
		return ds, fmt.Errorf("remove sandbox %s: %w", shortID(sb.ID), rerr)
	}
	return ds, nil
}

// coldParallel launches P of each at once, rounds times, den and bwrap
// batches interleaved.
func (b *runner) coldParallel(ctx context.Context) error {
	p, rounds := b.o.Parallel, b.o.Rounds
	var denLat, bwLat, denWall, bwWall []time.Duration
	batch := func(argv []string, lat, wall *[]time.Duration, isDen bool) step {
		return func(ctx context.Context, warm bool) error {
			ds, w, err := launchBatch(ctx, argv, p)
			if err != nil {
				if isDen {
					return denFailed(err)
				}
				return err
			}
			if !warm {
				*lat = append(*lat, ds...)
				*wall = append(*wall, w)
			}
			return nil
		}
	}
	steps := []step{batch(b.den.argv, &denLat, &denWall, true)}
	if b.bwrap.Missing == "" {
		steps = append(steps, batch(b.bwrap.argv, &bwLat, &bwWall, false))
	}
	err := b.loop(ctx, "cold-parallel round", rounds, steps...)
	if len(denLat) == 0 {
		return err
	}
	name := fmt.Sprintf("%d× ", p)
	dl := statsRow("cold-parallel", name+"den run --rm -- true: each", denLat)
	dw := statsRow("cold-parallel", name+"den run --rm -- true: batch wall", denWall)
	b.add(dl, dw)
	if b.bwrap.Missing == "" {
		bl := statsRow("cold-parallel", name+"bwrap (peer): each", bwLat)
		bwr := statsRow("cold-parallel", name+"bwrap (peer): batch wall", bwWall)
		dl.compare(bl, "bwrap p50")
		dw.compare(bwr, "bwrap wall p50")
		b.add(bl, bwr)
	} else {
		dl.Note = b.bwrap.Missing
	}
	return err
}

// launchBatch starts p copies of argv at once and returns each one's
// latency and the wall time of the batch.
func launchBatch(ctx context.Context, argv []string, p int) ([]time.Duration, time.Duration, error) {
	var wg sync.WaitGroup
	ds := make([]time.Duration, p)
	errs := make([]error, p)
	gate := make(chan struct{})
	for i := 0; i < p; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			ds[i], errs[i] = timeExec(ctx, argv, "")
		}()
	}
	t0 := time.Now()
	close(gate)
	wg.Wait()
	wall := time.Since(t0)
	return ds, wall, errors.Join(errs...)
}

// exec: exec of true in one running sandbox through the SDK, both forms,
// vs a fork/exec of /bin/true on the host, and the den exec command line
// for reference.
func (b *runner) exec(ctx context.Context) error {
	n := b.iterations(DefaultExecN)
	sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
	if err != nil {
		return fmt.Errorf("create a sandbox: %w", err)
	}
	defer b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
	req := api.ExecRequest{Cmd: []string{"true"}}
	check := func(st *api.ExitStatus) error {
		if st.Reason != api.ReasonExited || st.ExitCode != 0 {
			return fmt.Errorf("true in sandbox %s ended %s, exit code %d %s", shortID(sb.ID), st.Reason, st.ExitCode, st.Error)
		}
		return nil
	}
	cliArgv := b.denCommand("exec", sb.ID, "--", "true")
	var js, stream, host, cliD []time.Duration
	err = b.loop(ctx, "exec", n,
		timed(&js, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			res, err := b.cl.Exec(ctx, sb.ID, req)
			d := time.Since(t0)
			if err != nil {
				return d, fmt.Errorf("exec (JSON form): %w", err)
			}
			return d, check(&res.ExitStatus)
		}),
		timed(&stream, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			st, err := b.cl.ExecStream(ctx, sb.ID, req, nil, nil)
			d := time.Since(t0)
			if err != nil {
				return d, fmt.Errorf("exec (stream form): %w", err)
			}
			return d, check(st)
		}),
		timed(&host, func(ctx context.Context) (time.Duration, error) {
			cmd := exec.CommandContext(ctx, "/bin/true")
			t0 := time.Now()
			err := cmd.Run()
			return time.Since(t0), err
		}),
		timed(&cliD, func(ctx context.Context) (time.Duration, error) {
			d, err := timeExec(ctx, cliArgv, "")
			if err != nil {
				return d, denFailed(err)
			}
			return d, nil
		}),
	)
	if len(js) == 0 {
		return err
	}
	target := fmt.Sprintf("p50 ≤ %gms", execLimitMs)
	jr := statsRow("exec", "den SDK Exec true (JSON)", js)
	sr := statsRow("exec", "den SDK ExecStream true", stream)
	hr := statsRow("exec", "host fork/exec /bin/true (peer)", host)
	cr := statsRow("exec", "den exec ID -- true (CLI process)", cliD)
	for _, r := range []*Row{jr, sr} {
		r.compare(hr, "host p50")
		r.judge(target, r.p50(), execLimitMs)
	}
	cr.compare(hr, "host p50")
	cr.Note = "for reference: includes starting the den binary"
	b.add(jr, sr, hr, cr)
	return err
}

// density: count idle sandboxes, their memory cost and liveness.
func (b *runner) density(ctx context.Context) (err error) {
	n := b.o.Count
	var sbs []*api.Sandbox
	var removed []time.Duration
	defer func() {
		// Always remove them, even after an error or Ctrl-C.
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		b.progressDone()
		var rerr error
		for i, sb := range sbs {
			t0 := time.Now()
			if e := b.cl.Remove(rctx, sb.ID, true); e != nil {
				rerr = errors.Join(rerr, fmt.Errorf("remove sandbox %s: %w", shortID(sb.ID), e))
			} else {
				removed = append(removed, time.Since(t0))
			}
			b.progress("density remove", i+1, len(sbs))
		}
		b.progressDone()
		if len(removed) > 0 && ctx.Err() == nil {
			r := statsRow("density", "SDK remove (each)", removed)
			r.Note = "information"
			b.add(r)
		}
		if err == nil {
			err = rerr
		}
	}()

	// Let the memory freed by earlier scenarios settle.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(settle):
	}
	before, err := meminfo("MemAvailable")
	if err != nil {
		return err
	}
	var created []time.Duration
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		t0 := time.Now()
		sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
		if err != nil {
			return fmt.Errorf("create sandbox %d of %d: %w", i+1, n, err)
		}
		created = append(created, time.Since(t0))
		sbs = append(sbs, sb)
		b.progress("density create", i+1, n)
	}
	b.progressDone()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(settle):
	}
	after, err := meminfo("MemAvailable")
	if err != nil {
		return err
	}
	const mib = 1 << 20
	var anon, pss, cg []float64
	var missing []string
	for _, sb := range sbs {
		if sb.Pid == 0 {
			if got, err := b.cl.Get(ctx, sb.ID); err == nil {
				sb.Pid = got.Pid
			}
		}
		if sb.Pid == 0 {
			missing = append(missing, shortID(sb.ID))
			continue
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", sb.Pid))
		if err != nil {
			missing = append(missing, shortID(sb.ID))
			continue
		}
		v, err := parseStatusKB(string(status), "RssAnon")
		if err != nil {
			return fmt.Errorf("/proc/%d/status: %w", sb.Pid, err)
		}
		anon = append(anon, float64(v)/mib)
		if roll, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", sb.Pid)); err == nil {
			if v, err := parseStatusKB(string(roll), "Pss"); err == nil {
				pss = append(pss, float64(v)/mib)
			}
		}
		if cgText, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sb.Pid)); err == nil {
			if file := memCgroupFile(string(cgText), "/sys/fs/cgroup"); file != "" {
				if raw, err := os.ReadFile(file); err == nil {
					if v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64); err == nil {
						cg = append(cg, float64(v)/mib)
					}
				}
			}
		}
	}
	target := fmt.Sprintf("≤ %gMiB/sandbox", densityMiB)
	drop := float64(before-after) / mib / float64(n)
	dr := &Row{Scenario: "density", Subject: "MemAvailable drop / sandbox", N: n, Unit: "MiB", Mean: ptr(drop),
		Note: fmt.Sprintf("MemAvailable %.1fMiB before the first create, %.1fMiB %.0fs after the last", float64(before)/mib, float64(after)/mib, settle.Seconds())}
	dr.judge(target, drop, densityMiB)
	if drop < 0 {
		dr.Note += "; negative: other processes freed more memory than the sandboxes took, so this figure is noise (use a larger --count)"
	}
	b.add(dr)
	if len(anon) > 0 {
		s := summarize(anon)
		r := &Row{Scenario: "density", Subject: "init RssAnon / sandbox", N: s.N, Unit: "MiB",
			P50: ptr(s.P50), P99: ptr(s.P99), Mean: ptr(s.Mean)}
		r.judge(target, s.Mean, densityMiB)
		r.Note = "sum of RssAnon of the init processes / N (the mean)"
		if len(missing) > 0 {
			r.Note += fmt.Sprintf("; no init process found for %d sandboxes", len(missing))
		}
		b.add(r)
	} else {
		return fmt.Errorf("found no init process of the sandboxes in /proc (api.Sandbox.Pid): is den bench running on the daemon's host, in its pid namespace?")
	}
	for _, x := range []struct {
		name, note string
		v          []float64
	}{
		{"init Pss / sandbox", "information: proportional set size of init, all mappings (anon, shmem, file)", pss},
		{"memory cgroup usage / sandbox", "information: the sandbox's memory cgroup, kernel memory included", cg},
	} {
		if len(x.v) == 0 {
			continue
		}
		s := summarize(x.v)
		b.add(&Row{Scenario: "density", Subject: x.name, N: s.N, Unit: "MiB",
			P50: ptr(s.P50), P99: ptr(s.P99), Mean: ptr(s.Mean), Note: x.note})
	}
	cr := statsRow("density", "SDK create (each)", created)
	cr.Note = "information"
	b.add(cr)

	// Every sandbox must answer while all are alive.
	var lat []time.Duration
	var failed []string
	for i, sb := range sbs {
		if err := ctx.Err(); err != nil {
			return err
		}
		ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
		t0 := time.Now()
		res, err := b.cl.Exec(ectx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
		d := time.Since(t0)
		cancel()
		switch {
		case err != nil:
			failed = append(failed, fmt.Sprintf("%s: %v", shortID(sb.ID), err))
		case res.Reason != api.ReasonExited || res.ExitCode != 0:
			failed = append(failed, fmt.Sprintf("%s: %s %d %s", shortID(sb.ID), res.Reason, res.ExitCode, res.Error))
		default:
			lat = append(lat, d)
		}
		b.progress("density exec", i+1, len(sbs))
	}
	b.progressDone()
	er := statsRow("density", fmt.Sprintf("exec true in each of %d alive", n), lat)
	er.Target = "all answer"
	er.Verdict = "PASS"
	er.Note = fmt.Sprintf("%d/%d answered", len(lat), n)
	if len(failed) > 0 {
		er.Verdict = "FAIL"
		if len(failed) > 3 {
			failed = append(failed[:3], "...")
		}
		er.Note += "; " + strings.Join(failed, "; ")
	}
	b.add(er)
	return nil
}

// runscScenario: den run --rm -- true vs runsc run, for information.
func (b *runner) runscScenario(ctx context.Context) error {
	n := b.iterations(DefaultRunscN)
	var den, rs []time.Duration
	err := b.loop(ctx, "runsc", n,
		timed(&den, func(ctx context.Context) (time.Duration, error) {
			d, err := timeExec(ctx, b.den.argv, "")
			if err != nil {
				return d, denFailed(err)
			}
			return d, nil
		}),
		timed(&rs, func(ctx context.Context) (time.Duration, error) {
			b.runscSeq++
			id := fmt.Sprintf("den-bench-%s-%d", b.runID, b.runscSeq)
			d, err := timeExec(ctx, append(append([]string(nil), b.runsc.argv...), id), "")
			if err != nil {
				// Leave no container behind.
				del := append(append([]string(nil), b.runsc.argv[:3]...), "delete", "--force", id)
				exec.Command(del[0], del[1:]...).Run()
			}
			return d, err
		}),
	)
	if len(den) == 0 || len(rs) == 0 {
		return err
	}
	dr := statsRow("runsc", "den run --rm -- true", den)
	rr := statsRow("runsc", "runsc run (ptrace, busybox) (peer)", rs)
	dr.compare(rr, "runsc p50")
	dr.Target, dr.Note = "information", "den p50 / runsc p50"
	b.add(dr, rr)
	return err
}

// reattach: replaying a running background process's output (the last
// 100 lines) through the API, as a client coming back would.
func (b *runner) reattach(ctx context.Context) error {
	n := b.iterations(reattachN)
	sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
	if err != nil {
		return fmt.Errorf("create a sandbox: %w", err)
	}
	defer b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
	p, err := b.cl.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "i=0; while :; do echo line $i; i=$((i+1)); sleep 0.01; done"})
	if err != nil {
		return fmt.Errorf("start a background process: %w", err)
	}
	time.Sleep(time.Second) // let it write a few screens of output
	var re, ex []time.Duration
	err = b.loop(ctx, "reattach", n,
		timed(&re, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			_, err := b.cl.Logs(ctx, sb.ID, p.ID, client.LogsOptions{Tail: 100}, io.Discard, io.Discard)
			return time.Since(t0), err
		}),
		timed(&ex, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			_, err := b.cl.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
			return time.Since(t0), err
		}),
	)
	if len(re) == 0 {
		return err
	}
	rr := statsRow("reattach", "den logs --tail 100 of a running process", re)
	er := statsRow("reattach", "den SDK Exec true (reference)", ex)
	rr.compare(er, "exec p50")
	rr.judge(fmt.Sprintf("p50 ≤ %gms", reattachMs), rr.p50(), reattachMs)
	b.add(rr, er)
	return err
}

// daemonRSS reads the daemon's resident memory from its /metrics.
func (b *runner) daemonRSS(ctx context.Context) (float64, error) {
	text, err := b.cl.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, "den_daemon_rss_bytes "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("the daemon's /metrics has no den_daemon_rss_bytes")
}

// procs: 1,000 background processes across 50 sandboxes, with the
// daemon's RSS before, with all of them running, and after listing them.
func (b *runner) procs(ctx context.Context) (err error) {
	var ids []string
	defer func() {
		for _, id := range ids {
			b.cl.Remove(context.WithoutCancel(ctx), id, true)
		}
	}()
	before, err := b.daemonRSS(ctx)
	if err != nil {
		return err
	}
	var starts []time.Duration
	total := procBoxes * procsEach
	for i := 0; i < procBoxes; i++ {
		sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
		if err != nil {
			return fmt.Errorf("create sandbox %d: %w", i+1, err)
		}
		ids = append(ids, sb.ID)
		for j := 0; j < procsEach; j++ {
			t0 := time.Now()
			if _, err := b.cl.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "echo started; exec sleep 3600"}); err != nil {
				return fmt.Errorf("start process %d in sandbox %d: %w", j+1, i+1, err)
			}
			starts = append(starts, time.Since(t0))
			b.progress("procs", len(starts), total)
		}
	}
	running, err := b.daemonRSS(ctx)
	if err != nil {
		return err
	}
	seen := 0
	for _, id := range ids {
		ps, err := b.cl.Processes(ctx, id)
		if err != nil {
			return err
		}
		for _, p := range ps {
			if p.State == api.ProcRunning {
				seen++
			}
		}
	}
	after, err := b.daemonRSS(ctx)
	if err != nil {
		return err
	}
	sr := statsRow("procs", fmt.Sprintf("start a background process (%d in %d sandboxes)", total, procBoxes), starts)
	mib := func(v float64) *float64 { return ptr(v / (1 << 20)) }
	live := &Row{Scenario: "procs", Subject: "processes running", N: seen, Unit: "count", Mean: ptr(float64(seen))}
	live.judge(fmt.Sprintf("all %d running", total), float64(total-seen), 0)
	rows := []*Row{sr, live}
	for _, m := range []struct {
		what string
		v    float64
	}{{"daemon RSS before", before}, {"daemon RSS with all running", running}, {"daemon RSS after listing all", after}} {
		r := &Row{Scenario: "procs", Subject: m.what, N: 1, Unit: "MiB", Mean: mib(m.v)}
		if m.what != "daemon RSS before" {
			r.judge(fmt.Sprintf("≤ %d MiB", procsRSSMiB), m.v/(1<<20), procsRSSMiB)
		}
		rows = append(rows, r)
	}
	b.add(rows...)
	return nil
}

// imageSize: boot time does not depend on the image's size. Two images
// made the same way (a commit of a host sandbox), one empty and one with
// a 1 GiB file, are started from interleaved; neither comes from the warm
// pool, which serves the plain host image only.
func (b *runner) imageSize(ctx context.Context) (err error) {
	n := b.iterations(imageN)
	tag := fmt.Sprintf("den-bench-%d", os.Getpid())
	small, big := tag+"-small", tag+"-1g"
	defer func() {
		for _, name := range []string{small, big} {
			b.cl.RemoveImage(context.WithoutCancel(ctx), name)
		}
	}()
	for _, img := range []struct{ name, fill string }{
		{small, "true"},
		{big, "head -c 1073741824 /dev/urandom > /var/tmp/big.bin"},
	} {
		fmt.Fprintf(b.errw, "image-size: making %s\n", img.name)
		sb, err := b.filled(ctx, img.fill)
		if sb == nil {
			return err
		}
		if err == nil {
			_, err = b.cl.Commit(ctx, sb.ID, api.CommitRequest{Name: img.name})
		}
		b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
		if err != nil {
			return fmt.Errorf("make %s: %w", img.name, err)
		}
	}
	boot := func(name string, dst *[]time.Duration) step {
		return timed(dst, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			sb, err := b.cl.Create(ctx, api.CreateRequest{Image: name, Labels: b.labels()})
			if err != nil {
				return 0, err
			}
			_, err = b.cl.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
			d := time.Since(t0)
			b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
			return d, err
		})
	}
	var ds, db []time.Duration
	err = b.loop(ctx, "image-size", n, boot(small, &ds), boot(big, &db))
	if len(ds) == 0 {
		return err
	}
	sr := statsRow("image-size", "create+exec from a small image (host + empty layer)", ds)
	br := statsRow("image-size", "create+exec from a 1 GiB image (host + 1 GiB layer)", db)
	br.compare(sr, "small image p50")
	br.judge(fmt.Sprintf("p50 ≤ %g× small", imageRatio), *br.Ratio, imageRatio)
	b.add(br, sr)
	return err
}

// rebuild: a Dockerfile rebuilt with nothing changed comes from the cache.
func (b *runner) rebuild(ctx context.Context) error {
	n := b.iterations(rebuildN)
	files := map[string]string{
		"Dockerfile": "FROM host\nENV APP=/app\nWORKDIR /app\nCOPY src/ ./src/\nRUN ls -R src > listing\nRUN echo built > stamp\nCMD [\"cat\", \"stamp\"]\n",
	}
	for i := 0; i < 200; i++ {
		files[fmt.Sprintf("src/pkg%d/file%d.txt", i%10, i)] = strings.Repeat("x", 1000+i)
	}
	contextTar := func() io.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		names := make([]string, 0, len(files))
		for k := range files {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, name := range names {
			tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(files[name])), ModTime: time.Unix(1700000000, 0)})
			tw.Write([]byte(files[name]))
		}
		tw.Close()
		return &buf
	}
	tag := fmt.Sprintf("den-bench-%d-rebuild", os.Getpid())
	defer b.cl.RemoveImage(context.WithoutCancel(ctx), tag)
	var first bytes.Buffer
	t0 := time.Now()
	if _, err := b.cl.BuildImage(ctx, contextTar(), client.BuildOptions{Tag: tag}, &first); err != nil {
		return fmt.Errorf("first build: %w", err)
	}
	firstD := time.Since(t0)
	var rebuilds []time.Duration
	cached := true
	err := b.loop(ctx, "rebuild", n, timed(&rebuilds, func(ctx context.Context) (time.Duration, error) {
		var out bytes.Buffer
		t0 := time.Now()
		_, err := b.cl.BuildImage(ctx, contextTar(), client.BuildOptions{Tag: tag}, &out)
		d := time.Since(t0)
		if strings.Count(out.String(), "using cache") != 4 {
			cached = false
		}
		return d, err
	}))
	if len(rebuilds) == 0 {
		return err
	}
	// Change the last instruction: only it runs again.
	files["Dockerfile"] = strings.Replace(files["Dockerfile"], `CMD ["cat", "stamp"]`, "RUN echo changed > stamp2", 1)
	var last bytes.Buffer
	t0 = time.Now()
	_, lerr := b.cl.BuildImage(ctx, contextTar(), client.BuildOptions{Tag: tag}, &last)
	lastD := time.Since(t0)
	fr := &Row{Scenario: "rebuild", Subject: "first build (7 steps, 200 files)", N: 1, Unit: "ms", Mean: ptr(float64(firstD.Microseconds()) / 1000)}
	rr := statsRow("rebuild", "rebuild, nothing changed", rebuilds)
	rr.judge(fmt.Sprintf("p50 ≤ %gs, all steps cached", rebuildS), rr.p50()/1000, rebuildS)
	if !cached {
		rr.Verdict, rr.Note = "FAIL", "a rebuild ran a step instead of using the cache"
	}
	lr := &Row{Scenario: "rebuild", Subject: "last instruction changed", N: 1, Unit: "ms", Mean: ptr(float64(lastD.Microseconds()) / 1000)}
	onlyLast := lerr == nil && strings.Count(last.String(), "using cache") == 4 && strings.Contains(last.String(), "Step 7/7 : RUN echo changed")
	lr.Target, lr.Verdict = "only that step runs", map[bool]string{true: "PASS", false: "FAIL"}[onlyLast]
	b.add(fr, rr, lr)
	return err
}
