package linux

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"unsafe"

	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/confine"
	"golang.org/x/sys/unix"
)

// Descriptors a box's init inherits from the daemon.
const (
	fdConfig   = 3 // initConfig as JSON, then EOF
	fdListener = 4 // the agent's listening unix socket
	fdStatus   = 5 // closed when ready; an error message otherwise
)

// IsInit reports whether argv is a box init invocation.
func IsInit(args []string) bool { return len(args) > 0 && args[0] == initArg }

// Init is the body of a box's PID 1: it finishes the mount namespace,
// pivots into the box's root, and becomes the den agent. It never returns.
func Init() {
	status := os.NewFile(fdStatus, "status")
	fail := func(err error) {
		status.WriteString(err.Error())
		os.Exit(1)
	}
	var cfg initConfig
	cfgFile := os.NewFile(fdConfig, "config")
	if err := json.NewDecoder(cfgFile).Decode(&cfg); err != nil {
		fail(fmt.Errorf("read config: %w", err))
	}
	cfgFile.Close()
	if err := setupRoot(cfg); err != nil {
		fail(err)
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		fail(fmt.Errorf("sethostname: %w", err))
	}
	if err := loopbackUp(); err != nil {
		fail(err)
	}
	lnFile := os.NewFile(fdListener, "agent.sock")
	ln, err := net.FileListener(lnFile)
	if err != nil {
		fail(fmt.Errorf("agent listener: %w", err))
	}
	lnFile.Close()
	// No process of the box may ptrace or read the agent's memory and fds.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	a, err := agent.New(agent.Options{Confine: confineLauncher})
	if err != nil {
		fail(fmt.Errorf("start agent: %w", err))
	}
	status.Close()
	a.Serve(ln)
	os.Exit(1)
}

// confineLauncher runs on the agent's launcher thread: a private cgroup
// namespace, then the capability set, no_new_privs and the seccomp filter.
func confineLauncher() error {
	// Named so the daemon can find this thread and put it (and so every
	// command) in the commands' cgroup.
	unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&[]byte(launcherName + "\x00")[0])), 0, 0, 0)
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("unshare cgroup namespace: %w", err)
	}
	return confine.Apply(confine.Default())
}

// Paths masked and made read-only as in Docker's default configuration,
// and sysfs's virtual block devices, which are the host's (sysfs shows
// every block device, whatever namespace mounts it) and tell host paths:
// a loop device's backing_file, a zram device's backing_dev, an nbd
// device's backend; /sys/block, /sys/class/block and /sys/dev/block only
// link there.
var (
	maskedPaths = []string{
		"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
		"/sys/firmware", "/sys/devices/virtual/powercap", "/sys/devices/virtual/block",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
	devices = []string{"null", "zero", "full", "random", "urandom", "tty"}
)

// MaskPaths hides the kernel interfaces a sandbox has no business with
// under root (its /proc and /sys mounted): Docker's masked paths become an
// empty read-only tmpfs or /dev/null, its read-only paths read-only. root's
// /dev/null must exist.
func MaskPaths(root string) error {
	const nosuidnodev = unix.MS_NOSUID | unix.MS_NODEV
	p := func(rel string) string { return filepath.Join(root, rel) }
	for _, m := range maskedPaths {
		st, err := os.Stat(p(m))
		if err != nil {
			continue
		}
		if st.IsDir() {
			err = unix.Mount("tmpfs", p(m), "tmpfs", unix.MS_RDONLY|nosuidnodev|unix.MS_NOEXEC, "size=0")
		} else {
			err = unix.Mount(p("/dev/null"), p(m), "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", m, err)
		}
	}
	for _, ro := range readonlyPaths {
		if _, err := os.Stat(p(ro)); err != nil {
			continue
		}
		if err := unix.Mount(p(ro), p(ro), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", ro, err)
		}
		if err := unix.Mount("", p(ro), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|nosuidnodev|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", ro, err)
		}
	}
	return nil
}

// MountSystem mounts a box's kernel file systems in root: /proc, a
// read-only /sys, and a /dev tmpfs holding the usual devices (each made by
// makeDev at dst), pts, shm, mqueue and the standard links plus links;
// then it masks what a box must not reach (MaskPaths). The linux tier binds
// the host's devices, a microVM's guest makes its own.
func MountSystem(root string, makeDev func(dst, name string) error, links map[string]string) error {
	p := func(rel string) string { return filepath.Join(root, rel) }
	mkdir := func(rel string, mode os.FileMode) error {
		if err := os.MkdirAll(p(rel), mode); err != nil {
			return fmt.Errorf("create %s: %w", rel, err)
		}
		return nil
	}
	for _, d := range []string{"/proc", "/sys", "/dev", "/tmp"} {
		if err := mkdir(d, 0o755); err != nil {
			return err
		}
	}
	const nosuidnodev = unix.MS_NOSUID | unix.MS_NODEV
	if err := unix.Mount("proc", p("/proc"), "proc", nosuidnodev|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := unix.Mount("sysfs", p("/sys"), "sysfs", nosuidnodev|unix.MS_NOEXEC|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mount /sys: %w", err)
	}
	if err := unix.Mount("tmpfs", p("/dev"), "tmpfs", unix.MS_NOSUID|unix.MS_STRICTATIME, "mode=755,size=65536k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, d := range devices {
		if err := makeDev(p("/dev/"+d), d); err != nil {
			return fmt.Errorf("create /dev/%s: %w", d, err)
		}
	}
	for _, d := range []string{"/dev/pts", "/dev/shm", "/dev/mqueue"} {
		if err := mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("devpts", p("/dev/pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	if err := unix.Mount("shm", p("/dev/shm"), "tmpfs", nosuidnodev|unix.MS_NOEXEC, "mode=1777,size=65536k"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	if err := unix.Mount("mqueue", p("/dev/mqueue"), "mqueue", nosuidnodev|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /dev/mqueue: %w", err)
	}
	all := map[string]string{
		"/dev/ptmx": "pts/ptmx", "/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
	}
	for link, target := range links {
		all[link] = target
	}
	for link, target := range all {
		if err := os.Symlink(target, p(link)); err != nil {
			return fmt.Errorf("symlink %s: %w", link, err)
		}
	}
	return MaskPaths(root)
}

func setupRoot(cfg initConfig) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	root := cfg.Rootfs
	// The root was mounted by the daemon and is locked in this namespace;
	// a bind made here is not, and pivot_root needs that.
	if err := unix.Mount(root, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind root: %w", err)
	}
	if err := MountSystem(root, func(dst, name string) error {
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o666)
		if err != nil {
			return err
		}
		f.Close()
		if err := unix.Mount("/dev/"+name, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
		return nil
	}, map[string]string{"/dev/core": "/proc/kcore"}); err != nil {
		return err
	}
	// pivot_root(".", ".") stacks the old root on the new one; detaching it
	// drops every host mount from this namespace.
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("chdir to root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	return nil
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}
