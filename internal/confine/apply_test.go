//go:build linux && amd64

package confine

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The integration tests re-execute the test binary. The child locks its OS
// thread, applies a policy, runs the requested action from that thread and
// prints "key=value" lines for the parent to check.
const (
	envAction = "CONFINE_TEST_CHILD"
	envPolicy = "CONFINE_TEST_POLICY"
)

func TestMain(m *testing.M) {
	if action := os.Getenv(envAction); action != "" {
		os.Exit(childMain(action, os.Getenv(envPolicy)))
	}
	os.Exit(m.Run())
}

func allCaps() []Cap {
	var cs []Cap
	for c := CapChown; c <= CapCheckpointRestore; c++ {
		cs = append(cs, c)
	}
	return cs
}

func childPolicy(name string) (Policy, error) {
	switch name {
	case "default":
		return Default(), nil
	case "seccomp-only": // every capability kept: denials come from the filter
		return Policy{Caps: allCaps(), NoNewPrivs: true, Seccomp: true}, nil
	case "none": // control: nothing but clearing the inheritable set
		return Policy{Caps: allCaps()}, nil
	case "seccomp-without-nnp":
		p := Default()
		p.NoNewPrivs = false
		return p, nil
	case "inheritable":
		p := Default()
		p.Inheritable = true
		return p, nil
	}
	return Policy{}, fmt.Errorf("unknown policy %q", name)
}

func childMain(action, policy string) int {
	runtime.LockOSThread() // never unlocked: this is the launcher thread
	p, err := childPolicy(policy)
	if err != nil {
		fmt.Println("error=" + err.Error())
		return 2
	}
	if err := Apply(p); err != nil {
		fmt.Println("apply-error=" + err.Error())
		return 3
	}
	switch action {
	case "probes":
		names := make([]string, 0, len(probes))
		for n := range probes {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Printf("%s=%d\n", n, int(probes[n]()))
		}
	case "programs":
		pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{Env: []string{}})
		if err != nil {
			fmt.Println("true-error=" + err.Error())
		} else {
			var ws syscall.WaitStatus
			if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
				fmt.Println("true-error=" + err.Error())
			}
			fmt.Printf("true-exit=%d\n", ws.ExitStatus())
		}
		out, err := exec.Command("/bin/sh", "-c", "echo ok").Output()
		fmt.Printf("sh-out=%q\n", out)
		fmt.Printf("sh-err=%v\n", err)
	case "status":
		if err := printStatus("thread", func() ([]byte, error) { return os.ReadFile("/proc/thread-self/status") }); err != nil {
			fmt.Println("error=" + err.Error())
			return 4
		}
		if err := printStatus("exec", exec.Command("/bin/cat", "/proc/self/status").Output); err != nil {
			fmt.Println("error=" + err.Error())
			return 4
		}
		// Another thread of the same process must be unaffected (no TSYNC).
		done := make(chan error)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			done <- printStatus("other", func() ([]byte, error) { return os.ReadFile("/proc/thread-self/status") })
		}()
		if err := <-done; err != nil {
			fmt.Println("error=" + err.Error())
			return 4
		}
	default:
		fmt.Println("error=unknown action " + action)
		return 2
	}
	return 0
}

func printStatus(prefix string, read func() ([]byte, error)) error {
	b, err := read()
	if err != nil {
		return fmt.Errorf("%s status: %w", prefix, err)
	}
	fmt.Printf("%s.tid=%d\n", prefix, unix.Gettid())
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp":
			fmt.Printf("%s.%s=%s\n", prefix, k, strings.TrimSpace(v))
		}
	}
	return nil
}

func cstr(s string) *byte {
	p, err := unix.BytePtrFromString(s)
	if err != nil {
		panic(err)
	}
	return p
}

// probes are run on the confined thread. Each is harmless should it succeed:
// paths do not exist, pointers are NULL, and state changes stay in the child.
var probes = map[string]func() unix.Errno{
	"mount": func() unix.Errno {
		_, _, e := unix.Syscall6(unix.SYS_MOUNT, uintptr(unsafe.Pointer(cstr("none"))),
			uintptr(unsafe.Pointer(cstr("/nonexistent/confine-test"))), uintptr(unsafe.Pointer(cstr("tmpfs"))), 0, 0, 0)
		return e
	},
	"pivot_root": func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_PIVOT_ROOT, uintptr(unsafe.Pointer(cstr("/nonexistent/a"))),
			uintptr(unsafe.Pointer(cstr("/nonexistent/b"))), 0)
		return e
	},
	"unshare-user": func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER, 0, 0)
		return e
	},
	"setns": func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_SETNS, ^uintptr(0), 0, 0)
		return e
	},
	"clone-newns": func() unix.Errno {
		pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{
			Sys: &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS},
		})
		if err != nil {
			var e syscall.Errno
			if errors.As(err, &e) {
				return e
			}
			return unix.EIO
		}
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
		return 0
	},
	"clone3": func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
		return e
	},
	"keyctl": func() unix.Errno {
		session := -3 // KEY_SPEC_SESSION_KEYRING
		_, _, e := unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(session), 0)
		return e
	},
	"bpf": func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, 0, 0)
		return e
	},
	"perf_event_open": func() unix.Errno {
		_, _, e := unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0, 0)
		return e
	},
	"io_uring_setup": func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, 0, 0)
		return e
	},
	"userfaultfd": func() unix.Errno {
		fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		return e
	},
	"fsopen": func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_FSOPEN, 0, 0, 0)
		return e
	},
	"init_module": func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_INIT_MODULE, 0, 0, 0)
		return e
	},
	"process_vm_readv": func() unix.Errno {
		_, _, e := unix.Syscall6(unix.SYS_PROCESS_VM_READV, uintptr(unix.Getpid()), 0, 0, 0, 0, 0)
		return e
	},
	"socket-vsock": func() unix.Errno {
		fd, _, e := unix.Syscall(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		return e
	},
	"socket-inet": func() unix.Errno {
		fd, _, e := unix.Syscall(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		return e
	},
	"personality-0": func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_PERSONALITY, 0, 0, 0)
		return e
	},
	"personality-query": func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
		return e
	},
	"personality-0x40000": func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_PERSONALITY, 0x40000, 0, 0)
		return e
	},
	"getpid": func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_GETPID, 0, 0, 0)
		return e
	},
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: Apply drops capabilities the test must hold first")
	}
}

// runChild re-executes the test binary with action and policy and returns
// its key=value output.
func runChild(t *testing.T, policy, action string) map[string]string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envAction+"="+action, envPolicy+"="+policy)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s/%s: %v\n%s", policy, action, err, out)
	}
	kv := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = v
		}
	}
	return kv
}

func errnoOf(t *testing.T, kv map[string]string, probe string) unix.Errno {
	t.Helper()
	v, ok := kv[probe]
	if !ok {
		t.Fatalf("child printed no result for %s: %v", probe, kv)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", probe, v, err)
	}
	return unix.Errno(n)
}

func errnoName(e unix.Errno) string {
	if e == 0 {
		return "success"
	}
	return fmt.Sprintf("%s (%d)", unix.ErrnoName(e), int(e))
}

func TestConfinedSyscalls(t *testing.T) {
	requireRoot(t)
	want := map[string]unix.Errno{
		"mount":               unix.EPERM,
		"pivot_root":          unix.EPERM,
		"unshare-user":        unix.EPERM,
		"setns":               unix.EPERM,
		"clone-newns":         unix.EPERM,
		"clone3":              unix.ENOSYS,
		"keyctl":              unix.EPERM,
		"bpf":                 unix.EPERM,
		"perf_event_open":     unix.EPERM,
		"io_uring_setup":      unix.EPERM,
		"userfaultfd":         unix.EPERM,
		"fsopen":              unix.EPERM,
		"init_module":         unix.EPERM,
		"process_vm_readv":    unix.EPERM,
		"socket-vsock":        unix.EPERM,
		"socket-inet":         0,
		"personality-0":       0,
		"personality-query":   0,
		"personality-0x40000": unix.EPERM,
		"getpid":              0,
	}
	if len(want) != len(probes) {
		t.Fatalf("%d expectations for %d probes", len(want), len(probes))
	}
	// "seccomp-only" keeps every capability, so its denials prove the
	// filter alone blocks these calls; "default" is the real configuration.
	for _, policy := range []string{"default", "seccomp-only"} {
		t.Run(policy, func(t *testing.T) {
			kv := runChild(t, policy, "probes")
			for probe, w := range want {
				if got := errnoOf(t, kv, probe); got != w {
					t.Errorf("%s: got %s, want %s", probe, errnoName(got), errnoName(w))
				}
			}
		})
	}
}

// TestProbesUnconfined is the control for TestConfinedSyscalls: without the
// filter the same probes fail differently (or succeed), so the EPERMs above
// come from confinement and not from the probes' invalid arguments.
func TestProbesUnconfined(t *testing.T) {
	requireRoot(t)
	if s := ownStatus(t)["Seccomp"]; s != "0" {
		t.Skipf("test process already runs under seccomp mode %s; controls would be meaningless", s)
	}
	kv := runChild(t, "none", "probes")
	want := map[string]unix.Errno{
		"mount":               unix.ENOENT, // target does not exist
		"pivot_root":          unix.ENOENT,
		"unshare-user":        unix.EINVAL, // the Go process is multithreaded
		"setns":               unix.EBADF,
		"clone-newns":         0,
		"process_vm_readv":    0,           // zero iovecs: nothing to copy
		"clone3":              unix.EINVAL, // size 0
		"personality-0x40000": 0,
		"socket-inet":         0,
		"getpid":              0,
	}
	for probe, w := range want {
		if got := errnoOf(t, kv, probe); got != w {
			t.Errorf("unconfined %s: got %s, want %s", probe, errnoName(got), errnoName(w))
		}
	}
}

func TestConfinedThreadRunsPrograms(t *testing.T) {
	requireRoot(t)
	for _, policy := range []string{"default", "seccomp-without-nnp"} {
		t.Run(policy, func(t *testing.T) {
			kv := runChild(t, policy, "programs")
			if kv["true-exit"] != "0" || kv["true-error"] != "" {
				t.Errorf("/bin/true: exit %q, error %q", kv["true-exit"], kv["true-error"])
			}
			if kv["sh-out"] != strconv.Quote("ok\n") || kv["sh-err"] != "<nil>" {
				t.Errorf("/bin/sh -c 'echo ok': output %s, error %s", kv["sh-out"], kv["sh-err"])
			}
		})
	}
}

func ownStatus(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func hexMask(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		t.Fatalf("capability mask %q: %v", s, err)
	}
	return v
}

func TestConfinedStatus(t *testing.T) {
	requireRoot(t)
	own := ownStatus(t)
	def, err := CapMask(Default().Caps)
	if err != nil {
		t.Fatal(err)
	}
	// Capabilities this process does not hold cannot be kept.
	want := def & hexMask(t, own["CapBnd"]) & hexMask(t, own["CapPrm"])
	if want != def {
		t.Logf("test process lacks some default capabilities; expecting %#x instead of %#x", want, def)
	}

	check := func(t *testing.T, kv map[string]string, prefix string, wantInh uint64, nnp string) {
		t.Helper()
		for _, k := range []string{"CapBnd", "CapEff", "CapPrm"} {
			if got := hexMask(t, kv[prefix+"."+k]); got != want {
				t.Errorf("%s %s = %#x, want %#x (missing %v, extra %v)", prefix, k, got, want,
					CapNames(maskCaps(want&^got)), CapNames(maskCaps(got&^want)))
			}
		}
		if got := hexMask(t, kv[prefix+".CapInh"]); got != wantInh {
			t.Errorf("%s CapInh = %#x, want %#x", prefix, got, wantInh)
		}
		if got := hexMask(t, kv[prefix+".CapAmb"]); got != 0 {
			t.Errorf("%s CapAmb = %#x, want 0", prefix, got)
		}
		if kv[prefix+".NoNewPrivs"] != nnp {
			t.Errorf("%s NoNewPrivs = %q, want %s", prefix, kv[prefix+".NoNewPrivs"], nnp)
		}
		if kv[prefix+".Seccomp"] != "2" {
			t.Errorf("%s Seccomp = %q, want 2 (filter)", prefix, kv[prefix+".Seccomp"])
		}
	}

	t.Run("default", func(t *testing.T) {
		kv := runChild(t, "default", "status")
		check(t, kv, "thread", 0, "1")
		check(t, kv, "exec", 0, "1") // a process forked and exec'd from the thread
		if kv["other.tid"] == kv["thread.tid"] {
			t.Fatalf("other thread has the launcher's tid %s", kv["thread.tid"])
		}
		if kv["other.Seccomp"] != own["Seccomp"] || kv["other.NoNewPrivs"] != own["NoNewPrivs"] ||
			kv["other.CapBnd"] != own["CapBnd"] || kv["other.CapEff"] != own["CapEff"] {
			t.Errorf("another thread of the process was confined too: %v", kv)
		}
	})
	t.Run("seccomp-without-nnp", func(t *testing.T) {
		kv := runChild(t, "seccomp-without-nnp", "status")
		check(t, kv, "thread", 0, "0")
		check(t, kv, "exec", 0, "0")
	})
	t.Run("inheritable", func(t *testing.T) {
		kv := runChild(t, "inheritable", "status")
		check(t, kv, "thread", want, "1")
		check(t, kv, "exec", want, "1")
	})
}

func maskCaps(m uint64) []Cap {
	var cs []Cap
	for c := Cap(0); c <= maxCap; c++ {
		if m&(1<<uint(c)) != 0 {
			cs = append(cs, c)
		}
	}
	return cs
}

func TestApplyRejectsInvalidCap(t *testing.T) {
	// Validation happens before any change, so this is safe in-process.
	err := Apply(Policy{Caps: []Cap{CapChown, 64}})
	if err == nil || !strings.Contains(err.Error(), "check policy") || !strings.Contains(err.Error(), "invalid capability 64") {
		t.Fatalf("Apply with capability 64: err = %v, want a check policy error", err)
	}
}
