package server_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/storage"
)

// newBtrfsEnv is an env whose sandboxes live on a btrfs image of its own
// (skipped where btrfs cannot be set up).
func newBtrfsEnv(t *testing.T, allow ...string) *env {
	t.Helper()
	return newBtrfsEnvWith(t, func(e *env) { e.allow = allow })
}

// newBtrfsEnvWith is newBtrfsEnv with a chance to set up the env before
// the daemon starts.
func newBtrfsEnvWith(t *testing.T, setup func(e *env)) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Skip("mkfs.btrfs is not installed (scripts/deps.sh installs btrfs-progs)")
	}
	return newEnvWith(t, 0, func(e *env) {
		st, err := storage.Open(storage.Config{Dir: e.data, Size: 2 << 30, Mode: "btrfs"})
		if err != nil {
			t.Fatalf("btrfs storage on a host with mkfs.btrfs: %v", err)
		}
		t.Cleanup(func() { st.Unmount() })
		e.st = st
		setup(e)
	})
}

func storageModes(t *testing.T, run func(t *testing.T, newEnv func(t *testing.T) *env)) {
	t.Run("dir", func(t *testing.T) { run(t, newEnv) })
	t.Run("btrfs", func(t *testing.T) { run(t, func(t *testing.T) *env { return newBtrfsEnv(t) }) })
}

// waitSealed waits for a snapshot's checksum manifest.
func (e *env) waitSealed(t *testing.T, id string) *api.Snapshot {
	t.Helper()
	for i := 0; i < 200; i++ {
		s, err := e.c.GetSnapshot(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if s.Digest != "" {
			return s
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("snapshot %s has no manifest after 10 s", id)
	return nil
}

func TestSnapshotRestoreFork(t *testing.T) {
	storageModes(t, func(t *testing.T, newEnv func(t *testing.T) *env) {
		e := newEnv(t)
		ctx := context.Background()
		sb := e.create(t, api.CreateRequest{Name: "src", Env: []string{"K=v"}})
		e.sh(t, sb.ID, "mkdir -p /work/d && echo one > /work/a && echo deep > /work/d/f && rm /etc/hostname && useradd -m -u 1500 dev 2>/dev/null || adduser -D -u 1500 dev 2>/dev/null; echo mine > /work/owned && chown 1500:1500 /work/owned")
		snap, err := e.c.Snapshot(ctx, sb.ID, api.SnapshotRequest{Name: "base"})
		if err != nil {
			t.Fatal(err)
		}
		if !snap.Paused || snap.Sandbox != sb.ID || snap.Image != sb.Image {
			t.Fatalf("snapshot %+v", snap)
		}
		e.waitSealed(t, snap.ID)
		// Change everything, then roll back.
		e.sh(t, sb.ID, "echo two > /work/a && rm -r /work/d && echo new > /work/b && echo back > /etc/hostname")
		if _, err := e.c.Restore(ctx, sb.ID, "base"); err != nil {
			t.Fatal(err)
		}
		r := e.sh(t, sb.ID, "cat /work/a /work/d/f; test -e /work/b || echo no-b; test -e /etc/hostname || echo no-hostname; stat -c %u:%g /work/owned; echo $K")
		if got := string(r.Stdout); got != "one\ndeep\nno-b\nno-hostname\n1500:1500\nv\n" {
			t.Fatalf("after restore: %q %q", got, r.Stderr)
		}
		// Forks: independent of each other and of the source.
		e.sh(t, sb.ID, "echo at-fork > /work/a")
		forks, err := e.c.Fork(ctx, sb.ID, api.ForkRequest{Count: 3, Labels: map[string]string{"fork": "yes"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(forks) != 3 {
			t.Fatalf("%d forks", len(forks))
		}
		for i, f := range forks {
			if f.ForkOf != sb.ID || f.State != api.StateRunning || f.Labels["fork"] != "yes" || f.ID == sb.ID {
				t.Fatalf("fork %+v", f)
			}
			e.sh(t, f.ID, fmt.Sprintf("echo fork%d >> /work/a", i))
		}
		e.sh(t, sb.ID, "echo source >> /work/a")
		for i, f := range forks {
			if got := string(e.sh(t, f.ID, "cat /work/a; stat -c %u /work/owned").Stdout); got != fmt.Sprintf("at-fork\nfork%d\n1500\n", i) {
				t.Fatalf("fork %d sees %q", i, got)
			}
		}
		if got := string(e.sh(t, sb.ID, "cat /work/a").Stdout); got != "at-fork\nsource\n" {
			t.Fatalf("source sees %q", got)
		}
		// Create from a snapshot: its files and settings.
		from := e.create(t, api.CreateRequest{From: "base"})
		if from.From != snap.ID {
			t.Fatalf("from %+v", from)
		}
		if got := string(e.sh(t, from.ID, "cat /work/a; echo $K").Stdout); got != "one\nv\n" {
			t.Fatalf("create --from sees %q", got)
		}
		list, _ := e.c.Snapshots(ctx, sb.ID)
		if len(list) != 1 || list[0].ID != snap.ID {
			t.Fatalf("snapshot ls %v", list)
		}
		if err := e.c.RemoveSnapshot(ctx, "base"); err != nil {
			t.Fatal(err)
		}
		if got := string(e.sh(t, from.ID, "cat /work/a").Stdout); got != "one\n" {
			t.Fatalf("a sandbox lost files when its snapshot went: %q", got)
		}
		_, err = e.c.GetSnapshot(ctx, snap.ID)
		wantKind(t, err, api.KindNotFound)
	})
}

// TestSnapshotStates: snapshots of stopped, paused and hibernated sandboxes.
func TestSnapshotStates(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	e.sh(t, sb.ID, "echo x > /root/f")
	for _, step := range []struct {
		name string
		do   func() (*api.Sandbox, error)
	}{
		{"paused", func() (*api.Sandbox, error) { return e.c.Pause(ctx, sb.ID) }},
		{"hibernated", func() (*api.Sandbox, error) { return e.c.Hibernate(ctx, sb.ID) }},
		{"stopped", func() (*api.Sandbox, error) { return e.c.Stop(ctx, sb.ID) }},
	} {
		got, err := step.do()
		if err != nil || got.State != step.name {
			t.Fatalf("%s: %+v %v", step.name, got, err)
		}
		snap, err := e.c.Snapshot(ctx, sb.ID, api.SnapshotRequest{})
		if err != nil {
			t.Fatalf("snapshot of a %s sandbox: %v", step.name, err)
		}
		if now, _ := e.c.Get(ctx, sb.ID); now.State != step.name {
			t.Fatalf("snapshot changed state %s to %s", step.name, now.State)
		}
		f := e.create(t, api.CreateRequest{From: snap.ID})
		if got := string(e.sh(t, f.ID, "cat /root/f").Stdout); got != "x\n" {
			t.Fatalf("snapshot of a %s sandbox has %q", step.name, got)
		}
		e.c.Remove(ctx, f.ID, true)
		if _, err := e.c.Start(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	// Fork of a stopped sandbox: the forks run, the source stays stopped.
	e.c.Stop(ctx, sb.ID)
	forks, err := e.c.Fork(ctx, sb.ID, api.ForkRequest{})
	if err != nil || len(forks) != 1 || forks[0].State != api.StateRunning {
		t.Fatalf("fork of stopped: %v %v", forks, err)
	}
	if now, _ := e.c.Get(ctx, sb.ID); now.State != api.StateStopped {
		t.Fatalf("source is %s", now.State)
	}
}

// TestSnapshotDuringWrites takes snapshots and forks while a process
// appends numbered lines: each capture holds whole lines 1..n, and the
// source loses nothing.
func TestSnapshotDuringWrites(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	if _, err := e.c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo "line $i"; done > /root/log; echo done > /root/finished`}); err != nil {
		t.Fatal(err)
	}
	var snaps []string
	var wg sync.WaitGroup
	var execErr error
	wg.Add(1)
	go func() { // exec at the same time as the captures
		defer wg.Done()
		for i := 0; i < 20; i++ {
			if _, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
				execErr = err
				return
			}
		}
	}()
	for i := 0; i < 5; i++ {
		s, err := e.c.Snapshot(ctx, sb.ID, api.SnapshotRequest{})
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, s.ID)
		time.Sleep(20 * time.Millisecond)
	}
	forks, err := e.c.Fork(ctx, sb.ID, api.ForkRequest{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if execErr != nil {
		t.Fatalf("exec during snapshots: %v", execErr)
	}
	check := func(what, dir string, whole bool) int {
		f, err := os.Open(filepath.Join(dir, "upper", "root", "root", "log"))
		if err != nil {
			if os.IsNotExist(err) {
				return 0
			}
			t.Fatalf("%s: %v", what, err)
		}
		defer f.Close()
		n := 0
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			n++
			if sc.Text() != "line "+strconv.Itoa(n) {
				t.Fatalf("%s: line %d is %q", what, n, sc.Text())
			}
		}
		return n
	}
	for _, id := range snaps {
		check("snapshot "+id, filepath.Join(e.m.SnapshotsDir(), id), true)
	}
	for _, f := range forks {
		e.c.Stop(ctx, f.ID)
		check("fork "+f.ID, filepath.Join(e.m.SandboxesDir(), f.ID), true)
	}
	for i := 0; i < 600; i++ {
		if r := e.sh(t, sb.ID, "cat /root/finished 2>/dev/null"); string(r.Stdout) == "done\n" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := e.sh(t, sb.ID, "wc -l < /root/log; tail -1 /root/log")
	if got := string(r.Stdout); got != "100000\nline 100000\n" {
		t.Fatalf("the source lost lines: %q", got)
	}
}

func TestPauseResume(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	// A ticker writing the time every 20 ms, and an echo server.
	if _, err := e.c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: `while :; do date +%s%N >> /root/ticks; sleep 0.02; done`}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", `
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 7000)); s.listen(1)
c, _ = s.accept()
while True:
    b = c.recv(100)
    if not b: break
    c.sendall(b)
`}}); err != nil {
		t.Fatal(err)
	}
	var conn interface {
		Write([]byte) (int, error)
		Read([]byte) (int, error)
		Close() error
	}
	for i := 0; i < 50; i++ {
		c, err := e.m.DialPort(ctx, sb.ID, 7000)
		if err == nil {
			conn = c
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if conn == nil {
		t.Fatal("echo server never answered")
	}
	defer conn.Close()
	echo := func(msg string) {
		t.Helper()
		conn.Write([]byte(msg))
		buf := make([]byte, len(msg))
		if _, err := ioReadFull(conn, buf); err != nil || string(buf) != msg {
			t.Fatalf("echo %q: %q %v", msg, buf, err)
		}
	}
	echo("before")
	time.Sleep(200 * time.Millisecond)
	p, err := e.c.Pause(ctx, sb.ID)
	if err != nil || p.State != api.StatePaused {
		t.Fatalf("pause: %+v %v", p, err)
	}
	if again, err := e.c.Pause(ctx, sb.ID); err != nil || again.State != api.StatePaused {
		t.Fatalf("pause twice: %v", err)
	}
	upper := filepath.Join(e.m.SandboxesDir(), sb.ID, "upper", "root", "root", "ticks")
	before, _ := os.ReadFile(upper)
	time.Sleep(500 * time.Millisecond)
	during, _ := os.ReadFile(upper)
	if len(before) == 0 || len(during) != len(before) {
		t.Fatalf("processes ran while paused: %d → %d bytes of ticks", len(before), len(during))
	}
	r, err := e.c.Resume(ctx, sb.ID)
	if err != nil || r.State != api.StateRunning || r.Resumed != api.ResumedThawed {
		t.Fatalf("resume: %+v %v", r, err)
	}
	echo("after a pause") // the connection survived
	time.Sleep(200 * time.Millisecond)
	ticks := strings.Fields(string(e.sh(t, sb.ID, "cat /root/ticks").Stdout))
	gap := int64(0)
	for i := 1; i < len(ticks); i++ {
		a, _ := strconv.ParseInt(ticks[i-1], 10, 64)
		b, _ := strconv.ParseInt(ticks[i], 10, 64)
		gap = max(gap, b-a)
	}
	if gap < int64(400*time.Millisecond) {
		t.Fatalf("no gap in the ticks while paused (largest %v)", time.Duration(gap))
	}
	// Any use resumes a paused sandbox.
	e.c.Pause(ctx, sb.ID)
	if got := string(e.sh(t, sb.ID, "echo hi").Stdout); got != "hi\n" {
		t.Fatalf("exec on paused: %q", got)
	}
	if now, _ := e.c.Get(ctx, sb.ID); now.State != api.StateRunning || now.Resumed != api.ResumedThawed {
		t.Fatalf("after exec on paused: %+v", now)
	}
	// A paused sandbox can be stopped and removed.
	e.c.Pause(ctx, sb.ID)
	if s, err := e.c.Stop(ctx, sb.ID); err != nil || s.State != api.StateStopped {
		t.Fatalf("stop paused: %+v %v", s, err)
	}
	_, err = e.c.Pause(ctx, sb.ID)
	wantKind(t, err, api.KindConflict)
	e.c.Start(ctx, sb.ID)
	e.c.Pause(ctx, sb.ID)
	wantKind(t, e.c.Remove(ctx, sb.ID, false), api.KindConflict)
	if err := e.c.Remove(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
}

func ioReadFull(r interface{ Read([]byte) (int, error) }, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func TestHibernateAndIdleActions(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	e.sh(t, sb.ID, "echo kept > /root/f")
	if _, err := e.c.StartProcess(ctx, sb.ID, api.ExecRequest{Name: "svc", Restart: "always", Shell: "echo started >> /root/svc; sleep 1000"}); err != nil {
		t.Fatal(err)
	}
	// The service has run once before the sandbox hibernates.
	for i := 0; string(e.sh(t, sb.ID, "cat /root/svc 2>/dev/null").Stdout) != "started\n"; i++ {
		if i > 100 {
			t.Fatal("the service never started")
		}
		time.Sleep(50 * time.Millisecond)
	}
	h, err := e.c.Hibernate(ctx, sb.ID)
	if err != nil || h.State != api.StateHibernated || h.Pid != 0 {
		t.Fatalf("hibernate: %+v %v", h, err)
	}
	// Any use resumes; on this tier processes start anew and the API says so.
	if got := string(e.sh(t, sb.ID, "cat /root/f").Stdout); got != "kept\n" {
		t.Fatalf("files after hibernate: %q", got)
	}
	now, _ := e.c.Get(ctx, sb.ID)
	if now.State != api.StateRunning || now.Resumed != api.ResumedRestarted {
		t.Fatalf("after use: %+v", now)
	}
	for i := 0; ; i++ {
		got := string(e.sh(t, sb.ID, "cat /root/svc").Stdout)
		if got == "started\nstarted\n" {
			break
		}
		if i > 100 {
			t.Fatalf("service not restarted after hibernate: %q", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Idle actions.
	for _, action := range []string{api.IdlePause, api.IdleHibernate} {
		s := e.create(t, api.CreateRequest{IdleTimeout: api.Duration(time.Second), IdleAction: action})
		want := map[string]string{api.IdlePause: api.StatePaused, api.IdleHibernate: api.StateHibernated}[action]
		deadline := time.Now().Add(8 * time.Second)
		for {
			got, _ := e.c.Get(ctx, s.ID)
			if got.State == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("idle action %s: still %s", action, got.State)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if got := string(e.sh(t, s.ID, "echo back").Stdout); got != "back\n" {
			t.Fatalf("exec after idle %s: %q", action, got)
		}
	}
	_, err = e.c.Create(ctx, api.CreateRequest{IdleAction: "sleep"})
	wantKind(t, err, api.KindInvalid)
}

func TestVolumesAndMounts(t *testing.T) {
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "from-host"), []byte("hello\n"), 0o644)
	e := newEnvWith(t, 0, func(e *env) { e.allow = []string{host} })
	ctx := context.Background()
	if _, err := e.c.CreateVolume(ctx, api.VolumeRequest{Name: "cache"}); err != nil {
		t.Fatal(err)
	}
	_, err := e.c.CreateVolume(ctx, api.VolumeRequest{Name: "cache"})
	wantKind(t, err, api.KindExists)
	a := e.create(t, api.CreateRequest{Volumes: []api.VolumeMount{{Name: "cache", Path: "/cache"}}})
	b := e.create(t, api.CreateRequest{Volumes: []api.VolumeMount{{Name: "cache", Path: "/data/cache", ReadOnly: true}},
		Mounts: []api.BindMount{{Source: host, Target: "/host", ReadOnly: true}}})
	e.sh(t, a.ID, "useradd -u 1000 u 2>/dev/null; echo shared > /cache/f && mkdir /cache/d && chown 1000:1000 /cache/d && chmod 777 /cache")
	r := e.sh(t, b.ID, "cat /cache/f 2>/dev/null; cat /data/cache/f; stat -c %u /data/cache/d; cat /host/from-host; touch /data/cache/x 2>&1 || true; touch /host/x 2>&1 || true")
	out := string(r.Stdout)
	if !strings.HasPrefix(out, "shared\n1000\nhello\n") || strings.Count(out, "Read-only file system") != 2 {
		t.Fatalf("second sandbox sees %q", out)
	}
	// Stored with the ids the sandboxes see.
	st, err := os.Stat(filepath.Join(e.m.VolumesDir(), "cache", "d"))
	if err != nil || st.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Fatalf("volume dir owner on the host: %v %v", st, err)
	}
	vol, err := e.c.GetVolume(ctx, "cache")
	if err != nil || len(vol.UsedBy) != 2 || vol.Used <= 0 {
		t.Fatalf("volume %+v %v", vol, err)
	}
	wantKind(t, e.c.RemoveVolume(ctx, "cache"), api.KindConflict)
	// Volumes outlive sandboxes and are not in snapshots or forks.
	snap, err := e.c.Snapshot(ctx, a.ID, api.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	c := e.create(t, api.CreateRequest{From: snap.ID})
	if got := string(e.sh(t, c.ID, "ls /cache 2>&1 | head -1").Stdout); strings.Contains(got, "f") && !strings.Contains(got, "No such") {
		t.Fatalf("a sandbox from a snapshot without volumes sees the volume: %q", got)
	}
	for _, id := range []string{a.ID, b.ID} {
		e.c.Remove(ctx, id, true)
	}
	d := e.create(t, api.CreateRequest{Volumes: []api.VolumeMount{{Name: "cache", Path: "/v"}}})
	if got := string(e.sh(t, d.ID, "cat /v/f").Stdout); got != "shared\n" {
		t.Fatalf("volume lost its files: %q", got)
	}
	e.c.Remove(ctx, d.ID, true)
	for i := 0; i < 50; i++ {
		if err := e.c.RemoveVolume(ctx, "cache"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := e.c.GetVolume(ctx, "cache"); err == nil {
		t.Fatal("volume not removed")
	}
}

func TestSnapshotBadInput(t *testing.T) {
	host := t.TempDir()
	e := newEnvWith(t, 0, func(e *env) { e.allow = []string{host} })
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	other := t.TempDir()
	os.Symlink("/etc", filepath.Join(host, "escape"))
	for name, err := range map[string]error{
		"fork count -1":       second(e.c.Fork(ctx, sb.ID, api.ForkRequest{Count: -1})),
		"fork count 65":       second(e.c.Fork(ctx, sb.ID, api.ForkRequest{Count: 65})),
		"fork bad label":      second(e.c.Fork(ctx, sb.ID, api.ForkRequest{Labels: map[string]string{"": "x"}})),
		"snapshot bad name":   second(e.c.Snapshot(ctx, sb.ID, api.SnapshotRequest{Name: "../x"})),
		"restore no snapshot": second(e.c.Restore(ctx, sb.ID, "")),
		"volume bad name":     second(e.c.CreateVolume(ctx, api.VolumeRequest{Name: "a/b"})),
		"volume negative":     second(e.c.CreateVolume(ctx, api.VolumeRequest{Name: "neg", Size: -1})),
		"volume quota on dir": second(e.c.CreateVolume(ctx, api.VolumeRequest{Name: "q", Size: 1 << 20})),
		"disk quota on dir":   second(e.c.Create(ctx, api.CreateRequest{Limits: api.Limits{Disk: 1 << 30}})),
		"mount not allowed":   second(e.c.Create(ctx, api.CreateRequest{Mounts: []api.BindMount{{Source: other, Target: "/x"}}})),
		"mount via symlink":   second(e.c.Create(ctx, api.CreateRequest{Mounts: []api.BindMount{{Source: filepath.Join(host, "escape"), Target: "/x"}}})),
		"mount at /proc":      second(e.c.Create(ctx, api.CreateRequest{Mounts: []api.BindMount{{Source: host, Target: "/proc/x"}}})),
		"mount at /":          second(e.c.Create(ctx, api.CreateRequest{Mounts: []api.BindMount{{Source: host, Target: "/"}}})),
		"mount relative":      second(e.c.Create(ctx, api.CreateRequest{Mounts: []api.BindMount{{Source: host, Target: "x"}}})),
		"mount unclean":       second(e.c.Create(ctx, api.CreateRequest{Mounts: []api.BindMount{{Source: host, Target: "/a/../etc"}}})),
		"two at one place":    second(e.c.Create(ctx, api.CreateRequest{Mounts: []api.BindMount{{Source: host, Target: "/m"}, {Source: host, Target: "/m"}}})),
	} {
		wantKind(t, err, api.KindInvalid)
		_ = name
	}
	for name, err := range map[string]error{
		"volume missing":   second(e.c.Create(ctx, api.CreateRequest{Volumes: []api.VolumeMount{{Name: "nope", Path: "/n"}}})),
		"snapshot missing": second(e.c.Restore(ctx, sb.ID, "nope")),
		"from missing":     second(e.c.Create(ctx, api.CreateRequest{From: "nope"})),
		"fork missing":     second(e.c.Fork(ctx, "nope", api.ForkRequest{})),
		"snapshot of none": second(e.c.Snapshot(ctx, "nope", api.SnapshotRequest{})),
	} {
		wantKind(t, err, api.KindNotFound)
		_ = name
	}
	// A snapshot whose files were changed behind den's back is refused.
	e.sh(t, sb.ID, "echo a > /root/f")
	snap, err := e.c.Snapshot(ctx, sb.ID, api.SnapshotRequest{Name: "tampered"})
	if err != nil {
		t.Fatal(err)
	}
	e.waitSealed(t, snap.ID)
	if err := os.WriteFile(filepath.Join(e.m.SnapshotsDir(), snap.ID, "upper", "root", "root", "f"), []byte("b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Restore(ctx, sb.ID, "tampered")
	if ae := wantKind(t, err, api.KindConflict); !strings.Contains(ae.Message, "verification") {
		t.Fatalf("tampered snapshot: %s", ae.Message)
	}
	if got := string(e.sh(t, sb.ID, "cat /root/f").Stdout); got != "a\n" {
		t.Fatalf("a refused restore changed the sandbox: %q", got)
	}
}

func second[T any](_ T, err error) error { return err }

// TestSnapshotRecovery: what a daemon killed mid-snapshot or mid-restore
// leaves is cleaned up or finished by the next one.
func TestSnapshotRecovery(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	e.sh(t, sb.ID, "echo v1 > /root/f")
	e.c.Stop(ctx, sb.ID)
	dir := filepath.Join(e.m.SandboxesDir(), sb.ID)
	// A half snapshot (no record) and a restore cut between its renames.
	half := filepath.Join(e.m.SnapshotsDir(), "0123456789abcdef0123456789abcdef")
	os.MkdirAll(filepath.Join(half, "upper"), 0o700)
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(dir+".next", 0o700)
	e.stop()
	imgs := e.m.ImageStore()
	e.start(t, imgs)
	if _, err := os.Stat(half); !os.IsNotExist(err) {
		t.Fatalf("half snapshot left: %v", err)
	}
	if _, err := os.Stat(dir + ".next"); !os.IsNotExist(err) {
		t.Fatal("half restore copy left")
	}
	if _, err := e.c.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := string(e.sh(t, sb.ID, "cat /root/f").Stdout); got != "v1\n" {
		t.Fatalf("files after an interrupted restore: %q", got)
	}
}

// TestDiskQuota: --disk is enforced by the kernel inside the sandbox, and
// neither the host nor another sandbox is affected.
func TestDiskQuota(t *testing.T) {
	e := newBtrfsEnv(t)
	ctx := context.Background()
	small := e.create(t, api.CreateRequest{Limits: api.Limits{Disk: 64 << 20}})
	other := e.create(t, api.CreateRequest{})
	r := e.sh(t, small.ID, "dd if=/dev/zero of=/root/big bs=1M count=100 2>&1; echo rc=$?; sync")
	out := string(r.Stdout)
	if !strings.Contains(out, "rc=1") || !(strings.Contains(out, "quota exceeded") || strings.Contains(out, "No space left")) {
		t.Fatalf("writing past the quota: %q", out)
	}
	if got := string(e.sh(t, other.ID, "dd if=/dev/zero of=/root/big bs=1M count=100 2>/dev/null; echo rc=$?").Stdout); got != "rc=0\n" {
		t.Fatalf("another sandbox was limited: %q", got)
	}
	sb, err := e.c.Get(ctx, small.ID)
	if err != nil || sb.DiskUsed < 32<<20 || sb.DiskUsed > 80<<20 || sb.Limits.Disk != 64<<20 {
		t.Fatalf("disk used %v (limit %v): %v", sb.DiskUsed, sb.Limits.Disk, err)
	}
	// The sandbox keeps working once it frees space; forks keep the quota.
	if got := string(e.sh(t, small.ID, "rm /root/big; echo ok > /root/f && cat /root/f").Stdout); got != "ok\n" {
		t.Fatalf("after freeing space: %q", got)
	}
	forks, err := e.c.Fork(ctx, small.ID, api.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if out := string(e.sh(t, forks[0].ID, "dd if=/dev/zero of=/root/big bs=1M count=100 2>&1; echo rc=$?").Stdout); !strings.Contains(out, "rc=1") {
		t.Fatalf("a fork escaped the quota: %q", out)
	}
	if _, err := e.c.CreateVolume(ctx, api.VolumeRequest{Name: "small", Size: 16 << 20}); err != nil {
		t.Fatal(err)
	}
	v := e.create(t, api.CreateRequest{Volumes: []api.VolumeMount{{Name: "small", Path: "/v"}}})
	if out := string(e.sh(t, v.ID, "dd if=/dev/zero of=/v/big bs=1M count=40 2>&1; echo rc=$?").Stdout); !strings.Contains(out, "rc=1") {
		t.Fatalf("a volume escaped its quota: %q", out)
	}
}

// TestSnapshotSaveLoad moves a snapshot through an archive; a damaged
// archive is refused whole.
func TestSnapshotSaveLoad(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{Env: []string{"MOVED=yes"}})
	e.sh(t, sb.ID, `set -e; mkdir -p /work/sub; echo payload-0123456789 > /work/file; ln /work/file /work/hard; ln -s file /work/link
rm /etc/hostname; rm -rf /etc/apt; mkdir /etc/apt; echo new > /etc/apt/only
echo mine > /work/owned; chown 1500:1500 /work/owned; chmod 4750 /work/owned`)
	snap, err := e.c.Snapshot(ctx, sb.ID, api.SnapshotRequest{Name: "travel"})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := e.c.SaveSnapshot(ctx, "travel")
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	if _, err := io.Copy(&archive, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if err := e.c.RemoveSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	// A byte changed in a file is caught by the manifest.
	bad := bytes.Replace(archive.Bytes(), []byte("payload-0123456789"), []byte("payload-0123456780"), 1)
	if bytes.Equal(bad, archive.Bytes()) {
		t.Fatal("test archive does not hold the payload in the clear")
	}
	_, err = e.c.LoadSnapshot(ctx, bytes.NewReader(bad))
	if ae := wantKind(t, err, api.KindInvalid); !strings.Contains(ae.Message, "verification") {
		t.Fatalf("damaged archive: %s", ae.Message)
	}
	_, err = e.c.LoadSnapshot(ctx, strings.NewReader("not a tar at all"))
	wantKind(t, err, api.KindInvalid)
	if list, _ := e.c.Snapshots(ctx, ""); len(list) != 0 {
		t.Fatalf("refused loads left snapshots: %v", list)
	}
	loaded, err := e.c.LoadSnapshot(ctx, bytes.NewReader(archive.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if loaded.Name != "travel" || loaded.ID == snap.ID {
		t.Fatalf("loaded %+v", loaded)
	}
	c := e.create(t, api.CreateRequest{From: loaded.ID})
	r := e.sh(t, c.ID, `cat /work/file /work/hard /work/link /etc/apt/only; ls /etc/apt; test -e /etc/hostname || echo no-hostname; stat -c '%u:%g %a' /work/owned; stat -c %h /work/file; echo $MOVED`)
	if got := string(r.Stdout); got != "payload-0123456789\npayload-0123456789\npayload-0123456789\nnew\nonly\nno-hostname\n1500:1500 4750\n2\nyes\n" {
		t.Fatalf("sandbox from a loaded snapshot: %q %q", got, r.Stderr)
	}
}

// TestSnapshotDiskFull: snapshots taken while the sandbox fills its disk
// quota either succeed whole or fail cleanly, and the source loses nothing
// it wrote.
func TestSnapshotDiskFull(t *testing.T) {
	e := newBtrfsEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{Limits: api.Limits{Disk: 16 << 20}})
	if _, err := e.c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: `i=0; while echo "line $i" >> /root/log; do i=$((i+1)); done; echo full > /root/full-marker 2>/dev/null; dd if=/dev/zero of=/root/fill bs=1M count=100 2>/dev/null; echo done > /dev/null`}); err != nil {
		t.Fatal(err)
	}
	var ok int
	for i := 0; i < 15; i++ {
		s, err := e.c.Snapshot(ctx, sb.ID, api.SnapshotRequest{})
		if err == nil {
			ok++
			if _, err := os.Stat(filepath.Join(e.m.SnapshotsDir(), s.ID, "upper")); err != nil {
				t.Fatalf("snapshot %s recorded without its files: %v", s.ID, err)
			}
		}
		time.Sleep(30 * time.Millisecond)
	}
	if ok == 0 {
		t.Fatal("no snapshot succeeded")
	}
	ents, _ := os.ReadDir(e.m.SnapshotsDir())
	list, _ := e.c.Snapshots(ctx, sb.ID)
	if len(ents) != len(list) {
		t.Fatalf("%d snapshot trees for %d snapshots: a half snapshot is visible", len(ents), len(list))
	}
	// Whatever the writer managed to write is there, in order.
	r := e.sh(t, sb.ID, `n=0; while read -r a b; do [ "$b" = "$n" ] || { echo "gap at $n: $a $b"; exit 1; }; n=$((n+1)); done < /root/log; echo ok $n`)
	if !strings.HasPrefix(string(r.Stdout), "ok ") {
		t.Fatalf("source log after a full disk: %q", r.Stdout)
	}
	// The sandbox still works once space is freed. (Simple quotas keep
	// data a snapshot still holds charged to the sandbox: drop them too.)
	for _, sn := range list {
		e.c.RemoveSnapshot(ctx, sn.ID)
	}
	if got := string(e.sh(t, sb.ID, "rm -f /root/fill /root/log; echo fine > /root/after && cat /root/after").Stdout); got != "fine\n" {
		t.Fatalf("after freeing space: %q", got)
	}
}
