package gvisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/host"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/storage"
	"golang.org/x/sys/unix"
)

// Config configures the runtime.
type Config struct {
	// RunDir holds runsc's state (RunDir/state), the agent binary
	// (RunDir/agent) and each box's bundle, mounts and FIFOs
	// (RunDir/boxes/<id>). Default /run/den/gvisor.
	RunDir string
	// Runsc is the runsc binary; default "runsc" on PATH.
	Runsc string
	// Platform is gVisor's platform ("systrap", "kvm", "ptrace"); "" picks
	// one (see Detect).
	Platform string
	// Network, if set, connects boxes whose spec asks for it.
	Network *host.Network
	// CgroupRoot is where cgroups are mounted (default /sys/fs/cgroup),
	// CgroupParent the group boxes are made in (default "den"; den serve
	// gives every tier its daemon's parent: box <id> is PARENT/<id>).
	CgroupRoot   string
	CgroupParent string
}

// Runtime is the gVisor tier.
type Runtime struct {
	cfg      Config
	info     Info
	state    string // runsc --root
	agentDir string // host directory holding the den binary for boxes
	// agentInterp is the loader a dynamically linked den binary needs
	// inside every box's root ("" for a static build).
	agentInterp string
	cg          cgroups
	reap        *reaper // nil if this process cannot be a subreaper
}

// New finds runsc, chooses a platform and prepares the run directory.
func New(cfg Config) (*Runtime, error) {
	if cfg.RunDir == "" {
		cfg.RunDir = "/run/den/gvisor"
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = "/sys/fs/cgroup"
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "den"
	}
	if abs, err := filepath.Abs(cfg.RunDir); err == nil {
		cfg.RunDir = abs
	}
	info := detect(cfg.Runsc, cfg.Platform)
	if !info.Available {
		return nil, errors.New("gvisor: " + info.Reason)
	}
	r := &Runtime{cfg: cfg, info: info, state: filepath.Join(cfg.RunDir, "state")}
	r.cg = detectCgroups(cfg.CgroupRoot, cfg.CgroupParent)
	r.reap = startReaper()
	for _, d := range []string{cfg.RunDir, filepath.Join(cfg.RunDir, "boxes")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("gvisor: create %s: %w", d, err)
		}
	}
	if err := os.MkdirAll(r.state, 0o700); err != nil {
		return nil, fmt.Errorf("gvisor: create %s: %w", r.state, err)
	}
	if err := host.MakePrivateMount(cfg.RunDir); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	var err error
	if r.agentDir, err = installAgent(filepath.Join(cfg.RunDir, "agent")); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	r.agentInterp = elfInterp(filepath.Join(r.agentDir, "den"))
	return r, nil
}

// Name is "gvisor".
func (r *Runtime) Name() string { return "gvisor" }

// Info is what Detect found when the runtime was made.
func (r *Runtime) Info() Info { return r.info }

// installAgent copies the running binary to dir/<hash>/den (root-owned,
// read-only), once per binary: boxes mount that directory read-only and
// run it as their agent. A box started by an older binary keeps its own
// copy.
func installAgent(dir string) (string, error) {
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return "", fmt.Errorf("open own binary: %w", err)
	}
	defer src.Close()
	h := sha256.New()
	if _, err := io.Copy(h, src); err != nil {
		return "", fmt.Errorf("read own binary: %w", err)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	final := filepath.Join(dir, sum)
	if st, err := os.Stat(filepath.Join(final, "den")); err == nil && st.Mode().IsRegular() {
		return final, nil
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, ".new-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	dst, err := os.OpenFile(filepath.Join(tmp, "den"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o555)
	if err != nil {
		return "", err
	}
	_, err = io.Copy(dst, src)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("copy own binary: %w", err)
	}
	if err := os.Chmod(tmp, 0o555); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Stat(filepath.Join(final, "den")); serr == nil {
			return final, nil // another daemon won the race
		}
		return "", fmt.Errorf("install agent binary: %w", err)
	}
	return final, nil
}

// validID is what runsc accepts as a container id.
var validID = regexp.MustCompile(`^[\w+\-.]+$`)

func (r *Runtime) boxRun(id string) string { return filepath.Join(r.cfg.RunDir, "boxes", id) }

// runsc runs one runsc command with the runtime's global flags (plus
// extra ones before the command), bounded by ctx and 30 s.
func (r *Runtime) runsc(ctx context.Context, global []string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.info.Runsc, append(append(r.globalFlags(), global...), args...)...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		msg := tail(out, 500)
		if i := bytes.Index(out, []byte("panic: ")); i >= 0 {
			// A crash of the sentry: its first lines say why.
			msg = string(out[i:min(len(out), i+500)])
		}
		return out, fmt.Errorf("runsc %s: %w: %s", args[0], err, msg)
	}
	return out, nil
}

func (r *Runtime) globalFlags() []string {
	f := []string{"--root", r.state, "--platform=" + r.info.Platform}
	if r.info.flags["overlay2"] {
		// The box's writes go to its upper directory, never a sentry
		// memory overlay (newer runsc's default).
		f = append(f, "--overlay2=none")
	}
	return f
}

// containerState is runsc's state of container id: "running", "paused",
// "stopped", "created", or "" when runsc knows no such container; and the
// sandbox's pid.
func (r *Runtime) containerState(ctx context.Context, id string) string {
	st, _ := r.containerInfo(ctx, id)
	return st
}

func (r *Runtime) containerInfo(ctx context.Context, id string) (string, int) {
	if !r.mayKnow(id) {
		return "", 0 // spares a runsc run (~25 ms) on every boot
	}
	out, err := r.runsc(ctx, nil, "state", id)
	if err != nil {
		return "", 0
	}
	var st struct {
		Status string `json:"status"`
		Pid    int    `json:"pid"`
	}
	if i := bytes.IndexByte(out, '{'); i >= 0 {
		out = out[i:]
	}
	if json.Unmarshal(out, &st) != nil {
		return "", 0
	}
	return st.Status, st.Pid
}

// mayKnow reports whether runsc's state directory has a file naming
// container id (runsc keeps "<sandbox>_sandbox:<container>.state" and a
// lock file there); when it has none, runsc knows no such container.
func (r *Runtime) mayKnow(id string) bool {
	ents, err := os.ReadDir(r.state)
	if err != nil {
		return true // let runsc say
	}
	for _, e := range ents {
		if strings.Contains(e.Name(), id) {
			return true
		}
	}
	return false
}

// Start boots a box.
func (r *Runtime) Start(ctx context.Context, spec *isolate.Spec) (isolate.Box, error) {
	return r.boot(ctx, spec, "")
}

// Restore boots spec's box from the checkpoint in dir.
func (r *Runtime) Restore(ctx context.Context, spec *isolate.Spec, dir string) (isolate.Box, error) {
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		return nil, fmt.Errorf("restore %s: no checkpoint in %s: %w", spec.ID, dir, err)
	}
	b, err := r.boot(ctx, spec, dir)
	if err != nil {
		return nil, err
	}
	// Restored into another box (a fork): the kernel's saved hostname is
	// the source's. The network needs nothing: this runsc builds the
	// restored netstack from the new box's namespace.
	if from, _ := os.ReadFile(filepath.Join(dir, hostnameFile)); string(from) != spec.Hostname {
		if err := b.Agent().JSON(ctx, "POST", agent.PathHostname, nil, map[string]string{"hostname": spec.Hostname}, nil); err != nil {
			b.Stop(context.Background())
			return nil, fmt.Errorf("restore %s: set the hostname: %w", spec.ID, err)
		}
	}
	return b, nil
}

// hostnameFile, in a checkpoint directory, holds the hostname the box had.
const hostnameFile = "den-hostname"

// startTimeout bounds a box's boot until its agent answers.
const startTimeout = 60 * time.Second

// boot starts a box, or restores it from the checkpoint image if set.
func (r *Runtime) boot(ctx context.Context, spec *isolate.Spec, image string) (_ isolate.Box, err error) {
	if len(spec.Layers) == 0 || spec.Layers[0].Target != "/" {
		return nil, errors.New("the first layer must be mounted at /")
	}
	if !validID.MatchString(spec.ID) {
		return nil, fmt.Errorf("box id %q: want letters, digits, _, +, - and .", spec.ID)
	}
	if spec.Dir == "" {
		return nil, errors.New("box has no storage directory")
	}
	if spec.Net && r.cfg.Network == nil {
		return nil, errors.New("this daemon has no sandbox network (start den serve with networking)")
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	switch st := r.containerState(ctx, spec.ID); st {
	case "", "stopped":
	default:
		return nil, fmt.Errorf("box %s is already %s", spec.ID, st)
	}
	// Whatever a dead box or daemon left.
	if err := r.clean(ctx, spec); err != nil {
		return nil, err
	}
	run := r.boxRun(spec.ID)
	defer func() {
		if err != nil {
			if msg := logTail(run); msg != "" {
				err = fmt.Errorf("%w; runsc log: %s", err, msg)
			}
			if r.agentInterp != "" {
				err = fmt.Errorf("%w (this den binary is dynamically linked: it is the box's init and needs %s inside the sandbox's root, which images without it, like busybox, lack; build den with CGO_ENABLED=0 as scripts/deps.sh does)", err, r.agentInterp)
			}
			r.clean(context.Background(), spec)
		}
	}()
	if err := r.prepare(spec); err != nil {
		return nil, err
	}
	pid, err := r.launch(ctx, spec, image)
	if err != nil {
		return nil, err
	}
	b, err := r.newBox(spec, pid)
	if err != nil {
		return nil, err
	}
	if err := b.attach(ctx); err != nil {
		b.link.Close()
		return nil, fmt.Errorf("box %s: %w", spec.ID, err)
	}
	return b, nil
}

// prepare makes the box's run directory: its root mounted, its volumes'
// host bind mounts, its network namespace, config.json and stdio FIFOs.
func (r *Runtime) prepare(spec *isolate.Spec) error {
	run := r.boxRun(spec.ID)
	if err := os.MkdirAll(run, 0o700); err != nil {
		return fmt.Errorf("create run dir: %w", err)
	}
	rootfs := filepath.Join(run, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return err
	}
	if err := mountRoot(spec, rootfs); err != nil {
		return err
	}
	bd := bundle{spec: spec, rootfs: rootfs, agentDir: r.agentDir, cgroup: "/" + r.cfg.CgroupParent + "/" + spec.ID}
	ok, err := r.tmpDir(spec, rootfs)
	if err != nil {
		return err
	}
	bd.tmpBind = ok
	for i, m := range spec.Mounts {
		dst := filepath.Join(run, "mnt", strconv.Itoa(i))
		if err := bindSource(m, dst); err != nil {
			return err
		}
		bd.binds = append(bd.binds, dst)
	}
	if spec.Net {
		bd.netns = filepath.Join(run, "netns")
		if err := r.setupNet(spec); err != nil {
			return err
		}
	}
	if err := writeBundle(run, bd); err != nil {
		return err
	}
	for _, name := range []string{"in", "out"} {
		if err := unix.Mkfifo(filepath.Join(run, name), 0o600); err != nil {
			return fmt.Errorf("create FIFO %s: %w", name, err)
		}
	}
	return nil
}

// setupNet pins the box's network namespace and gives it eth0 on den's
// bridge in the box's slot. gVisor's netstack takes the interface's
// addresses and routes from it when the sandbox boots (and removes them
// from the host side), so every boot gets a fresh namespace.
func (r *Runtime) setupNet(spec *isolate.Spec) error {
	path := filepath.Join(r.boxRun(spec.ID), "netns")
	host.RemoveNetNS(path)
	r.cfg.Network.Detach(spec.NetSlot)
	if err := host.CreateNetNS(path); err != nil {
		return err
	}
	if _, err := r.cfg.Network.AttachPath(path, spec.NetSlot); err != nil {
		return err
	}
	if spec.NetBandwidth > 0 {
		if err := r.cfg.Network.SetBandwidthPath(path, spec.NetSlot, spec.NetBandwidth); err != nil {
			return err
		}
	}
	return nil
}

// launch runs `runsc run` (or `runsc restore` from image) detached on the
// prepared run directory and returns the sandbox's pid. The box's stdin
// and stdout are the FIFOs, opened read-write so the box never sees an
// end of file when the daemon goes away; its stderr and runsc's go to
// the run directory's log.
func (r *Runtime) launch(ctx context.Context, spec *isolate.Spec, image string) (int, error) {
	run := r.boxRun(spec.ID)
	var stdio [2]*os.File
	for i, name := range []string{"in", "out"} {
		f, err := os.OpenFile(filepath.Join(run, name), os.O_RDWR, 0)
		if err != nil {
			return 0, fmt.Errorf("open FIFO %s: %w", name, err)
		}
		defer f.Close()
		stdio[i] = f
	}
	logf, err := os.OpenFile(filepath.Join(run, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	pidFile := filepath.Join(run, "pid")
	os.Remove(pidFile)
	network := "--network=none"
	if spec.Net {
		network = "--network=sandbox"
	}
	global := []string{network, "--log=" + filepath.Join(run, "runsc.log")}
	args := []string{"run", "--detach", "--bundle", run, "--pid-file", pidFile}
	if image != "" {
		args = []string{"restore", "--detach", "--bundle", run, "--pid-file", pidFile, "--image-path", image}
	}
	argv := append(append(append(r.globalFlags(), global...), args...), spec.ID)
	cmd := exec.CommandContext(ctx, r.info.Runsc, argv...)
	if spec.Net {
		// This runsc decides that a network namespace is the host's if
		// /proc/sys/net/core/rmem_default exists in it, and then refuses
		// to take over its interfaces; since Linux 6.x every network
		// namespace has that file. So runsc runs in a mount namespace of
		// its own where /proc/sys/net is an empty tmpfs, set up by the den
		// binary (see AgentMain). runsc only reads the namespace's
		// interfaces and routes through netlink; its sandbox and gofer
		// make mount namespaces of their own.
		cmd = exec.CommandContext(ctx, filepath.Join(r.agentDir, "den"), append([]string{agentArg, hideNetArg, r.info.Runsc}, argv...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdio[0], stdio[1], logf
	cmd.Dir = run
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return 0, fmt.Errorf("runsc %s: %w", args[0], err)
	}
	r.reap.adopt()
	pidb, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, fmt.Errorf("runsc %s: no pid file: %w", args[0], err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(pidb)))
	if err != nil {
		return 0, fmt.Errorf("runsc %s: pid file: %w", args[0], err)
	}
	return pid, nil
}

// tmpDir makes sure the root has a /tmp and says whether to bind it over
// the tmpfs gVisor would otherwise mount there when it is empty: /tmp is
// part of the box's files on every tier.
func (r *Runtime) tmpDir(spec *isolate.Spec, rootfs string) (bool, error) {
	for _, m := range spec.Mounts {
		if filepath.Clean(m.Target) == "/tmp" {
			return false, nil
		}
	}
	for _, l := range spec.Layers {
		if filepath.Clean(l.Target) == "/tmp" {
			return false, nil
		}
	}
	st, err := os.Lstat(filepath.Join(rootfs, "tmp"))
	if errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(filepath.Join(rootfs, "tmp"), 0o1777); err != nil {
			return false, fmt.Errorf("create /tmp: %w", err)
		}
		return true, os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777)
	}
	if err != nil {
		return false, err
	}
	return st.IsDir(), nil
}

// logTail is the end of a box's runsc logs: why it failed.
func logTail(run string) string {
	var parts []string
	for _, name := range []string{"log", "runsc.log"} {
		b, _ := os.ReadFile(filepath.Join(run, name))
		var keep [][]byte
		for _, l := range bytes.Split(b, []byte("\n")) {
			// runsc's debug lines start with a level letter and a date; its
			// warnings and errors are what explain a failure.
			if len(bytes.TrimSpace(l)) == 0 || (len(l) > 1 && l[0] == 'I' && l[1] >= '0' && l[1] <= '9') || (len(l) > 1 && l[0] == 'D' && l[1] >= '0' && l[1] <= '9') {
				continue
			}
			keep = append(keep, l)
		}
		if t := tail(bytes.Join(keep, []byte("\n")), 600); t != "" {
			parts = append(parts, t)
		}
	}
	return strings.Join(parts, " | ")
}

// clean removes what a box leaves outside its storage: its runsc
// container (killed if it runs), cgroups, mounts, network namespace and
// slot, and run directory. Idempotent.
func (r *Runtime) clean(ctx context.Context, spec *isolate.Spec) error {
	_, err := r.Clean(ctx, spec)
	return err
}

// Clean is clean, returning the mount points it detached.
func (r *Runtime) Clean(ctx context.Context, spec *isolate.Spec) ([]string, error) {
	run := r.boxRun(spec.ID)
	var errs []error
	if r.mayKnow(spec.ID) {
		if _, err := r.runsc(ctx, nil, "delete", "--force", spec.ID); err != nil && r.containerState(ctx, spec.ID) != "" {
			// runsc could not kill it: do it ourselves, then try again.
			if pid := r.sandboxPid(spec.ID); pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
				time.Sleep(100 * time.Millisecond)
			}
			if _, err := r.runsc(ctx, nil, "delete", "--force", spec.ID); err != nil && r.containerState(ctx, spec.ID) != "" {
				errs = append(errs, err)
			}
		}
	}
	netns := filepath.Join(run, "netns")
	if _, err := os.Lstat(netns); err == nil {
		if err := host.RemoveNetNS(netns); err != nil {
			errs = append(errs, err)
		}
		if r.cfg.Network != nil {
			r.cfg.Network.Detach(spec.NetSlot)
		}
	} else if spec.Net && r.cfg.Network != nil {
		r.cfg.Network.Detach(spec.NetSlot)
	}
	gone, err := storage.UnmountUnder(run)
	if err != nil {
		// Never remove a directory that still has a mount under it.
		return gone, errors.Join(append(errs, err)...)
	}
	if err := storage.RemoveTree(run); err != nil {
		errs = append(errs, fmt.Errorf("remove run dir: %w", err))
	}
	return gone, errors.Join(errs...)
}

// sandboxPid is the pid of box id's runsc sandbox process if one runs.
func (r *Runtime) sandboxPid(id string) int {
	b, err := os.ReadFile(filepath.Join(r.boxRun(id), "pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 || r.checkSandbox(pid, id) != nil {
		return 0
	}
	return pid
}

// checkSandbox verifies that pid is the runsc sandbox process of box id
// under this runtime's state directory.
func (r *Runtime) checkSandbox(pid int, id string) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return fmt.Errorf("box %s: no process %d", id, pid)
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) < 3 || args[0] != "runsc-sandbox" || args[len(args)-1] != id {
		return fmt.Errorf("box %s: pid %d is not its gVisor sandbox", id, pid)
	}
	for i, a := range args {
		if a == "--root="+r.state || (a == "--root" && i+1 < len(args) && args[i+1] == r.state) {
			return nil
		}
	}
	return fmt.Errorf("box %s: pid %d is the sandbox of another runsc state directory", id, pid)
}

// Destroy removes the box: anything left running or mounted by it (after
// a daemon crash too), and its storage. Idempotent.
func (r *Runtime) Destroy(ctx context.Context, spec *isolate.Spec) error {
	if err := r.clean(ctx, spec); err != nil {
		return err
	}
	return isolate.RemoveStorage(spec)
}

// Load reattaches to a box that outlived the daemon that started it, and
// whose agent must answer (unless the box is paused: then after Resume).
// pid is what Pid returned; if it is no longer the box's sandbox (a
// checkpoint that kept the box running boots a new one), the sandbox runsc
// knows for the box's id is taken, after the same checks.
func (r *Runtime) Load(ctx context.Context, spec *isolate.Spec, pid int) (isolate.Box, error) {
	st, cur := r.containerInfo(ctx, spec.ID)
	if st != "running" && st != "paused" {
		return nil, fmt.Errorf("box %s: runsc reports it %q", spec.ID, st)
	}
	if err := r.checkSandbox(pid, spec.ID); err != nil {
		if cur <= 0 || r.checkSandbox(cur, spec.ID) != nil {
			return nil, err
		}
		pid = cur
	}
	b, err := r.newBox(spec, pid)
	if err != nil {
		return nil, err
	}
	if st == "paused" {
		b.paused = true
		return b, nil
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.attach(actx); err != nil {
		b.link.Close()
		return nil, fmt.Errorf("box %s: %w", spec.ID, err)
	}
	return b, nil
}
