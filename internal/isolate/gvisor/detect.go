package gvisor

import (
	"bytes"
	"context"
	"fmt"
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
	Reason  string
	Runsc   string // absolute path of runsc
	Version string // runsc's version line, e.g. "0.0~20221219.0"
	// Platform is the platform chosen ("systrap", "kvm" or "ptrace"),
	// PlatformReason why.
	Platform       string
	PlatformReason string
	// Platforms lists what this runsc offers.
	Platforms []string
	// flags are runsc's known global flags (without "-").
	flags map[string]bool
}

// kvmProbeTimeout bounds the trial boot on the KVM platform: on hosts
// whose /dev/kvm is a nested or paravirtual hypervisor, gVisor's KVM
// guests hang rather than fail.
const kvmProbeTimeout = 3 * time.Second

// Detect finds runsc (runscPath, or "runsc" on PATH when empty), its
// version and platforms, and chooses a platform: systrap where this runsc
// has it, else kvm if /dev/kvm really runs a gVisor sandbox (a trial boot
// of at most 3 s), else ptrace.
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
	case has("systrap"):
		in.Platform, in.PlatformReason = "systrap", "runsc "+in.Version+" has systrap, the fastest platform that needs no hardware virtualization"
	case has("kvm"):
		if err := probeKVM(p); err != nil {
			in.Platform, in.PlatformReason = "ptrace", fmt.Sprintf("runsc %s has no systrap, and kvm does not work here (%v)", in.Version, err)
		} else {
			in.Platform, in.PlatformReason = "kvm", fmt.Sprintf("runsc %s has no systrap, and a trial boot on /dev/kvm succeeded", in.Version)
		}
	default:
		in.Platform, in.PlatformReason = "ptrace", fmt.Sprintf("runsc %s has neither systrap nor kvm", in.Version)
	}
	in.Available = true
	return in
}

// kvmProbed keeps each runsc's KVM probe result for the process's life.
var kvmProbed struct {
	sync.Mutex
	m map[string]error
}

// probeKVM boots `true` on the KVM platform, once per runsc binary.
func probeKVM(runsc string) error {
	kvmProbed.Lock()
	defer kvmProbed.Unlock()
	if err, ok := kvmProbed.m[runsc]; ok {
		return err
	}
	if kvmProbed.m == nil {
		kvmProbed.m = map[string]error{}
	}
	err := probeKVMOnce(runsc)
	kvmProbed.m[runsc] = err
	return err
}

// probeKVMOnce boots `true` on the KVM platform, in a scratch state
// directory, and kills whatever is left after kvmProbeTimeout.
func probeKVMOnce(runsc string) error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open /dev/kvm: %w", err)
	}
	f.Close()
	root, err := os.MkdirTemp("", "den-kvm-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	ctx, cancel := context.WithTimeout(context.Background(), kvmProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, runsc, "--root", root, "--platform=kvm", "--network=none", "--ignore-cgroups", "do", "-quiet", "true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	// Whatever the sandbox left (it may have left the process group).
	cleanupRoot(runsc, root)
	if ctx.Err() != nil {
		return fmt.Errorf("a trial sandbox on /dev/kvm did not finish in %v (a nested hypervisor?)", kvmProbeTimeout)
	}
	if err != nil {
		return fmt.Errorf("a trial sandbox on /dev/kvm failed: %v: %s", err, tail(out, 200))
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
