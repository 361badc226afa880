package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
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
	"golang.org/x/sys/unix"
)

// These tests run real `den serve` processes (this test binary, as den:
// see TestMain) as root, kill them, and run the CLI as other users.

func TestMain(m *testing.M) {
	code := m.Run()
	e2e.RemoveDenBinary()
	os.Exit(code)
}

// serveProc is a running `den serve`.
type serveProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  *bytes.Buffer
	mu   *sync.Mutex
}

// daemon is a den serve set up in its own data and run directories,
// started and restarted by the test.
type daemon struct {
	t         *testing.T
	data, run string
	addr      string // tcp://127.0.0.1:PORT
	token     string
	storage   string
	grace     string // --shutdown-grace
	runtimes  string // --runtimes
	env       []string
	args      []string   // more den serve flags
	files     []*os.File // descriptors 3, 4... of the first start (nil: none there)
	proc      *serveProc
	c         *client.Client
}

type lockedBuffer struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

var serveSeq struct {
	sync.Mutex
	n int
}

// newDaemon prepares a daemon (linux tier only, no network, no warm pool;
// den's btrfs storage where mkfs.btrfs exists, else plain directories)
// and starts it. env is added to the daemon's environment.
func newDaemon(t *testing.T, env ...string) *daemon {
	t.Helper()
	return newDaemonWith(t, func(d *daemon) { d.env = env })
}

// newDaemonArgs is newDaemon with more den serve flags.
func newDaemonArgs(t *testing.T, args []string, env ...string) *daemon {
	t.Helper()
	return newDaemonWith(t, func(d *daemon) { d.args, d.env = args, env })
}

// newDaemonWith is newDaemon with a chance to change the daemon (its
// flags, tiers, environment, inherited descriptors) before it starts.
func newDaemonWith(t *testing.T, setup func(d *daemon)) *daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("den serve needs root")
	}
	serveSeq.Lock()
	serveSeq.n++
	n := serveSeq.n
	serveSeq.Unlock()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "tcp://" + ln.Addr().String()
	ln.Close()
	d := &daemon{t: t, data: t.TempDir(), run: fmt.Sprintf("/run/den-e2e/serve-%d-%d", os.Getpid(), n), addr: addr, storage: "dir", grace: "20s", runtimes: "linux"}
	if _, err := exec.LookPath("mkfs.btrfs"); err == nil {
		d.storage = "btrfs"
	}
	setup(d)
	t.Cleanup(d.cleanup)
	d.start()
	return d
}

func (d *daemon) start() {
	t := d.t
	t.Helper()
	cmd := exec.Command(e2e.DenBinary(t), "serve", "--data", d.data, "--run", d.run,
		"--listen", d.addr, "--listen", "unix://"+filepath.Join(d.run, "den.sock"),
		"--warm", "0", "--runtimes", d.runtimes, "--net=false", "--storage", d.storage, "--storage-size", "2g",
		"--shutdown-grace", d.grace)
	cmd.Args = append(cmd.Args, d.args...)
	cmd.Env = append(os.Environ(), d.env...)
	cmd.ExtraFiles, d.files = d.files, nil // the test closes its copies once den has them
	p := &serveProc{cmd: cmd, done: make(chan struct{}), log: &bytes.Buffer{}, mu: &sync.Mutex{}}
	cmd.Stdout = lockedBuffer{p.mu, p.log}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	d.proc = p
	d.c = client.New("unix://" + filepath.Join(d.run, "den.sock"))
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := d.c.List(ctx, nil)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-p.done:
			t.Fatalf("den serve ended: %v\n%s", cmd.ProcessState, d.logText())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("den serve does not answer: %v\n%s", err, d.logText())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d.token == "" {
		b, err := os.ReadFile(filepath.Join(d.data, "token"))
		if err != nil {
			t.Fatal(err)
		}
		d.token = strings.TrimSpace(string(b))
	}
}

func (d *daemon) logText() string {
	d.proc.mu.Lock()
	defer d.proc.mu.Unlock()
	return d.proc.log.String()
}

// kill9 kills the daemon at once, as a crash would.
func (d *daemon) kill9() {
	d.proc.cmd.Process.Signal(syscall.SIGKILL)
	<-d.proc.done
}

// term sends SIGTERM and waits for the daemon to end; a daemon still
// there after two minutes is hung.
func (d *daemon) term() error {
	d.proc.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.proc.done:
		return nil
	case <-time.After(2 * time.Minute):
		d.kill9()
		return fmt.Errorf("den serve did not end after SIGTERM:\n%s", d.logText())
	}
}

func (d *daemon) cleanup() {
	if d.proc != nil {
		select {
		case <-d.proc.done:
			// Sandboxes outlive the daemon: start one to remove them.
			os.Remove(filepath.Join(d.run, "den.sock"))
			d.env = nil
			d.start()
		default:
		}
		ctx := context.Background()
		all, _ := d.c.List(ctx, nil)
		for _, s := range all {
			d.c.Remove(ctx, s.ID, true)
		}
		d.term()
	}
	storage.UnmountUnder(d.run)
	storage.UnmountUnder(d.data)
	os.RemoveAll(d.run)
}

// cli runs den as a CLI against the daemon over TCP with its token, as
// the user uid:gid (0 for root).
func (d *daemon) cli(uid int, args ...string) (string, error) {
	cmd := exec.Command(e2e.DenBinary(d.t), args...)
	cmd.Env = []string{"DEN_HOST=" + d.addr, "DEN_TOKEN=" + d.token, "HOME=/", "PATH=/usr/bin:/bin"}
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (d *daemon) sh(id, script string) string {
	d.t.Helper()
	res, err := d.c.Exec(context.Background(), id, api.ExecRequest{Shell: script, Timeout: api.Duration(time.Minute)})
	if err != nil {
		d.t.Fatalf("exec %q: %v", script, err)
	}
	if res.ExitCode != 0 {
		d.t.Fatalf("exec %q: exit %d: %s%s", script, res.ExitCode, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

// mountsUnder lists this mount namespace's mount points under dir (the
// daemon runs in it).
func mountsUnder(dir string) []string { return storage.MountsUnder(dir) }

func TestCpOutOfRealSandbox(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb, err := d.c.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// In the sandbox: setuid-root and setgid programs, a setgid directory,
	// files owned by a user of the sandbox, and a file with a capability
	// where the image has setcap.
	d.sh(sb.ID, `set -e
		mkdir -p /out/d/sub
		for f in /out/d/suid /out/d/sub/suid /out/file; do cp /bin/true $f; chmod 4755 $f; done
		cp /bin/true /out/d/sgid; chown 1000:1000 /out/d/sgid; chmod 2755 /out/d/sgid
		chmod 2775 /out/d/sub`)
	hasCap := false
	if out := d.sh(sb.ID, `command -v setcap || true`); strings.TrimSpace(out) != "" {
		d.sh(sb.ID, `cp /bin/true /out/d/cap && setcap cap_net_raw+ep /out/d/cap && getcap /out/d/cap`)
		hasCap = true
	} else {
		t.Log("no setcap in the host image: the file capability part is not tested")
	}
	type want struct {
		mode       fs.FileMode
		uid, gid   int
		setuidBits bool // with -a: the sandbox's bits
	}
	check := func(t *testing.T, dest string, uid int, archive bool) {
		t.Helper()
		files := map[string]want{
			"file":       {0o755, 0, 0, true},
			"d":          {0o755 | fs.ModeDir, 0, 0, false},
			"d/suid":     {0o755, 0, 0, true},
			"d/sgid":     {0o755, 1000, 1000, true},
			"d/sub":      {0o775 | fs.ModeDir, 0, 0, true},
			"d/sub/suid": {0o755, 0, 0, true},
		}
		if hasCap {
			files["d/cap"] = want{0o755, 0, 0, false}
		}
		for n, w := range files {
			fi, err := os.Lstat(filepath.Join(dest, n))
			if err != nil {
				t.Fatal(err)
			}
			m, o := w.mode, [2]int{uid, uid}
			if archive {
				o = [2]int{w.uid, w.gid}
				if w.setuidBits {
					switch n {
					case "d/sgid", "d/sub":
						m |= fs.ModeSetgid
					default:
						m |= fs.ModeSetuid
					}
				}
			}
			if fi.Mode() != m {
				t.Errorf("%s: mode %v, want %v", n, fi.Mode(), m)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if got := [2]int{int(st.Uid), int(st.Gid)}; got != o {
				t.Errorf("%s: owner %v, want %v", n, got, o)
			}
		}
		if hasCap {
			if n, err := unix.Lgetxattr(filepath.Join(dest, "d/cap"), "security.capability", make([]byte, 64)); err != unix.ENODATA {
				t.Errorf("d/cap kept a file capability (%d bytes, %v)", n, err)
			}
		}
	}
	// A destination each user can write to.
	top, err := os.MkdirTemp("", "den-cp-out-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	os.Chmod(top, 0o755)
	dest := func(uid int) string {
		dir, err := os.MkdirTemp(top, "")
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(dir, 0o755)
		os.Chown(dir, uid, uid)
		return dir
	}
	for _, c := range []struct {
		name    string
		uid     int
		archive bool
	}{{"user", 4242, false}, {"root", 0, false}, {"root -a", 0, true}} {
		t.Run(c.name, func(t *testing.T) {
			dir := dest(c.uid)
			var flags []string
			if c.archive {
				flags = []string{"-a"}
			}
			for _, p := range []string{"/out/d", "/out/file"} {
				args := append(append([]string{"cp"}, flags...), sb.ID+":"+p, dir)
				if out, err := d.cli(c.uid, args...); err != nil {
					t.Fatalf("den %s: %v\n%s", strings.Join(args, " "), err, out)
				}
			}
			check(t, dir, c.uid, c.archive)
		})
	}
	// -a as a user cannot give files other owners: a clear error.
	out, err := d.cli(4242, "cp", "-a", sb.ID+":/out/d", dest(4242))
	if err == nil || !strings.Contains(out, "needs root") {
		t.Errorf("cp -a as a user: %v\n%s", err, out)
	}

	// den's own storage is mounted nosuid,nodev.
	if d.storage == "btrfs" {
		fsdir := filepath.Join(d.data, "fs")
		var st unix.Statfs_t
		if err := unix.Statfs(fsdir, &st); err != nil {
			t.Fatal(err)
		}
		if st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
			t.Errorf("%s is mounted without nosuid or nodev (flags %#x)", fsdir, st.Flags)
		}
	}
}

// stallDaemon starts a daemon with the test hook armed by the file stall
// (isolate.TestStall) and a sandbox src with /root/mark holding "before".
func stallDaemon(t *testing.T) (d *daemon, stall string, src *api.Sandbox) {
	t.Helper()
	stall = filepath.Join(t.TempDir(), "stall")
	d = newDaemon(t, "DEN_TEST_STALL="+stall)
	src, err := d.c.Create(context.Background(), api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	d.sh(src.ID, "echo before > /root/mark")
	return d, stall, src
}

// holdFork has the daemon hold a fork of src at point (isolate.TestStall)
// and returns the id the hook reported once it holds.
func holdFork(t *testing.T, d *daemon, stall, point, src string) string {
	t.Helper()
	if err := os.WriteFile(stall, []byte(point), 0o600); err != nil {
		t.Fatal(err)
	}
	forkDone := make(chan error, 1)
	go func() {
		_, err := d.c.Fork(context.Background(), src, api.ForkRequest{})
		forkDone <- err
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if ms, _ := filepath.Glob(stall + ".*"); len(ms) > 0 {
			return strings.TrimPrefix(filepath.Ext(ms[0]), ".")
		}
		select {
		case err := <-forkDone:
			t.Fatalf("fork ended before the hook held it: %v\n%s", err, d.logText())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fork never reached the hook\n%s", d.logText())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKillDuringFork kills -9 a real den serve while a fork's root is
// mounted in the daemon's mount namespace (a test hook holds the fork
// there), starts the daemon again, and checks that nothing of the dead
// fork stays mounted, that an event says what happened, that the fork
// can be removed and the source still works, and that SIGTERM ends the
// daemon.
func TestKillDuringFork(t *testing.T) {
	d, stall, src := stallDaemon(t)
	ctx := context.Background()

	// Hold the next box start with its root mounted, fork, wait for it.
	forkID := holdFork(t, d, stall, "mounted", src.ID)
	forkRun := filepath.Join(d.run, "linux", forkID)
	before := mountsUnder(forkRun)
	if len(before) == 0 {
		t.Fatalf("control: no mount under %s while the fork is held", forkRun)
	}
	d.kill9()
	// Control: the dead daemon's mounts outlive it.
	if ms := mountsUnder(forkRun); len(ms) == 0 {
		t.Fatalf("control: the mounts under %s went with the daemon", forkRun)
	}

	os.Remove(stall)
	d.start()
	if ms := mountsUnder(forkRun); len(ms) != 0 {
		t.Fatalf("after the restart, still mounted: %v", ms)
	}
	if _, err := os.Lstat(forkRun); err == nil {
		t.Errorf("the dead fork's run directory %s is still there", forkRun)
	}
	fork, err := d.c.Get(ctx, forkID)
	if err != nil {
		t.Fatal(err)
	}
	if fork.State != api.StateStopped || !strings.Contains(fork.Error, "fork") {
		t.Errorf("the interrupted fork: state %q, error %q", fork.State, fork.Error)
	}
	evs, err := d.c.Events(ctx, client.EventFilter{Sandbox: forkID, Type: "sandbox.interrupted"})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 {
		t.Fatalf("sandbox.interrupted events of the fork: %d, want 1", len(evs))
	}
	var ev struct {
		Operation string   `json:"operation"`
		ForkOf    string   `json:"fork_of"`
		Cleaned   []string `json:"cleaned"`
	}
	if err := json.Unmarshal(evs[0].Data, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Operation != "fork" || ev.ForkOf != src.ID || !strings.Contains(strings.Join(ev.Cleaned, " "), filepath.Join(forkRun, "rootfs")) {
		t.Errorf("event: %s; want operation fork of %s, cleaned naming %s/rootfs", evs[0].Data, src.ID, forkRun)
	}
	// The fork's files are intact (it can boot), and it can be removed.
	if out, err := d.cli(0, "start", forkID); err != nil {
		t.Fatalf("den start of the interrupted fork: %v\n%s", err, out)
	}
	if got := d.sh(forkID, "cat /root/mark"); got != "before\n" {
		t.Errorf("the fork's file holds %q", got)
	}
	if out, err := d.cli(0, "rm", "-f", forkID); err != nil {
		t.Fatalf("den rm of the interrupted fork: %v\n%s", err, out)
	}
	// The source lived through it all.
	if got := d.sh(src.ID, "cat /root/mark"); got != "before\n" {
		t.Errorf("the source's file holds %q", got)
	}
	if err := d.term(); err != nil {
		t.Fatal(err)
	}
	if ms := mountsUnder(filepath.Join(d.run, "linux", forkID)); len(ms) != 0 {
		t.Errorf("after shutdown, mounted: %v", ms)
	}
	if !strings.Contains(d.logText(), "shutting down") {
		t.Errorf("no shutdown in the log:\n%s", d.logText())
	}
}

// TestKillDuringForkCapture kills -9 a real den serve while a fork holds
// its source frozen with the forks' files copied but not recorded: the
// next daemon thaws the source (whose every request would hang on its
// frozen agent otherwise), says so in an event, and removes the
// unrecorded copies.
func TestKillDuringForkCapture(t *testing.T) {
	d, stall, src := stallDaemon(t)
	ctx := context.Background()
	if held := holdFork(t, d, stall, "frozen", src.ID); held != src.ID {
		t.Fatalf("the hook held %s, want the source %s", held, src.ID)
	}
	sandboxes := filepath.Join(d.data, "sandboxes")
	if d.storage == "btrfs" {
		sandboxes = filepath.Join(d.data, "fs", "sandboxes")
	}
	ents, _ := os.ReadDir(sandboxes)
	if len(ents) != 2 {
		t.Fatalf("control: %d trees in %s while the fork is held, want the source's and the fork's", len(ents), sandboxes)
	}
	d.kill9()
	os.Remove(stall)
	d.start()

	// The source answers: a frozen agent would never (a minute is ample
	// for an echo; past it the sandbox is hung).
	ectx, cancel := context.WithTimeout(ctx, time.Minute)
	res, err := d.c.Exec(ectx, src.ID, api.ExecRequest{Shell: "cat /root/mark"})
	cancel()
	if err != nil || string(res.Stdout) != "before\n" {
		t.Fatalf("exec in the source after the restart: %v %+v", err, res)
	}
	evs, err := d.c.Events(ctx, client.EventFilter{Sandbox: src.ID, Type: "sandbox.interrupted"})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || !strings.Contains(string(evs[0].Data), "thawed") {
		t.Errorf("sandbox.interrupted events of the source: %v, want one saying it was thawed", evs)
	}
	// The fork's copy, never recorded, is gone, with an event.
	ents, _ = os.ReadDir(sandboxes)
	if len(ents) != 1 || ents[0].Name() != src.ID {
		t.Errorf("trees after the restart: %v, want only the source's", ents)
	}
	all, err := d.c.Events(ctx, client.EventFilter{Type: "sandbox.interrupted"})
	if err != nil {
		t.Fatal(err)
	}
	unrecorded := 0
	for _, e := range all {
		if strings.Contains(string(e.Data), `"unrecorded"`) {
			unrecorded++
		}
	}
	if unrecorded != 1 {
		t.Errorf("events for the unrecorded fork copy: %d, want 1 (%v)", unrecorded, all)
	}
	if err := d.term(); err != nil {
		t.Fatal(err)
	}
}

// TestShutdownGrace: SIGTERM while something the shutdown waits for never
// ends (a sandbox's teardown, held by the test hook): den serve exits
// when the grace period is over, and says so.
func TestShutdownGrace(t *testing.T) {
	d, stall, src := stallDaemon(t)
	// Control: with nothing held, SIGTERM ends the daemon well within
	// its grace period. Then again with a short one.
	if err := d.term(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(d.logText(), "exiting anyway") {
		t.Fatalf("control: a clean shutdown was cut short:\n%s", d.logText())
	}
	d.grace = "2s"
	d.start()
	if err := os.WriteFile(stall, []byte("teardown"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.c.Remove(context.Background(), src.ID, true); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := os.Stat(stall + "." + src.ID); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the teardown never reached the hook\n%s", d.logText())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := d.term(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d.logText(), "exiting anyway") {
		t.Errorf("den serve ended without saying the grace period cut it short:\n%s", d.logText())
	}
	os.Remove(stall)
}
