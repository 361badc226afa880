// Command attackprobe runs inside a sandbox and tries, one by one, the
// kernel-facing attacks of den's threat list (mounting, new namespaces,
// keyrings, bpf, perf, raw and packet sockets, io_uring, vsock, ptrace,
// writing through /proc, file handles, reading a host path). It prints one
// line per attempt: "NAME failed ERRNO-NAME (message)" or "NAME ALLOWED".
// The errno is printed by name (EPERM, EACCES, ENOENT...) so that the tests
// can tell a refusal from a target that is simply absent: each attack in
// the tests names the errno it expects on each tier. The end-to-end tests
// build it statically and run it on every isolation tier. Never run it on
// a host: there every attempt is meant to work.
package main

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	hostPath := ""
	if len(os.Args) > 1 {
		hostPath = os.Args[1]
	}
	try := func(name string, f func() error) {
		if err := f(); err != nil {
			fmt.Printf("%s failed %s (%v)\n", name, errnoName(err), err)
		} else {
			fmt.Printf("%s ALLOWED\n", name)
		}
	}
	try("mount", func() error {
		os.MkdirAll("/tmp/probe-mnt", 0o755)
		return unix.Mount("probe", "/tmp/probe-mnt", "tmpfs", 0, "")
	})
	try("unshare-user", func() error { return unix.Unshare(unix.CLONE_NEWUSER) })
	try("unshare-mount", func() error { return unix.Unshare(unix.CLONE_NEWNS) })
	try("unshare-net", func() error { return unix.Unshare(unix.CLONE_NEWNET) })
	try("cgroup-mount", func() error {
		os.MkdirAll("/tmp/probe-cg", 0o755)
		return unix.Mount("cgroup", "/tmp/probe-cg", "cgroup", 0, "rdma")
	})
	try("keyring", func() error {
		_, err := unix.KeyctlJoinSessionKeyring("probe")
		return err
	})
	try("add-key", func() error {
		_, err := unix.AddKey("user", "probe", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
		return err
	})
	try("bpf", func() error {
		// BPF_MAP_CREATE of a one-entry array.
		attr := [5]uint32{2, 4, 4, 1, 0}
		fd, _, errno := unix.Syscall(unix.SYS_BPF, 0, uintptr(unsafe.Pointer(&attr[0])), unsafe.Sizeof(attr))
		if errno != 0 {
			return errno
		}
		unix.Close(int(fd))
		return nil
	})
	try("perf", func() error {
		attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK, Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{}))}
		fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	})
	try("raw-socket", func() error { return sock(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP) })
	try("packet-socket", func() error { return sock(unix.AF_PACKET, unix.SOCK_RAW, 0x0300) })
	try("io_uring", func() error {
		var params [120]byte
		fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])), 0)
		if errno != 0 {
			return errno
		}
		unix.Close(int(fd))
		return nil
	})
	try("vsock-host", func() error {
		fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Connect(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_HOST, Port: 1024})
	})
	try("ptrace-init", func() error {
		err := unix.PtraceAttach(1)
		if err == nil {
			unix.PtraceDetach(1)
		}
		return err
	})
	try("write-proc-exe", func() error {
		f, err := os.OpenFile("/proc/1/exe", os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.Write([]byte("#!"))
		return err
	})
	try("write-self-mem-of-init", func() error {
		f, err := os.OpenFile("/proc/1/mem", os.O_RDWR, 0)
		if err != nil {
			return err
		}
		return f.Close()
	})
	try("sysrq", func() error {
		return os.WriteFile("/proc/sysrq-trigger", []byte("h"), 0)
	})
	try("syslog-read", func() error {
		// What /dev/kmsg would give: the kernel's log (SYSLOG_ACTION_READ_ALL).
		buf := make([]byte, 4096)
		_, err := unix.Klogctl(3, buf)
		return err
	})
	try("open-by-handle", func() error {
		h := unix.NewFileHandle(1, []byte{2, 0, 0, 0, 0, 0, 0, 0})
		fd, err := unix.OpenByHandleAt(unix.AT_FDCWD, h, unix.O_RDONLY)
		if err == nil {
			unix.Close(fd)
		}
		return err
	})
	try("mknod-disk", func() error {
		return unix.Mknod("/tmp/probe-sda", unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0)))
	})
	try("kernel-module", func() error {
		_, _, errno := unix.Syscall(unix.SYS_FINIT_MODULE, 0, 0, 0)
		if errno != 0 {
			return errno
		}
		return nil
	})
	try("reboot", func() error { return unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF) })
	try("settime", func() error {
		// Sets the clock to what it reads (harmless if it ever got through).
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return err
		}
		_, _, errno := unix.Syscall(unix.SYS_CLOCK_SETTIME, unix.CLOCK_REALTIME, uintptr(unsafe.Pointer(&ts)), 0)
		if errno != 0 {
			return errno
		}
		return nil
	})
	if hostPath != "" {
		try("read-host-file", func() error {
			_, err := os.ReadFile(hostPath)
			return err
		})
		try("read-host-file-via-proc-root", func() error {
			_, err := os.ReadFile("/proc/1/root" + hostPath)
			return err
		})
	}
}

// errnoName names the errno inside err ("EPERM"), or "NOERRNO" when err
// carries none (a probe that fails that way proves nothing).
func errnoName(err error) string {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return "NOERRNO"
	}
	if n := unix.ErrnoName(errno); n != "" {
		return n
	}
	return fmt.Sprintf("errno%d", int(errno))
}

func sock(domain, typ, proto int) error {
	fd, err := unix.Socket(domain, typ, proto)
	if err == nil {
		unix.Close(fd)
	}
	return err
}
