package microvm

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/host"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/storage"
	"golang.org/x/sys/unix"
)

// Config configures the microVM tier.
type Config struct {
	RunDir   string // per-box sockets, console logs, netns; default /run/den/microvm
	StateDir string // caches (initramfs, erofs images, KVM verdict); default /var/lib/den/microvm
	QEMU     string // default qemu-system-x86_64 (from PATH)
	Kernel   string // guest kernel; "" locates one in /boot
	Accel    string // "kvm", "tcg", or "" to choose (probing KVM once)
	// Exe is the binary the guest runs as its init and agent; default
	// /proc/self/exe (the den binary, or a test binary in tests).
	Exe string
	// Memory is a box's memory when its spec sets none (default 512 MiB).
	Memory int64
	// DiskSize is the size of a box's sparse writable disk (default 8 GiB).
	DiskSize int64
	// BootTimeout bounds a boot until the agent answers (default 60 s).
	BootTimeout time.Duration
	// Network, if set, connects boxes whose spec asks for it.
	Network *host.Network
	// CgroupRoot is where cgroups are mounted (default /sys/fs/cgroup);
	// CgroupParent the group each box's QEMU is put in, as PARENT/<id>
	// (default "den"; den serve gives every tier its daemon's parent).
	// The guest's memory and CPUs are its limits, not the groups'.
	CgroupRoot, CgroupParent string

	// extraAppend is added to the guest kernel's command line (tests).
	extraAppend string
	// clockSync is how often a running guest's clock is stepped to the
	// host's (default clockSyncEvery; tests shorten it).
	clockSync time.Duration
}

// clockSyncEvery: a running guest's clock drifts from the host's, which
// NTP disciplines (a crystal's 50 ppm is 30 ms in 10 minutes).
const clockSyncEvery = 10 * time.Minute

func (c *Config) defaults() {
	if c.RunDir == "" {
		c.RunDir = "/run/den/microvm"
	}
	if c.StateDir == "" {
		c.StateDir = "/var/lib/den/microvm"
	}
	if c.QEMU == "" {
		c.QEMU = "qemu-system-x86_64"
	}
	if c.CgroupRoot == "" {
		c.CgroupRoot = "/sys/fs/cgroup"
	}
	if c.CgroupParent == "" {
		c.CgroupParent = "den"
	}
	if c.Exe == "" {
		c.Exe = "/proc/self/exe"
	}
	if c.clockSync <= 0 {
		c.clockSync = clockSyncEvery
	}
	if c.Memory <= 0 {
		c.Memory = 512 << 20
	}
	if c.DiskSize <= 0 {
		c.DiskSize = 8 << 30
	}
	if c.BootTimeout <= 0 {
		c.BootTimeout = 60 * time.Second
	}
}

// Runtime is the microVM tier.
type Runtime struct {
	cfg    Config
	info   Info
	images *imageCache
	net    *host.Network
	cg     host.CgroupView // QEMU's groups: PARENT/<id>, no limits
}

// The abilities of the microvm tier (isolate's optional interfaces).
var (
	_ isolate.Runtime      = (*Runtime)(nil)
	_ isolate.Loader       = (*Runtime)(nil)
	_ isolate.Checkpointer = (*Runtime)(nil)
	_ isolate.Adopter      = (*Runtime)(nil)

	_ isolate.Box     = (*box)(nil)
	_ isolate.Pauser  = (*box)(nil)
	_ isolate.Statser = (*box)(nil)
	_ isolate.Dialer  = (*box)(nil)
)

// DialInside connects to 127.0.0.1:port inside the guest, through the
// agent.
func (b *box) DialInside(ctx context.Context, port int) (net.Conn, error) {
	return b.link.Client().DialPort(ctx, port)
}

// New detects QEMU, the kernel and the accelerator (see Detect) and
// prepares the runtime.
func New(cfg Config) (*Runtime, error) {
	cfg.defaults()
	if os.Geteuid() != 0 {
		return nil, errors.New("the microvm runtime needs root (run den serve as root)")
	}
	info := Detect(context.Background(), cfg)
	if !info.Available {
		return nil, fmt.Errorf("the microvm tier is unavailable: %s", info.Reason)
	}
	for _, d := range []string{cfg.RunDir, cfg.StateDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	return &Runtime{cfg: cfg, info: info, images: newImageCache(filepath.Join(cfg.StateDir, "erofs")), net: cfg.Network,
		cg: host.DetectView(cfg.CgroupRoot, cfg.CgroupParent)}, nil
}

// Name is "microvm".
func (r *Runtime) Name() string { return "microvm" }

// Info is what New detected.
func (r *Runtime) Info() Info { return r.info }

func (r *Runtime) boxRun(id string) string { return filepath.Join(r.cfg.RunDir, id) }

// vmConfig is how a box's QEMU runs; it is kept in the run directory and
// in checkpoints (a restore must rebuild the same machine).
type vmConfig struct {
	Memory  int64    `json:"memory_mib"`
	CPUs    int      `json:"cpus"`
	Accel   string   `json:"accel"`
	Kernel  string   `json:"kernel"`
	Initrd  string   `json:"initrd"`
	Cmdline string   `json:"cmdline"`
	Lowers  []string `json:"lowers"` // erofs images; disk serial l<i>
	Net     bool     `json:"net"`
	MAC     string   `json:"mac,omitempty"`
	// RTC: the machine has a CMOS clock the guest kernel reads its time
	// from at boot (a checkpoint made without one restores without one:
	// the saved machine must match).
	RTC    bool `json:"rtc,omitempty"`
	Limits isolate.Limits
	// Ident is the hostname and network the guest has taken: a restore
	// whose box has the same skips telling it again.
	Ident *guestIdentity `json:"identity,omitempty"`
}

type box struct {
	rt   *Runtime
	spec *isolate.Spec
	run  string
	vm   vmConfig
	pid  int
	kill func() error
	qmp  *qmp
	link *agent.Link
	done chan struct{}

	mu      sync.Mutex
	paused  bool
	stopped bool
	// needAttach: loaded while paused, the link attaches on Resume.
	needAttach bool
	booted     time.Duration // from QEMU's start to the agent's answer
	identified time.Duration // how long a restored guest took to take its identity
	stopErr    error
}

func (b *box) Agent() *agent.Client  { return b.link.Client() }
func (b *box) Pid() int              { return b.pid }
func (b *box) Done() <-chan struct{} { return b.done }

// OOMKills is 0: the guest kernel's out-of-memory kills are not counted.
func (b *box) OOMKills() uint64 { return 0 }

// SetLimits cannot change a running VM's memory or CPUs.
func (b *box) SetLimits(l isolate.Limits) error {
	if vmMemory(l, b.rt.cfg) != b.vm.Memory || vmCPUs(l) != b.vm.CPUs {
		return fmt.Errorf("the microvm tier cannot change the memory or CPUs of a running sandbox: %w", errors.ErrUnsupported)
	}
	return nil
}

func vmMemory(l isolate.Limits, cfg Config) int64 {
	m := l.Memory
	if m <= 0 {
		m = cfg.Memory
	}
	return max(m>>20, 128)
}

func vmCPUs(l isolate.Limits) int {
	n := 1
	if l.CPUs > 0 {
		n = int(math.Ceil(l.CPUs))
	}
	return min(max(n, 1), runtime.NumCPU())
}

// validate refuses what the tier cannot do.
func validate(spec *isolate.Spec) error {
	if len(spec.Layers) == 0 || spec.Layers[0].Target != "/" {
		return errors.New("the first layer must be mounted at /")
	}
	if len(spec.Mounts) > 0 {
		return fmt.Errorf("volumes and bind mounts are not supported on the microvm tier: %w", errors.ErrUnsupported)
	}
	if spec.Dir == "" {
		return errors.New("no box directory")
	}
	return nil
}

// prepare builds what a boot needs: the writable disk, the lower images,
// the initramfs, and the kernel command line.
func (r *Runtime) prepare(spec *isolate.Spec) (vmConfig, *guestConfig, error) {
	vm := vmConfig{
		Memory: vmMemory(spec.Limits, r.cfg), CPUs: vmCPUs(spec.Limits), Accel: r.info.Accel,
		Kernel: r.info.Kernel, Net: spec.Net, Limits: spec.Limits, RTC: true,
	}
	if err := r.ensureDisk(spec.Dir, r.diskSize(spec.Limits)); err != nil {
		return vm, nil, err
	}
	gc := &guestConfig{Hostname: spec.Hostname, Disk: "rw", Shm: spec.ShmSize}
	index := map[string]string{}
	for _, l := range spec.Layers {
		gl := guestLayer{Target: l.Target, Name: l.Name}
		for _, low := range l.Lowers {
			img, err := r.images.image(low)
			if err != nil {
				return vm, nil, err
			}
			s, ok := index[img]
			if !ok {
				s = "l" + strconv.Itoa(len(vm.Lowers))
				index[img] = s
				vm.Lowers = append(vm.Lowers, img)
			}
			gl.Lowers = append(gl.Lowers, s)
		}
		gc.Layers = append(gc.Layers, gl)
	}
	initrd, err := initramfs(r.cfg.StateDir, r.cfg.Exe, r.info.KernelVer)
	if err != nil {
		return vm, nil, err
	}
	vm.Initrd = initrd
	if spec.Net {
		vm.MAC = guestMAC(spec.ID)
	}
	return vm, gc, nil
}

// cmdline is the guest kernel's command line carrying gc.
func cmdline(gc *guestConfig) (string, error) {
	b, _ := json.Marshal(gc)
	s := "console=ttyS0 quiet panic=-1 reboot=t pci=off cryptomgr.notests i8042.noaux i8042.nokbd i8042.nopnp den.cfg=" +
		base64.RawURLEncoding.EncodeToString(b)
	if len(s) >= 2048 {
		return "", fmt.Errorf("the box's configuration does not fit on the guest kernel's command line (%d bytes)", len(s))
	}
	return s, nil
}

// diskSize is the size of a new writable disk: the configured size, or
// less under a disk quota, so that the guest's ext4 fills up (ENOSPC inside)
// before the image's blocks reach the quota (which the guest would see as
// I/O errors, and remount its disk read-only). The margin covers what a
// copy-on-write host filesystem charges for rewritten blocks until its next
// commit.
func (r *Runtime) diskSize(l isolate.Limits) int64 {
	if l.Disk <= 0 {
		return r.cfg.DiskSize
	}
	return min(r.cfg.DiskSize, max(l.Disk-max(l.Disk/8, 8<<20), minDisk))
}

// minDisk is the smallest writable disk made (mkfs.ext4 needs some room).
const minDisk = 16 << 20

// ensureDisk makes the box's writable disk of size bytes on first use: a
// sparse ext4 image the host never mounts (its contents are the guest's).
func (r *Runtime) ensureDisk(dir string, size int64) error {
	disk := filepath.Join(dir, "disk.img")
	if _, err := os.Stat(disk); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create box directory: %w", err)
	}
	tmp := disk + ".tmp"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("create disk: %w", err)
	}
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs.ext4: %v: %s", err, tail(out, 300))
	}
	return os.Rename(tmp, disk)
}

// qemuArgs is QEMU's command line for vm; a tap descriptor, if any, is
// fd 3.
func qemuArgs(vm vmConfig, run, dir string, incoming bool) []string {
	cpu := "max"
	if vm.Accel == "kvm" {
		cpu = "host"
	}
	rtc := "off"
	if vm.RTC {
		rtc = "on"
	}
	a := []string{
		"-name", "den-" + filepath.Base(run),
		"-M", "microvm,x-option-roms=off,isa-serial=on,rtc=" + rtc + ",acpi=on",
		"-accel", vm.Accel, "-cpu", cpu,
		"-m", strconv.FormatInt(vm.Memory, 10), "-smp", strconv.Itoa(vm.CPUs),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		// The RTC follows the host's UTC clock, also while the VM is
		// stopped.
		"-rtc", "base=utc,clock=host",
		"-kernel", vm.Kernel, "-initrd", vm.Initrd, "-append", vm.Cmdline,
		"-chardev", "file,id=con,path=" + filepath.Join(run, "console.log"), "-serial", "chardev:con",
		"-qmp", "unix:" + filepath.Join(run, "qmp.sock") + ",server=on,wait=off",
		"-drive", "if=none,id=rw,format=raw,discard=unmap,file=" + filepath.Join(dir, "disk.img"),
		"-device", "virtio-blk-device,drive=rw,serial=rw",
	}
	for i, img := range vm.Lowers {
		id := "l" + strconv.Itoa(i)
		a = append(a, "-drive", "if=none,id="+id+",format=raw,readonly=on,file="+img,
			"-device", "virtio-blk-device,drive="+id+",serial="+id)
	}
	a = append(a,
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,server=on,wait=off,path="+filepath.Join(run, "agent.sock"),
		"-device", "virtserialport,chardev=agent,name="+agentPort,
		"-chardev", "socket,id=ctl,server=on,wait=off,path="+filepath.Join(run, "ctl.sock"),
		"-device", "virtserialport,chardev=ctl,name="+ctlPort,
	)
	if vm.Net {
		a = append(a, "-netdev", "tap,id=n0,fd=3", "-device", "virtio-net-device,netdev=n0,mac="+vm.MAC)
	}
	if incoming {
		a = append(a, "-S", "-incoming", "defer")
	}
	return a
}

// Start boots a box.
func (r *Runtime) Start(ctx context.Context, spec *isolate.Spec) (isolate.Box, error) {
	if err := validate(spec); err != nil {
		return nil, err
	}
	vm, gc, err := r.prepare(spec)
	if err != nil {
		return nil, err
	}
	return r.boot(ctx, spec, vm, gc, "")
}

// boot starts QEMU for spec and waits for its agent; with a checkpoint
// directory it restores the VM from it instead of booting.
func (r *Runtime) boot(ctx context.Context, spec *isolate.Spec, vm vmConfig, gc *guestConfig, ckpt string) (_ isolate.Box, err error) {
	run := r.boxRun(spec.ID)
	r.killStale(spec.ID)
	var cleanup []func()
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()
	if err := storage.RemoveTree(run); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(run, 0o700); err != nil {
		return nil, fmt.Errorf("create run dir: %w", err)
	}
	cleanup = append(cleanup, func() { storage.RemoveTree(run) })

	var tap *os.File
	// What a restored guest must become (it may run another box's
	// checkpoint).
	ident := &guestIdentity{Hostname: spec.Hostname}
	if spec.Net {
		if r.net == nil {
			return nil, errors.New("this daemon has no sandbox network (start den serve with networking)")
		}
		nsPath := filepath.Join(run, "netns")
		if err := host.CreateNetNS(nsPath); err != nil {
			return nil, err
		}
		cleanup = append(cleanup, func() { r.net.Detach(spec.NetSlot); host.RemoveNetNS(nsPath) })
		if _, err := r.net.AttachPath(nsPath, spec.NetSlot); err != nil {
			return nil, err
		}
		if spec.NetBandwidth > 0 {
			if err := r.net.SetBandwidthPath(nsPath, spec.NetSlot, spec.NetBandwidth); err != nil {
				return nil, err
			}
		}
		if vm.MAC == "" {
			vm.MAC = guestMAC(spec.ID)
		}
		mac, err := net.ParseMAC(vm.MAC)
		if err != nil {
			return nil, fmt.Errorf("the guest's MAC: %w", err)
		}
		f, gn, err := wireTap(nsPath, mac)
		if err != nil {
			return nil, fmt.Errorf("wire the guest's network: %w", err)
		}
		defer f.Close()
		tap = f
		if gc != nil {
			gc.Net = gn
		}
		ident.Net, ident.MAC = gn, vm.MAC
		vm.Net = true
	} else {
		vm.Net = false
	}
	if gc != nil {
		if vm.Cmdline, err = cmdline(gc); err != nil {
			return nil, err
		}
		if vm.Accel == "tcg" {
			if khz := hostTSCkHz(); khz > 0 {
				vm.Cmdline += fmt.Sprintf(" tsc_early_khz=%d tsc=reliable", khz)
			}
		}
		if r.cfg.extraAppend != "" {
			vm.Cmdline += " " + r.cfg.extraAppend
		}
	}
	// A restored guest keeps the identity it had when the checkpoint was
	// taken until it is told its box's (a fork's differs).
	prev, _ := json.Marshal(vm.Ident)
	now, _ := json.Marshal(ident)
	reidentify := ckpt != "" && string(prev) != string(now)
	vm.Ident = ident
	if b, err := json.Marshal(vm); err == nil {
		os.WriteFile(filepath.Join(run, "vm.json"), b, 0o600)
	}
	logf, err := os.OpenFile(filepath.Join(run, "qemu.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(r.info.QEMU, qemuArgs(vm, run, spec.Dir, ckpt != "")...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if tap != nil {
		cmd.ExtraFiles = []*os.File{tap}
	}
	// Its own session: QEMU outlives the daemon (Load reattaches).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start QEMU: %w", err)
	}
	os.WriteFile(filepath.Join(run, "qemu.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
	b := &box{rt: r, spec: spec, run: run, vm: vm, pid: cmd.Process.Pid, kill: cmd.Process.Kill,
		link: agent.NewLink(), done: make(chan struct{})}
	go func() { cmd.Wait(); close(b.done) }()
	cleanup = append(cleanup, func() { b.kill(); <-b.done; b.link.Close(); r.cg.RemoveGroups(spec.ID) })
	if err := r.cg.Place(spec.ID, b.pid); err != nil {
		return nil, fmt.Errorf("QEMU's cgroup: %w", err)
	}

	bctx, cancel := context.WithTimeout(ctx, r.cfg.BootTimeout)
	defer cancel()
	go func() {
		select {
		case <-b.done:
			cancel()
		case <-bctx.Done():
		}
	}()
	fail := func(step string, err error) error {
		// A connection that broke is often QEMU exiting: give it a moment
		// to be reaped, and say why it ended.
		select {
		case <-b.done:
			return fmt.Errorf("%s: the VM ended: %s", step, b.failure())
		case <-time.After(time.Second):
		}
		if ctx.Err() == nil && bctx.Err() != nil {
			return fmt.Errorf("%s: no answer within %v: %s", step, r.cfg.BootTimeout, b.failure())
		}
		return fmt.Errorf("%s: %w", step, err)
	}
	if b.qmp, err = dialQMP(bctx, filepath.Join(run, "qmp.sock")); err != nil {
		return nil, fail("connect to QEMU", err)
	}
	cleanup = append(cleanup, b.qmp.close)
	// A restored guest takes its box's identity while the agent's link
	// reconnects.
	identified := make(chan error, 1)
	if ckpt != "" {
		if err := b.incoming(bctx, filepath.Join(ckpt, "memory")); err != nil {
			return nil, fail("restore", err)
		}
	}
	if reidentify {
		go func() {
			t := time.Now()
			err := b.identify(bctx, ident)
			b.identified = time.Since(t)
			identified <- err
		}()
	} else {
		identified <- nil
	}
	if err := b.attach(bctx); err != nil {
		<-identified
		return nil, fail("wait for the agent", err)
	}
	if err := <-identified; err != nil {
		return nil, fail("give the restored guest its identity", err)
	}
	// A booted guest's clock is the RTC's, to the second; a restored one's
	// is the checkpoint's.
	if err := b.setClock(bctx); err != nil {
		return nil, fail("set the guest's clock", err)
	}
	b.booted = time.Since(t0)
	go b.keepClock(r.cfg.clockSync)
	return b, nil
}

// failure is why the VM failed: the end of its console and of QEMU's own
// log.
func (b *box) failure() string {
	con, _ := os.ReadFile(filepath.Join(b.run, "console.log"))
	ql, _ := os.ReadFile(filepath.Join(b.run, "qemu.log"))
	msg := tail(con, 1500)
	// The line that says why comes first: a kernel panic's, or den's
	// init's own.
	lines := strings.Split(string(con), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "Kernel panic") || strings.Contains(lines[i], "den-init:") || strings.Contains(lines[i], "den-agent:") {
			msg = strings.TrimSpace(lines[i]) + "\n...\n" + msg
			break
		}
	}
	if q := tail(ql, 500); q != "" {
		msg += "\nqemu: " + q
	}
	if msg == "" {
		msg = "no console output"
	}
	return msg
}

// attach connects to the agent's serial port and opens a link session.
func (b *box) attach(ctx context.Context) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", filepath.Join(b.run, "agent.sock"))
	if err != nil {
		return err
	}
	return b.link.Attach(ctx, conn)
}

// Stop kills QEMU and frees the box's run directory and network; its
// disk stays. Idempotent.
func (b *box) Stop(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stopLocked(ctx, true)
}

// stopLocked stops the box; with flush the guest first writes its page
// cache to its disk.
func (b *box) stopLocked(ctx context.Context, flush bool) error {
	if b.stopped {
		return b.stopErr
	}
	if flush {
		// A paused guest runs an instant to flush: files written before
		// the pause are kept.
		if b.paused {
			b.qmp.run(ctx, "cont", nil)
		}
		b.flush(ctx)
	}
	b.kill()
	select {
	case <-b.done:
	case <-ctx.Done():
		return fmt.Errorf("stop: QEMU (pid %d) did not exit: %w", b.pid, ctx.Err())
	}
	b.stopped = true
	b.link.Close()
	if b.qmp != nil {
		b.qmp.close()
	}
	b.stopErr = b.rt.cleanupRun(b.spec)
	return b.stopErr
}

// flush makes the guest write its dirty page cache to its disk (killing
// QEMU would lose it).
func (b *box) flush(ctx context.Context) error {
	select {
	case <-b.done:
		return nil
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.control(ctx, "sync"); err != nil {
		return fmt.Errorf("flush the guest's disk: %w", err)
	}
	return nil
}

// identify makes a restored guest the box id describes, and returns once
// it has (see applyIdentity).
func (b *box) identify(ctx context.Context, id *guestIdentity) error {
	raw, _ := json.Marshal(id)
	err := b.control(ctx, "identity "+base64.RawURLEncoding.EncodeToString(raw))
	if err != nil && err.Error() == "unknown" {
		// The init of a checkpoint made by an older den answers so.
		return errors.New("the checkpoint's guest predates identity requests (made by an older den): it can be restored only into the box it was taken of, on the same network slot")
	}
	return err
}

// setClock steps the guest's wall clock to the host's. The time is the
// host's when the request leaves; an answer slower than clockRTT (a
// guest still waking) means it may be that much late, and the request is
// sent again.
func (b *box) setClock(ctx context.Context) error {
	for i := 0; ; i++ {
		t := time.Now()
		err := b.control(ctx, "time "+strconv.FormatInt(t.UnixNano(), 10))
		if err != nil && strings.HasPrefix(err.Error(), "unknown") {
			// The init of a checkpoint made by an older den: its clock
			// stays as it was.
			return nil
		}
		if err != nil || time.Since(t) < clockRTT || i == 2 {
			return err
		}
	}
}

// keepClock steps the guest's clock to the host's every interval while
// the box runs, until QEMU ends. A step that fails is tried again at the
// next one (a guest whose control port does not answer has worse
// troubles, seen by its agent's link).
func (b *box) keepClock(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-b.done:
			return
		case <-t.C:
		}
		b.mu.Lock()
		if !b.paused && !b.stopped {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			b.setClock(ctx)
			cancel()
		}
		b.mu.Unlock()
	}
}

// clockRTT is the answer time under which a clock request is taken to
// have arrived at once.
const clockRTT = 250 * time.Millisecond

// maxCtlReply bounds the guest's answer to a control request (the guest
// is not trusted).
const maxCtlReply = 4 << 10

// control sends one request to the guest init's control port and waits
// for its "ok".
func (b *box) control(ctx context.Context, req string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", filepath.Join(b.run, "ctl.sock"))
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := c.Write([]byte(req + "\n")); err != nil {
		return err
	}
	reply, err := bufio.NewReader(io.LimitReader(c, maxCtlReply)).ReadString('\n')
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == io.EOF && len(reply) == maxCtlReply {
			return fmt.Errorf("the guest answered more than %d bytes without a newline", maxCtlReply)
		}
		return err
	}
	if reply = strings.TrimSpace(reply); reply != "ok" {
		return errors.New(strings.TrimPrefix(reply, "error: "))
	}
	return nil
}

// cleanupRun removes a box's network and run directory.
func (r *Runtime) cleanupRun(spec *isolate.Spec) error {
	run := r.boxRun(spec.ID)
	nsPath := filepath.Join(run, "netns")
	if _, err := os.Stat(nsPath); err == nil {
		if r.net != nil {
			r.net.Detach(spec.NetSlot)
		}
		host.RemoveNetNS(nsPath)
	}
	if err := storage.RemoveTree(run); err != nil {
		return fmt.Errorf("remove run dir: %w", err)
	}
	return r.cg.RemoveGroups(spec.ID)
}

// killStale kills a QEMU of the box left by a dead daemon.
func (r *Runtime) killStale(id string) {
	run := r.boxRun(id)
	b, err := os.ReadFile(filepath.Join(run, "qemu.pid"))
	if err != nil {
		return
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 || !isOurQEMU(pid, run) {
		return
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	for i := 0; i < 500 && isOurQEMU(pid, run); i++ {
		time.Sleep(10 * time.Millisecond)
	}
}

// isOurQEMU reports whether pid is a QEMU of the box whose run directory
// is run.
func isOurQEMU(pid int, run string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	if _, f, err := host.ProcStat(pid); err == nil && len(f) > 0 && f[0] == "Z" {
		return false
	}
	return strings.Contains(string(b), "qemu") && strings.Contains(string(b), filepath.Join(run, "qmp.sock"))
}

// Destroy removes the box's storage (and anything a dead daemon left
// running). Idempotent.
func (r *Runtime) Destroy(ctx context.Context, spec *isolate.Spec) error {
	r.killStale(spec.ID)
	if err := r.cleanupRun(spec); err != nil {
		return err
	}
	return isolate.RemoveStorage(spec)
}

// Load reattaches to a box whose QEMU (pid) outlived the daemon that
// started it: its QMP socket and agent port are connected again.
func (r *Runtime) Load(ctx context.Context, spec *isolate.Spec, pid int) (isolate.Box, error) {
	run := r.boxRun(spec.ID)
	if !isOurQEMU(pid, run) {
		return nil, fmt.Errorf("box %s: pid %d is not its QEMU", spec.ID, pid)
	}
	var vm vmConfig
	if raw, err := os.ReadFile(filepath.Join(run, "vm.json")); err == nil {
		json.Unmarshal(raw, &vm)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("box %s: pidfd: %w", spec.ID, err)
	}
	b := &box{rt: r, spec: spec, run: run, vm: vm, pid: pid, link: agent.NewLink(), done: make(chan struct{})}
	b.kill = func() error { return unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0) }
	unix.SetNonblock(pidfd, true)
	pf := os.NewFile(uintptr(pidfd), "pidfd")
	rc, err := pf.SyscallConn()
	if err != nil {
		pf.Close()
		return nil, err
	}
	go func() {
		rc.Read(func(fd uintptr) bool {
			n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return n > 0
		})
		pf.Close()
		close(b.done)
	}()
	lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if b.qmp, err = dialQMP(lctx, filepath.Join(run, "qmp.sock")); err != nil {
		return nil, fmt.Errorf("box %s: %w", spec.ID, err)
	}
	st, err := b.qmp.status(lctx)
	if err != nil {
		b.qmp.close()
		return nil, fmt.Errorf("box %s: %w", spec.ID, err)
	}
	if st == "paused" {
		// A paused guest cannot answer: attach on Resume.
		b.paused, b.needAttach = true, true
		go b.keepClock(r.cfg.clockSync)
		return b, nil
	}
	if err := b.attach(lctx); err != nil {
		b.qmp.close()
		return nil, fmt.Errorf("box %s: agent does not answer: %w", spec.ID, err)
	}
	go b.keepClock(r.cfg.clockSync)
	return b, nil
}

// Pause stops the VM's CPUs.
func (b *box) Pause(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return errors.New("the box is stopped")
	}
	if _, err := b.qmp.run(ctx, "stop", nil); err != nil {
		return err
	}
	b.paused = true
	return nil
}

// Resume runs the VM's CPUs again.
func (b *box) Resume(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return errors.New("the box is stopped")
	}
	if _, err := b.qmp.run(ctx, "cont", nil); err != nil {
		return err
	}
	b.paused = false
	if b.needAttach {
		if err := b.attach(ctx); err != nil {
			return err
		}
		b.needAttach = false
	}
	// The guest's clock stood still while it was paused.
	if err := b.setClock(ctx); err != nil {
		return fmt.Errorf("set the guest's clock: %w", err)
	}
	return nil
}

// Stats reports QEMU's CPU time and resident memory, and the traffic of
// the box's interface.
func (b *box) Stats() (isolate.Stats, error) {
	var st isolate.Stats
	_, f, err := host.ProcStat(b.pid)
	if err != nil {
		return st, fmt.Errorf("box %s: %w", b.spec.ID, err)
	}
	if len(f) > 13 {
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		stt, _ := strconv.ParseInt(f[12], 10, 64)
		st.CPU = time.Duration(ut+stt) * time.Second / 100
	}
	if m, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", b.pid)); err == nil {
		if f := strings.Fields(string(m)); len(f) > 1 {
			pages, _ := strconv.ParseInt(f[1], 10, 64)
			st.Memory = pages * int64(os.Getpagesize())
		}
	}
	if b.vm.Net {
		st.NetRxBytes, st.NetTxBytes, _ = netCounters(filepath.Join(b.run, "netns"))
	}
	return st, nil
}
