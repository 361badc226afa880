package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/testenv"
	"github.com/den-dev/den/internal/testenv/e2e"
)

// TestServeLeaksNoDescriptors runs the real den binary as a daemon started
// the way `(exec 7</some/host/dir; den serve)` would be: with a directory,
// a file, a unix socket and a pipe open without close-on-exec (fds 7 to
// 10), and a hard open-files limit of fs.nr_open. On every tier this host
// runs, a command must hold only its standard streams, no process on the
// host besides the daemon may hold one of the four (a sandbox's init,
// runsc's sandbox and gofer, QEMU), and a command's open-files limit is
// agent.FileLimit, soft and hard.
func TestServeLeaksNoDescriptors(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, as den serve does")
	}
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox not installed (apt-get install busybox-static)")
	}
	tmp := t.TempDir()

	// The four descriptors: a host directory, a file in it, a listening
	// unix socket and the read end of a pipe.
	hostDir := filepath.Join(tmp, "host")
	os.Mkdir(hostDir, 0o700)
	if err := os.WriteFile(filepath.Join(hostDir, "secret"), []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dirF, err := os.Open(hostDir)
	if err != nil {
		t.Fatal(err)
	}
	fileF, err := os.OpenFile(filepath.Join(hostDir, "secret"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(tmp, "s.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sockF, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	pipeR, pipeW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pipeW.Close()
	extra := []*os.File{dirF, fileF, sockF, pipeR}
	type ident struct{ dev, ino uint64 }
	leaked := map[ident]string{}
	for _, f := range extra {
		var st syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		leaked[ident{st.Dev, st.Ino}] = f.Name()
	}

	// A hard limit far above agent.FileLimit, so that a linux-tier
	// sandbox that kept the daemon's shows. (Raising it needs
	// CAP_SYS_RESOURCE, which some hosts withhold from root: then the
	// linux tier keeps the lower of the two.)
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	nrOpen, err := os.ReadFile("/proc/sys/fs/nr_open")
	if err != nil {
		t.Fatal(err)
	}
	high, _ := strconv.ParseUint(strings.TrimSpace(string(nrOpen)), 10, 64)
	linuxLimit := uint64(agent.FileLimit)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: high, Max: high}); err == nil {
		defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	} else if lim.Max < linuxLimit {
		linuxLimit = lim.Max
		t.Logf("cannot raise the open-files limit (%v): linux-tier commands keep the daemon's %d", err, lim.Max)
	}
	d := newDaemonWith(t, func(d *daemon) {
		d.runtimes, d.storage = "linux,gvisor,microvm", "dir"
		d.args = []string{"--default-memory", "512m", "--default-pids", "512"}
		d.files = append([]*os.File{nil, nil, nil, nil}, extra...) // fds 7 to 10
	})
	daemon := d.proc.cmd.Process.Pid
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("den serve's log:\n%s", d.logText())
		}
	})
	for _, f := range extra {
		f.Close()
	}
	c, ctx := d.c, context.Background()
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e2e.BusyboxImage(t, c)

	// What a command holds: the shell's own descriptors, listed by
	// another process (so the listing's directory is not among them; by
	// path, so busybox's shell execs it rather than running it in
	// process), with nothing redirected (the shell would keep the saved
	// streams); and its open-files limits.
	const probe = `/bin/busybox ls /proc/$$/fd; echo --; /bin/busybox ls -l /proc/$$/fd; echo "limits $(ulimit -Sn) $(ulimit -Hn)"`
	for _, rt := range info.Runtimes {
		t.Run(rt.Name, func(t *testing.T) {
			testenv.Tier(t, rt.Name)
			if !rt.Available {
				testenv.Unavailable(t, rt.Name, rt.Reason)
			}
			sb, err := c.Create(ctx, api.CreateRequest{Image: "busybox", Runtime: rt.Name})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			defer c.Remove(ctx, sb.ID, true)
			for _, user := range []string{"", "65534"} {
				res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: probe, User: user, Timeout: api.Duration(time.Minute)})
				if err != nil {
					t.Fatal(err)
				}
				fds, _, ok := strings.Cut(string(res.Stdout), "--\n")
				if res.ExitCode != 0 || !ok {
					t.Fatalf("probe as user %q: %+v", user, res)
				}
				if got := strings.Fields(fds); !slices.Equal(got, []string{"0", "1", "2"}) {
					t.Errorf("as user %q a command holds descriptors %v, want 0 1 2:\n%s", user, got, res.Stdout)
				}
				want := fmt.Sprintf("limits %d %d", agent.FileLimit, agent.FileLimit)
				if rt.Name == "linux" {
					want = fmt.Sprintf("limits %d %d", linuxLimit, linuxLimit)
				}
				if !strings.Contains(string(res.Stdout), want+"\n") {
					t.Errorf("as user %q open-files limits are not %q:\n%s", user, want, res.Stdout)
				}
			}
			// On the host: nothing but the daemon holds them (the init,
			// the agent, runsc's processes, QEMU).
			if ents, err := os.ReadDir("/proc"); err == nil {
				for _, e := range ents {
					pid, err := strconv.Atoi(e.Name())
					if err != nil || pid == daemon || pid == os.Getpid() {
						continue
					}
					fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
					for _, fd := range fds {
						var st syscall.Stat_t
						if syscall.Stat(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()), &st) != nil {
							continue
						}
						if name, ok := leaked[ident{st.Dev, st.Ino}]; ok {
							comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
							t.Errorf("host process %d (%s) holds the daemon's inherited %s as fd %s", pid, strings.TrimSpace(string(comm)), name, fd.Name())
						}
					}
				}
			}
		})
	}
}
