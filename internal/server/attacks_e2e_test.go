package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/testenv/e2e"
)

// TestTierAttacks runs the threat list of ../shared/ANCHORS.md that concerns
// the isolation boundary against every tier this machine runs: kernel
// attack surface (a static probe tries mounting, namespaces, keyrings, bpf,
// perf, raw and packet sockets, io_uring, vsock, ptrace, /proc writes, file
// handles, device nodes, modules, reboot, the clock and a host file), the
// file API (symlinks, "..", hardlinks), seeing host processes, and a fork
// bomb. Each attempt must fail inside the sandbox while the host and a
// bystander sandbox stay untouched.
func TestTierAttacks(t *testing.T) {
	e := newTierEnv(t)
	probe := filepath.Join(t.TempDir(), "attackprobe")
	build := exec.Command("go", "build", "-o", probe, "./testdata/attackprobe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the probe: %v\n%s", err, out)
	}
	probeBin, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	// A host file no sandbox may read.
	secret := make([]byte, 8)
	rand.Read(secret)
	hostFile := filepath.Join("/var/tmp", "den-attack-"+hex.EncodeToString(secret))
	if err := os.WriteFile(hostFile, []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(hostFile) })
	passwd := fileHash(t, "/etc/passwd")
	img := e2e.BusyboxImage(t, e.c)
	bystander := e.create(t, api.CreateRequest{})

	for _, tier := range []string{"linux", "gvisor", "microvm"} {
		t.Run(tier, func(t *testing.T) {
			e.need(t, tier)
			if tier == "gvisor" && dynamicSelf(t) {
				// The agent is this binary; a busybox root has no ld.so.
				t.Skip("the test binary is dynamically linked: run with CGO_ENABLED=0 (as .ci/run does)")
			}
			ctx := context.Background()
			sb := e.create(t, api.CreateRequest{Runtime: tier, Image: img, Limits: api.Limits{Pids: 64}})
			defer e.c.Remove(ctx, sb.ID, true)

			// Kernel attack surface.
			if _, err := e.c.WriteFile(ctx, sb.ID, "/tmp/attackprobe", bytes.NewReader(probeBin), 0o755); err != nil {
				t.Fatal(err)
			}
			res, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"/tmp/attackprobe", hostFile}, Timeout: api.Duration(60 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			out := string(res.Stdout)
			if res.ExitCode != 0 {
				t.Fatalf("probe ran badly (exit %d):\n%s\n%s", res.ExitCode, out, res.Stderr)
			}
			checkProbe(t, tier, out)
			t.Logf("%s probe:\n%s", tier, out)

			// The file API stays inside: symlinks, "..", hardlinks.
			name := "den-attack-" + hex.EncodeToString(secret[:4])
			e.sh(t, sb.ID, "ln -s /etc /tmp/esc; ln /etc/passwd /tmp/hl 2>/dev/null || cp /etc/passwd /tmp/hl")
			for _, p := range []string{"/tmp/esc/" + name, "/../../../../../etc/" + name, "/tmp/../../etc/" + name} {
				e.c.WriteFile(ctx, sb.ID, p, strings.NewReader("x"), 0o644)
			}
			e.c.WriteFile(ctx, sb.ID, "/tmp/hl", strings.NewReader("root:x:0:0:root:/root:/bin/sh\nden-attack:x:1:1::/:/bin/sh\n"), 0o644)
			if _, err := os.Stat("/etc/" + name); err == nil {
				os.Remove("/etc/" + name)
				t.Fatalf("%s: a file API write reached the host's /etc", tier)
			}
			if fileHash(t, "/etc/passwd") != passwd {
				t.Fatalf("%s: the host's /etc/passwd changed", tier)
			}
			// The image's own file is untouched: a new sandbox of it sees the original.
			witness := e.create(t, api.CreateRequest{Image: img})
			if r := e.sh(t, witness.ID, "cat /etc/passwd"); strings.Contains(string(r.Stdout), "den-attack") {
				t.Fatalf("%s: a write through a hardlink changed the image for other sandboxes", tier)
			}
			e.c.Remove(ctx, witness.ID, true)

			// No host process is visible: only the sandbox's own few.
			ps := e.sh(t, sb.ID, "ls /proc | grep -c '^[0-9]'; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
			self := filepath.Base(os.Args[0])
			if strings.Contains(string(ps.Stdout), self) || strings.Contains(string(ps.Stdout), "runsc") || strings.Contains(string(ps.Stdout), "qemu") {
				t.Fatalf("%s: host processes visible inside:\n%s", tier, ps.Stdout)
			}

			// A fork bomb is held at the pids limit; the bystander answers.
			done := make(chan struct{})
			go func() {
				defer close(done)
				e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: `b() { b | b & }; b; while :; do b 2>/dev/null; sleep 0.01; done`, Timeout: api.Duration(4 * time.Second)})
			}()
			time.Sleep(time.Second)
			for i := 0; i < 3; i++ {
				start := time.Now()
				if r := e.sh(t, bystander.ID, "echo alive"); string(r.Stdout) != "alive\n" {
					t.Fatalf("bystander during a %s fork bomb: %q", tier, r.Stdout)
				}
				if d := time.Since(start); d > 5*time.Second {
					t.Fatalf("bystander took %v during a %s fork bomb", d, tier)
				}
			}
			<-done
			// The attacked sandbox kept running through the bomb: a kill of
			// the bomb's exec ends what it left forking (its shell ends when
			// a fork fails), and it answers at once.
			procs, err := e.c.Processes(ctx, sb.ID)
			if err != nil {
				t.Fatalf("%s: list processes after the fork bomb: %v", tier, err)
			}
			for _, p := range procs {
				if strings.Contains(strings.Join(p.Cmd, " "), "b() {") {
					if err := e.c.Kill(ctx, sb.ID, p.ID, "KILL"); err != nil && !errors.Is(err, api.ErrConflict) {
						t.Fatalf("%s: kill the fork bomb: %v", tier, err)
					}
				}
			}
			if got, err := e.c.Get(ctx, sb.ID); err != nil || got.State != api.StateRunning {
				t.Fatalf("%s: after a fork bomb the sandbox is %v (%v), want running", tier, got, err)
			}
			if r := e.sh(t, sb.ID, "echo alive"); string(r.Stdout) != "alive\n" {
				t.Fatalf("%s sandbox does not answer after a fork bomb: %q %q", tier, r.Stdout, r.Stderr)
			}
			// It is still usable after a restart.
			if _, err := e.c.Stop(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.Start(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			if r := e.sh(t, sb.ID, "echo recovered"); string(r.Stdout) != "recovered\n" {
				t.Fatalf("%s sandbox unusable after the attacks: %q %q", tier, r.Stdout, r.Stderr)
			}
		})
	}
}

// dynamicSelf reports whether the running binary needs an ELF interpreter.
func dynamicSelf(t *testing.T) bool {
	f, err := elf.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

func fileHash(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// probeExpect names, for every attack of testdata/attackprobe, the errno
// that shows it was refused, per tier where the tiers differ ("" is every
// tier). A refusal must be the one expected: an attack that fails with
// another errno (ENOENT above all: the target was absent, so nothing was
// tried) is a defect of the test or of den and fails the test. ENOENT is
// expected only where absence is the defence itself, and says so.
var probeExpect = map[string]map[string]string{
	"mount":         {"": "EPERM"},
	"unshare-user":  {"": "EPERM"},
	"unshare-mount": {"": "EPERM"},
	"unshare-net":   {"": "EPERM"},
	"cgroup-mount":  {"": "EPERM"},
	"keyring":       {"": "EPERM"},
	"add-key":       {"": "EPERM"},
	"bpf":           {"": "EPERM"},
	"perf":          {"": "EPERM"},
	"raw-socket":    {"": "EPERM"},
	"packet-socket": {"": "EPERM"},
	"io_uring":      {"": "EPERM"},
	"vsock-host":    {"": "EPERM"},
	"ptrace-init":   {"": "EPERM"},
	// The agent is not dumpable: its /proc entries belong to root of the
	// host side and refuse the sandbox's root.
	"write-proc-exe":         {"": "EACCES"},
	"write-self-mem-of-init": {"": "EACCES"},
	// The linux tier and the microVM guest mount /proc/sysrq-trigger
	// read-only; gVisor's sentry answers a write with EIO (it has no
	// sysrq). A host kernel without CONFIG_MAGIC_SYSRQ has no file at all:
	// sysrqExpect corrects the linux tier's row from the host.
	"sysrq":          {"linux": "EROFS", "microvm": "EROFS", "gvisor": "EIO"},
	"syslog-read":    {"": "EPERM"},
	"open-by-handle": {"": "EPERM"},
	"mknod-disk":     {"": "EPERM"},
	"kernel-module":  {"": "EPERM"},
	"reboot":         {"": "EPERM"},
	"settime":        {"": "EPERM"},
	// The file exists on the host (the test made it): the sandbox's mount
	// namespace has no such path, which is the defence; /proc/1/root (the
	// agent's root, not dumpable) refuses the sandbox's root outright.
	"read-host-file":               {"": "ENOENT"},
	"read-host-file-via-proc-root": {"": "EACCES"},
}

// checkProbe compares the probe's output on tier with probeExpect: every
// attack ran, none was allowed, each failed with the errno it names.
func checkProbe(t *testing.T, tier, out string) {
	t.Helper()
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			t.Errorf("%s: unreadable probe line %q", tier, l)
			continue
		}
		name := f[0]
		want, ok := probeExpect[name][tier]
		if !ok {
			want, ok = probeExpect[name][""]
		}
		if name == "sysrq" && tier == "linux" {
			if _, err := os.Stat("/proc/sysrq-trigger"); os.IsNotExist(err) {
				want = "ENOENT" // this host's kernel has no sysrq at all
			}
		}
		seen[name] = true
		switch {
		case !ok:
			t.Errorf("%s: the probe tried %q, which probeExpect does not name", tier, name)
		case f[1] == "ALLOWED":
			t.Errorf("%s: %s was ALLOWED inside the sandbox", tier, name)
		case len(f) < 3 || f[1] != "failed" || f[2] != want:
			t.Errorf("%s: %s should be refused with %s, got: %s", tier, name, want, l)
		}
	}
	for name := range probeExpect {
		if !seen[name] {
			t.Errorf("%s: the probe did not try %s", tier, name)
		}
	}
}
