package linux

import (
	"encoding/json"
	"fmt"
	"github.com/den-dev/den/internal/host"
	"net"
	"os"
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
	if err := agent.SetHostname(cfg.Hostname, "/"); err != nil {
		fail(err)
	}
	if err := host.LoopbackUp(); err != nil {
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
	if err := host.MountSystem(root, cfg.ShmSize, func(dst, name string) error {
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
