package microvm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Info is what Detect found: whether the tier can run here, with what,
// and why.
type Info struct {
	Available bool
	// Reason explains an unavailable tier and what to do about it.
	Reason      string
	QEMU        string // path of qemu-system-x86_64
	QEMUVersion string // e.g. "7.2.22"
	Kernel      string // path of the guest kernel
	KernelVer   string // its release, naming /lib/modules/<release>
	Accel       string // "kvm" or "tcg"
	// AccelReason says why that accelerator was chosen.
	AccelReason string
}

// installHint is what to install for the tier.
const installHint = "apt-get install qemu-system-x86 linux-image-cloud-amd64 erofs-utils e2fsprogs"

// kvmProbeTimeout bounds the probe boot under KVM: a working KVM reaches
// the probe's kernel panic in well under a second.
const kvmProbeTimeout = 10 * time.Second

// Detect finds QEMU and a guest kernel and chooses the accelerator. The
// KVM probe (a guest boot with a timeout) runs once; its verdict is cached
// in cfg.StateDir, keyed by the kernel, QEMU and host kernel.
func Detect(ctx context.Context, cfg Config) Info {
	cfg.defaults()
	var info Info
	q, err := exec.LookPath(cfg.QEMU)
	if err != nil {
		info.Reason = fmt.Sprintf("QEMU (%s) not found: %s", cfg.QEMU, installHint)
		return info
	}
	info.QEMU = q
	out, err := exec.CommandContext(ctx, q, "-version").Output()
	if err != nil {
		info.Reason = fmt.Sprintf("%s -version: %v", q, err)
		return info
	}
	if m := regexp.MustCompile(`version (\d+\.\d+(\.\d+)?)`).FindSubmatch(out); m != nil {
		info.QEMUVersion = string(m[1])
	}
	k, ver, err := locateKernel(cfg.Kernel)
	if err != nil {
		info.Reason = err.Error()
		return info
	}
	info.Kernel, info.KernelVer = k, ver
	for _, tool := range []string{"mkfs.erofs", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			info.Reason = fmt.Sprintf("%s not found: %s", tool, installHint)
			return info
		}
	}
	info.Accel, info.AccelReason = chooseAccel(ctx, cfg, info)
	info.Available = true
	return info
}

// locateKernel returns the guest kernel and its release: kernel if set,
// else the newest /boot/vmlinuz-* that has modules in /lib/modules,
// cloud kernels first.
func locateKernel(kernel string) (path, release string, err error) {
	hasMods := func(rel string) bool {
		_, err := os.Stat(filepath.Join("/lib/modules", rel, "modules.dep"))
		return err == nil
	}
	if kernel != "" {
		if _, err := os.Stat(kernel); err != nil {
			return "", "", fmt.Errorf("guest kernel: %w", err)
		}
		rel := strings.TrimPrefix(filepath.Base(kernel), "vmlinuz-")
		if !hasMods(rel) {
			return "", "", fmt.Errorf("guest kernel %s: no modules in /lib/modules/%s", kernel, rel)
		}
		return kernel, rel, nil
	}
	cands, _ := filepath.Glob("/boot/vmlinuz-*")
	var ok []string
	for _, c := range cands {
		if hasMods(strings.TrimPrefix(filepath.Base(c), "vmlinuz-")) {
			ok = append(ok, c)
		}
	}
	if len(ok) == 0 {
		return "", "", fmt.Errorf("no guest kernel: no /boot/vmlinuz-* with modules in /lib/modules: %s", installHint)
	}
	sort.Slice(ok, func(i, j int) bool {
		ci, cj := strings.Contains(ok[i], "cloud"), strings.Contains(ok[j], "cloud")
		if ci != cj {
			return ci
		}
		return ok[i] > ok[j]
	})
	return ok[0], strings.TrimPrefix(filepath.Base(ok[0]), "vmlinuz-"), nil
}

type accelVerdict struct {
	Key    string `json:"key"`
	Accel  string `json:"accel"`
	Reason string `json:"reason"`
}

func chooseAccel(ctx context.Context, cfg Config, info Info) (string, string) {
	switch cfg.Accel {
	case "kvm", "tcg":
		return cfg.Accel, "set in the configuration"
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg", fmt.Sprintf("no usable /dev/kvm (%v); using TCG", err)
	}
	f.Close()
	var uts unix.Utsname
	unix.Uname(&uts)
	st, _ := os.Stat(info.Kernel)
	var mt int64
	if st != nil {
		mt = st.ModTime().UnixNano()
	}
	h := sha256.Sum256([]byte(fmt.Sprintf("%s|%d|%s|%s|%s", info.Kernel, mt, info.QEMUVersion,
		unix.ByteSliceToString(uts.Release[:]), unix.ByteSliceToString(uts.Version[:]))))
	key := hex.EncodeToString(h[:8])
	cache := filepath.Join(cfg.StateDir, "accel.json")
	var v accelVerdict
	if b, err := os.ReadFile(cache); err == nil && json.Unmarshal(b, &v) == nil && v.Key == key {
		return v.Accel, v.Reason
	}
	v = accelVerdict{Key: key}
	if d, err := probeKVM(ctx, info); err == nil {
		v.Accel, v.Reason = "kvm", fmt.Sprintf("KVM works: a probe guest reached its kernel in %v", d.Round(time.Millisecond))
	} else {
		v.Accel, v.Reason = "tcg", fmt.Sprintf("KVM present but %v: nested or broken hypervisor; using TCG", err)
	}
	if ctx.Err() == nil {
		os.MkdirAll(cfg.StateDir, 0o700)
		b, _ := json.Marshal(v)
		os.WriteFile(cache, b, 0o600)
	}
	return v.Accel, v.Reason
}

// probeKVM boots the kernel under KVM with no root filesystem: it panics
// at once, and with panic=-1 and -no-reboot QEMU exits. A guest that
// hangs (stock kernels under some nested paravirtual hypervisors) fails.
func probeKVM(ctx context.Context, info Info) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, kvmProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, info.QEMU, "-M", "microvm,x-option-roms=off,isa-serial=on,rtc=off",
		"-accel", "kvm", "-cpu", "host", "-m", "128", "-nodefaults", "-no-user-config", "-nographic",
		"-serial", "stdio", "-kernel", info.Kernel, "-append", "console=ttyS0 panic=-1 root=/dev/den-none", "-no-reboot")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	if ctx.Err() != nil {
		return d, fmt.Errorf("a probe guest did not boot within %v", kvmProbeTimeout)
	}
	if !bytes.Contains(out.Bytes(), []byte("Kernel panic")) {
		if err == nil {
			err = errors.New("no kernel output")
		}
		return d, fmt.Errorf("the probe guest failed (%v): %s", err, tail(out.Bytes(), 300))
	}
	return d, nil
}

// tail is the end of b, at most n bytes, trimmed.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(strings.ToValidUTF8(string(b), "?"))
}
