package gvisor

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Info is what Detect found out about the host's gVisor.
type Info struct {
	// Available: boxes can run (runsc found, and root).
	Available bool
	// Reason says why the tier is unavailable, as a sentence a user can
	// act on.
	Reason string
	Runsc  string // absolute path of runsc
	// Version is runsc's version line, e.g. "0.0~20221219.0" (Debian's),
	// or for a runsc built by go install (which says VERSION_MISSING) its
	// module's version, e.g. "v0.0.0-20260905035102-160fafc42237".
	Version string
	// Platform is the platform chosen ("systrap", "kvm" or "ptrace"),
	// PlatformReason why.
	Platform       string
	PlatformReason string
	// Platforms lists what this runsc offers.
	Platforms []string
	// SavesTCP: this runsc's checkpoint saves a netstack that has had TCP
	// connections (runsc from 2023 on; open ones are reset in a copy
	// restored elsewhere). Debian's 2022 runsc refuses such a checkpoint
	// ("connected state") and the sandbox ends.
	SavesTCP bool
	// flags are runsc's known global flags (without "-").
	flags map[string]bool
}

// probeTimeout bounds a trial boot on a platform: on hosts whose
// /dev/kvm is a nested or paravirtual hypervisor, gVisor's KVM guests hang
// rather than fail. (A trial boot takes about 0.2 s.)
var probeTimeout = map[string]time.Duration{"kvm": 3 * time.Second, "systrap": 10 * time.Second}

// Detect finds runsc (runscPath, or "runsc" on PATH when empty), its
// version and platforms, and chooses a platform: systrap where this runsc
// has it and a trial boot on it succeeds (it needs seccomp's
// SECCOMP_RET_TRAP and a kernel that lets the sentry stub processes
// run), else kvm if /dev/kvm really runs a gVisor sandbox (a trial boot
// of at most 3 s), else ptrace. Trial boots run once per binary and
// process.
func Detect(runscPath string) Info {
	return detect(runscPath, "")
}

// detect is Detect with a platform forced by configuration (checked to
// exist, not probed).
func detect(runscPath, platform string) Info {
	var in Info
	if runscPath == "" {
		runscPath = "runsc"
	}
	p, err := exec.LookPath(runscPath)
	if err != nil {
		in.Reason = fmt.Sprintf("runsc not found (%v): install gVisor (apt-get install runsc) or set the runsc path", err)
		return in
	}
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	in.Runsc = p
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "--version").Output()
	if err != nil {
		in.Reason = fmt.Sprintf("%s --version failed (%v): reinstall gVisor (apt-get install --reinstall runsc)", p, err)
		return in
	}
	line, _, _ := strings.Cut(string(out), "\n")
	in.Version = strings.TrimSpace(strings.TrimPrefix(line, "runsc version "))
	if bi, err := buildinfo.ReadFile(p); err == nil && bi.Main.Path == "gvisor.dev/gvisor" && (in.Version == "" || in.Version == "VERSION_MISSING") {
		in.Version = bi.Main.Version // built by go install
	}
	if interp := elfInterp(p); interp != "" {
		// Its sandbox and gofer re-execute /proc/self/exe in a chroot
		// holding only /proc, where the loader is missing: runsc fails with
		// "error executing umounter: fork/exec /proc/self/exe: no such file
		// or directory".
		in.Reason = fmt.Sprintf("%s is dynamically linked (loader %s; a go install with cgo): gVisor re-executes it in an empty chroot, where it cannot load; rebuild it with CGO_ENABLED=0 (scripts/deps.sh does)", p, interp)
		return in
	}
	out, _ = exec.CommandContext(ctx, p, "help", "platforms").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.Contains(l, " ") {
			in.Platforms = append(in.Platforms, l)
		}
	}
	in.flags = map[string]bool{}
	var ferr bytes.Buffer
	fc := exec.CommandContext(ctx, p, "flags")
	fc.Stderr = &ferr
	fo, _ := fc.Output()
	for _, l := range strings.Split(string(fo)+ferr.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "-") {
			in.flags[strings.TrimLeft(f[0], "-")] = true
		}
	}
	if len(in.Platforms) == 0 {
		in.Platforms = []string{"ptrace"}
	}
	// The flags that came with netstack save/restore.
	in.SavesTCP = in.flags["allow-live-tcp-migration"] || in.flags["save-restore-netstack"]
	if os.Geteuid() != 0 {
		in.Reason = "the gvisor tier needs root (run den serve as root)"
		return in
	}
	has := func(name string) bool {
		for _, pl := range in.Platforms {
			if pl == name {
				return true
			}
		}
		return false
	}
	switch {
	case platform != "":
		if !has(platform) {
			in.Reason = fmt.Sprintf("runsc %s has no platform %q (it has %s)", in.Version, platform, strings.Join(in.Platforms, ", "))
			return in
		}
		in.Platform, in.PlatformReason = platform, "set by configuration"
	default:
		// Why each faster platform was passed over.
		var why []string
		if !has("systrap") {
			why = append(why, "no systrap")
		} else if err := probe(p, "systrap"); err != nil {
			why = append(why, fmt.Sprintf("systrap does not work here (%v)", err))
		} else {
			in.Platform, in.PlatformReason = "systrap", "runsc "+in.Version+" has systrap, the fastest platform that needs no hardware virtualization, and a trial boot on it succeeded"
			break
		}
		if !has("kvm") {
			why = append(why, "no kvm")
		} else if err := probe(p, "kvm"); err != nil {
			why = append(why, fmt.Sprintf("kvm does not work here (%v)", err))
		} else {
			in.Platform, in.PlatformReason = "kvm", fmt.Sprintf("runsc %s: %s, and a trial boot on /dev/kvm succeeded", in.Version, strings.Join(why, "; "))
			break
		}
		in.Platform, in.PlatformReason = "ptrace", fmt.Sprintf("runsc %s: %s", in.Version, strings.Join(why, "; "))
	}
	in.Available = true
	return in
}

// elfInterp is the program interpreter (dynamic loader) an ELF binary
// asks for, "" for a static one (or what is not ELF: running it says).
func elfInterp(path string) string {
	f, err := elf.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, _ := io.ReadAll(io.LimitReader(p.Open(), 4096))
			return strings.TrimRight(string(b), "\x00")
		}
	}
	return ""
}

// probed keeps each runsc's and platform's probe result for the
// process's life.
var probed struct {
	sync.Mutex
	m map[[2]string]error
}

// probe boots `true` on a platform, once per runsc binary and platform.
func probe(runsc, platform string) error {
	probed.Lock()
	defer probed.Unlock()
	k := [2]string{runsc, platform}
	if err, ok := probed.m[k]; ok {
		return err
	}
	if probed.m == nil {
		probed.m = map[[2]string]error{}
	}
	err := probeOnce(runsc, platform)
	probed.m[k] = err
	return err
}

// probeOnce boots `true` on a platform, in a scratch state directory, and
// kills whatever is left after the platform's probeTimeout.
func probeOnce(runsc, platform string) error {
	if platform == "kvm" {
		f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("open /dev/kvm: %w", err)
		}
		f.Close()
	}
	root, err := os.MkdirTemp("", "den-"+platform+"-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	timeout := probeTimeout[platform]
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, runsc, "--root", root, "--platform="+platform, "--network=none", "--ignore-cgroups", "do", "-quiet", "true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	// Whatever the sandbox left (it may have left the process group).
	cleanupRoot(runsc, root)
	if ctx.Err() != nil {
		if platform == "kvm" {
			return fmt.Errorf("a trial sandbox on /dev/kvm did not finish in %v (a nested hypervisor?)", timeout)
		}
		return fmt.Errorf("a trial sandbox on %s did not finish in %v", platform, timeout)
	}
	if err != nil {
		return fmt.Errorf("a trial sandbox on %s failed: %v: %s", platform, err, tail(out, 200))
	}
	return nil
}

// cleanupRoot force-deletes every container under a runsc state root.
func cleanupRoot(runsc, root string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, runsc, "--root", root, "list", "-quiet").Output()
	for _, id := range strings.Fields(string(out)) {
		exec.CommandContext(ctx, runsc, "--root", root, "delete", "--force", id).Run()
	}
}

// tail is the last n bytes of b, from a line start where possible,
// trimmed.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 && i < len(b)-1 {
			b = b[i+1:]
		}
	}
	return strings.TrimSpace(string(b))
}
