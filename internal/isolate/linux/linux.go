// Package linux is den's first isolation tier: each box is a set of fresh
// Linux namespaces (user, mount, pid, net, uts, ipc, cgroup) whose root is
// an overlayfs of id-mapped read-only image layers and an id-mapped per-box
// upper directory (stored with the ids the box sees), plus its volumes and
// bind mounts, with cgroup limits and freezer, a container capability set,
// no_new_privs and a seccomp filter on every command. The den agent runs as
// PID 1.
package linux

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/den-dev/den/internal/host"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/storage"
	"golang.org/x/sys/unix"
)

// IDRange is the number of ids mapped into each box.
const IDRange = 65536

// initArg is the hidden argv[1] that makes the den binary a box's init.
const initArg = "__sandbox-init"

// Runtime is the linux tier.
type Runtime struct {
	runDir string // transient mount points and agent sockets
	cg     *cgroups
	exe    *os.File // sealed copy of the den binary executed as each box's init

	mu     sync.Mutex
	userns map[int]*os.File // uid base → a user namespace with that mapping
	net    *host.Network    // nil: boxes have loopback only
}

// Config configures the runtime.
type Config struct {
	RunDir     string // default /run/den/linux
	CgroupRoot string // default /sys/fs/cgroup
	CgroupName string // default "den"
	// Network, if set, connects boxes whose spec asks for it.
	Network *host.Network
}

// New checks the host and prepares the runtime.
func New(cfg Config) (*Runtime, error) {
	if cfg.RunDir == "" {
		cfg.RunDir = "/run/den/linux"
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = "/sys/fs/cgroup"
	}
	if cfg.CgroupName == "" {
		cfg.CgroupName = "den"
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the linux runtime needs root (run den serve as root)")
	}
	cg, err := detectCgroups(cfg.CgroupRoot, cfg.CgroupName)
	if err != nil {
		return nil, err
	}
	// Boxes' init processes run as unprivileged host ids, so every
	// directory on the way to their mount points must be searchable.
	if err := mkdirSearchable(cfg.RunDir); err != nil {
		return nil, err
	}
	// Make the run directory a private mount so mounts made under it never
	// propagate into (or out of) other mount namespaces.
	if err := host.MakePrivateMount(cfg.RunDir); err != nil {
		return nil, err
	}
	exe, err := sealedSelf()
	if err != nil {
		return nil, err
	}
	return &Runtime{runDir: cfg.RunDir, cg: cg, exe: exe, userns: map[int]*os.File{}, net: cfg.Network}, nil
}

// Name is "linux".
func (r *Runtime) Name() string { return "linux" }

// CgroupVersion is "v1" or "v2".
func (r *Runtime) CgroupVersion() string { return r.cg.Version() }

func mkdirSearchable(dir string) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, st.Mode().Perm()|0o011); err != nil {
				return fmt.Errorf("make %s searchable: %w", d, err)
			}
		}
	}
	return nil
}

// sealedSelf copies the running binary into a sealed memfd, so a box's
// init is exec'd from a copy no process in any box can modify, and the
// binary need not be readable by the boxes' unprivileged host ids.
func sealedSelf() (*os.File, error) {
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("open own binary: %w", err)
	}
	defer src.Close()
	fd, err := unix.MemfdCreate("den", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	mf := os.NewFile(uintptr(fd), "den")
	defer mf.Close()
	if _, err := io.Copy(mf, src); err != nil {
		return nil, fmt.Errorf("copy own binary: %w", err)
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(mf.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		return nil, fmt.Errorf("seal own binary: %w", err)
	}
	// A high descriptor number, so fork/exec's fd shuffling never lands on it.
	nfd, err := unix.FcntlInt(mf.Fd(), unix.F_DUPFD_CLOEXEC, 100)
	if err != nil {
		return nil, fmt.Errorf("dup own binary: %w", err)
	}
	return os.NewFile(uintptr(nfd), "den"), nil
}

// mapping returns a user namespace whose uid and gid maps send 0..65535 to
// base..base+65535. Id-mapped mounts of image layers are made with it.
func (r *Runtime) mapping(base int) (*os.File, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.userns[base]; ok {
		return f, nil
	}
	cmd := exec.Command(fmt.Sprintf("/proc/self/fd/%d", r.exe.Fd()), "__userns-hold")
	cmd.Args[0] = "den"
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: IDRange}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: IDRange}},
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("create user namespace for ids %d: %w", base, err)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	stdin.Close()
	cmd.Process.Kill()
	cmd.Wait()
	if err != nil {
		return nil, fmt.Errorf("open user namespace: %w", err)
	}
	r.userns[base] = f
	return f, nil
}

// HoldUserns is the body of the hidden "__userns-hold" verb: it waits for
// its stdin to close.
func HoldUserns() {
	io.Copy(io.Discard, os.Stdin)
}

type box struct {
	rt   *Runtime
	spec *isolate.Spec
	kill func() error
	pid  int
	ag   *agent.Client
	done chan struct{}
	stop sync.Once
}

// The abilities of the linux tier (isolate's optional interfaces).
var (
	_ isolate.Runtime       = (*Runtime)(nil)
	_ isolate.Cleaner       = (*Runtime)(nil)
	_ isolate.Loader        = (*Runtime)(nil)
	_ isolate.Canonicalizer = (*Runtime)(nil)

	_ isolate.Box            = (*box)(nil)
	_ isolate.Pauser         = (*box)(nil)
	_ isolate.Statser        = (*box)(nil)
	_ isolate.Networker      = (*box)(nil)
	_ isolate.Dialer         = (*box)(nil)
	_ isolate.UDPAllower     = (*box)(nil)
	_ isolate.FrozenReporter = (*box)(nil)
	_ isolate.ProcLister     = (*box)(nil)
)

func (b *box) Agent() *agent.Client             { return b.ag }
func (b *box) Pid() int                         { return b.pid }
func (b *box) Done() <-chan struct{}            { return b.done }
func (b *box) OOMKills() uint64                 { return b.rt.cg.OOMKills(b.spec.ID) }
func (b *box) SetLimits(l isolate.Limits) error { return b.rt.cg.SetLimits(b.spec.ID, l) }

// initConfig is what the daemon sends a box's init over its config pipe.
type initConfig struct {
	Rootfs   string `json:"rootfs"`
	Hostname string `json:"hostname"`
	ShmSize  int64  `json:"shm_size,omitempty"`
}

func (r *Runtime) boxRun(id string) string { return filepath.Join(r.runDir, id) }

// Start boots a box.
func (r *Runtime) Start(ctx context.Context, spec *isolate.Spec) (_ isolate.Box, err error) {
	if len(spec.Layers) == 0 || spec.Layers[0].Target != "/" {
		return nil, errors.New("the first layer must be mounted at /")
	}
	if spec.UIDBase <= 0 {
		return nil, errors.New("no uid range assigned")
	}
	var cleanup []func()
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()
	run := r.boxRun(spec.ID)
	rootfs := filepath.Join(run, "rootfs")
	if err := os.MkdirAll(rootfs, 0o711); err != nil {
		return nil, fmt.Errorf("create run dir: %w", err)
	}
	os.Chmod(run, 0o711)
	cleanup = append(cleanup, func() { r.removeRun(spec.ID) })

	ns, err := r.mapping(spec.UIDBase)
	if err != nil {
		return nil, err
	}
	if err := r.mountRoot(spec, rootfs, ns); err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { unix.Unmount(rootfs, unix.MNT_DETACH) })
	isolate.TestStall("mounted", spec.ID)

	if err := r.cg.Create(spec.ID, spec.Limits); err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { r.cg.Remove(spec.ID) })

	sock := filepath.Join(run, "agent.sock")
	os.Remove(sock)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen for agent: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	lnFile, err := ln.File()
	ln.Close()
	if err != nil {
		return nil, fmt.Errorf("agent listener: %w", err)
	}
	defer lnFile.Close()

	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer cfgR.Close()
	defer cfgW.Close()
	stR, stW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer stR.Close()
	defer stW.Close()

	cmd := exec.Command(fmt.Sprintf("/proc/self/fd/%d", r.exe.Fd()), initArg)
	cmd.Args[0] = "den-init"
	cmd.Env = []string{"GOMAXPROCS=1", "GOGC=50", "GODEBUG=madvdontneed=1"}
	cmd.ExtraFiles = []*os.File{cfgR, lnFile, stW}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setsid: true,
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
			syscall.CLONE_NEWNET | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: spec.UIDBase, Size: IDRange}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: spec.UIDBase, Size: IDRange}},
		GidMappingsEnableSetgroups: true,
		// Become root of the new namespace (host id UIDBase) before exec,
		// so the init keeps its capabilities inside the namespace.
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start box init: %w", err)
	}
	cleanup = append(cleanup, func() { cmd.Process.Kill(); cmd.Wait() })
	cfgR.Close()
	stW.Close()
	if err := r.cg.Add(spec.ID, cmd.Process.Pid); err != nil {
		return nil, err
	}
	// The network is in place before the box's first process runs.
	if spec.Net {
		if r.net == nil {
			return nil, errors.New("this daemon has no sandbox network (start den serve with networking)")
		}
		if _, err := r.net.Attach(cmd.Process.Pid, spec.NetSlot); err != nil {
			return nil, err
		}
		if spec.NetBandwidth > 0 {
			if err := r.net.SetBandwidth(cmd.Process.Pid, spec.NetSlot, spec.NetBandwidth); err != nil {
				return nil, err
			}
		}
		cleanup = append(cleanup, func() { r.net.Detach(spec.NetSlot) })
	}
	// The agent must survive the box's own out-of-memory kills. Lowering
	// the score needs CAP_SYS_RESOURCE, which some hosts withhold even from
	// root; the agent then relies on its commands' raised scores.
	os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", cmd.Process.Pid), []byte("-1000"), 0)
	if err := json.NewEncoder(cfgW).Encode(initConfig{Rootfs: rootfs, Hostname: spec.Hostname, ShmSize: spec.ShmSize}); err != nil {
		return nil, fmt.Errorf("send box config: %w", err)
	}
	cfgW.Close()
	// The init writes nothing and closes its end when the agent is ready,
	// or writes the error that stopped it.
	stR.SetReadDeadline(time.Now().Add(30 * time.Second))
	msg, err := io.ReadAll(io.LimitReader(stR, 4096))
	if err != nil {
		return nil, fmt.Errorf("wait for box init: %w", err)
	}
	if len(msg) > 0 {
		return nil, fmt.Errorf("box init: %s", msg)
	}
	// Commands fork from the agent's launcher thread: it alone goes into
	// the commands' pids group.
	if tid := launcherTid(cmd.Process.Pid); tid > 0 {
		if err := r.cg.MoveLauncher(spec.ID, tid); err != nil {
			return nil, err
		}
	} else if !r.cg.V2 {
		return nil, errors.New("box init: the agent's launcher thread was not found")
	}
	// The box's mount namespace holds its own copy of the root now.
	unix.Unmount(rootfs, unix.MNT_DETACH)

	b := &box{rt: r, spec: spec, kill: cmd.Process.Kill, pid: cmd.Process.Pid, done: make(chan struct{})}
	b.ag = agent.UnixClient(sock)
	go func() { cmd.Wait(); close(b.done) }()
	return b, nil
}

// Stop kills the box's init, which takes every process of its pid
// namespace with it, and removes its cgroups. Storage stays.
func (b *box) Stop(ctx context.Context) error {
	var err error
	b.stop.Do(func() {
		b.kill()
		b.rt.cg.Thaw(b.spec.ID) // a paused box's processes die only when they run
		select {
		case <-b.done:
		case <-ctx.Done():
			err = ctx.Err()
			return
		}
		b.ag.Close()
		if b.rt.net != nil {
			b.rt.net.Detach(b.spec.NetSlot)
		}
		err = b.rt.cg.Remove(b.spec.ID)
		if _, rerr := b.rt.removeRun(b.spec.ID); err == nil {
			err = rerr
		}
	})
	return err
}

// removeRun detaches whatever is still mounted in the box's run directory
// (the root of a Start cut short, with its volumes and bind mounts) and
// removes the directory, never crossing a mount point. It returns the
// mount points it detached.
func (r *Runtime) removeRun(id string) ([]string, error) {
	run := r.boxRun(id)
	gone, err := storage.UnmountUnder(run)
	if err != nil {
		return gone, err
	}
	return gone, storage.RemoveTree(run)
}

// Clean removes what a box left outside its storage: processes a dead
// daemon left running, its cgroups, its network interface, and its run
// directory with anything mounted in it. It returns the mount points it
// detached.
func (r *Runtime) Clean(ctx context.Context, spec *isolate.Spec) ([]string, error) {
	r.cg.Kill(spec.ID) // anything a dead daemon left running
	r.cg.Remove(spec.ID)
	if r.net != nil && spec.Net {
		r.net.Detach(spec.NetSlot)
	}
	return r.removeRun(spec.ID)
}

// Destroy cleans up after the box (Clean) and removes its storage.
func (r *Runtime) Destroy(ctx context.Context, spec *isolate.Spec) error {
	if _, err := r.Clean(ctx, spec); err != nil {
		return err
	}
	return isolate.RemoveStorage(spec)
}

// Load reattaches to a box that outlived the daemon that started it: pid
// must still be that box's init, and its agent must answer.
func (r *Runtime) Load(ctx context.Context, spec *isolate.Spec, pid int) (isolate.Box, error) {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.HasPrefix(string(cmdline), "den-init\x00"+initArg) {
		return nil, fmt.Errorf("box %s: pid %d is not its init", spec.ID, pid)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("box %s: pidfd: %w", spec.ID, err)
	}
	b := &box{rt: r, spec: spec, pid: pid, done: make(chan struct{})}
	b.ag = agent.UnixClient(filepath.Join(r.boxRun(spec.ID), "agent.sock"))
	// A paused box stays paused; its agent answers after Resume.
	if !r.cg.Frozen(spec.ID) {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := b.ag.Ping(pctx); err != nil {
			unix.Close(pidfd)
			return nil, fmt.Errorf("box %s: agent does not answer: %w", spec.ID, err)
		}
	}
	// Wait for the init's end through the runtime's poller (no thread per
	// box): a pidfd becomes readable when its process exits.
	unix.SetNonblock(pidfd, true)
	pf := os.NewFile(uintptr(pidfd), "pidfd")
	rc, err := pf.SyscallConn()
	if err != nil {
		pf.Close()
		return nil, fmt.Errorf("box %s: pidfd: %w", spec.ID, err)
	}
	b.kill = func() error { return unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0) }
	go func() {
		rc.Read(func(fd uintptr) bool {
			n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return n > 0
		})
		pf.Close()
		close(b.done)
	}()
	return b, nil
}

// Stats reads the box's cgroup counters and its network namespace's
// interface counters (through its init's /proc/PID/net/dev).
func (b *box) Stats() (isolate.Stats, error) {
	u := b.rt.cg.Usage(b.spec.ID)
	st := isolate.Stats{CPU: u.CPU, Memory: u.Memory, Pids: u.Pids}
	dev, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", b.pid))
	if err != nil {
		return st, fmt.Errorf("box %s: read network counters: %w", b.spec.ID, err)
	}
	for _, line := range strings.Split(string(dev), "\n")[2:] {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if strings.TrimSpace(name) == "lo" || len(f) < 9 {
			continue // loopback is the box talking to itself
		}
		rx, _ := strconv.ParseInt(f[0], 10, 64)
		tx, _ := strconv.ParseInt(f[8], 10, 64)
		st.NetRxBytes += rx
		st.NetTxBytes += tx
	}
	return st, nil
}

// AttachNet gives a running box its network interface.
func (b *box) AttachNet() (string, error) {
	if b.rt.net == nil {
		return "", errors.New("this daemon has no sandbox network")
	}
	a, err := b.rt.net.Attach(b.pid, b.spec.NetSlot)
	if err != nil {
		return "", err
	}
	b.spec.Net = true
	return a.String(), nil
}

// DetachNet takes a running box's network interface away.
func (b *box) DetachNet() error {
	b.spec.Net = false
	if b.rt.net == nil {
		return nil
	}
	return b.rt.net.Detach(b.spec.NetSlot)
}

// SetBandwidth changes a running box's bandwidth limit.
func (b *box) SetBandwidth(rate int64) error {
	if b.rt.net == nil || !b.spec.Net {
		return errors.New("the sandbox has no network interface")
	}
	return b.rt.net.SetBandwidth(b.pid, b.spec.NetSlot, rate)
}

// Pause freezes every process of the box, its agent included, and returns
// once the kernel reports them all frozen (cgroup freezer).
func (b *box) Pause(ctx context.Context) error { return b.rt.cg.Freeze(ctx, b.spec.ID, true) }

// Resume thaws the box's processes.
func (b *box) Resume(ctx context.Context) error { return b.rt.cg.Freeze(ctx, b.spec.ID, false) }

// Frozen reports whether the box's processes are frozen (a pause, or a
// capture a dead daemon did not finish).
func (b *box) Frozen() bool { return b.rt.cg.Frozen(b.spec.ID) }

// Procs lists the host pids of the box's processes.
func (b *box) Procs() []int { return b.rt.cg.Procs(b.spec.ID) }

// launcherTid finds the agent's launcher thread (named den-launcher) of
// the box init pid.
func launcherTid(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, e := range ents {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/comm", pid, e.Name())); strings.TrimSpace(string(b)) == launcherName {
			tid, _ := strconv.Atoi(e.Name())
			return tid
		}
	}
	return 0
}

// launcherName is the thread name the agent gives its launcher thread.
const launcherName = "den-launcher"
