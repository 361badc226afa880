// Package testenv decides, for den's privileged tests, between skipping and
// failing. A test skips only when the host lacks something den needs (root,
// a runsc binary, QEMU and a guest kernel, mkfs.btrfs...), found before any
// of den's own code runs, and only when the run does not require it; an
// error of den's own (a detection that refuses, a constructor that fails)
// always fails the test. A run requires the tiers named in
// $DEN_REQUIRE_TIERS (scripts/test.sh, and so CI, names all three): for
// them a missing host feature fails too, so a tier that does not work
// cannot leave CI green.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// RequireEnv names the tiers a run requires, comma-separated
// ("linux,gvisor,microvm").
const RequireEnv = "DEN_REQUIRE_TIERS"

// Required reports whether this run requires tier.
func Required(tier string) bool {
	return slices.Contains(strings.Split(os.Getenv(RequireEnv), ","), tier)
}

// Missing says what the host lacks for tier ("" when nothing): the checks
// look at the host only (binaries, files, privileges), never at den.
func Missing(tier string) string {
	if os.Geteuid() != 0 {
		return "the " + tier + " tier needs root"
	}
	switch tier {
	case "linux":
		if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
			return "user namespaces are off (user.max_user_namespaces = 0)"
		}
	case "gvisor":
		runsc := os.Getenv("DEN_RUNSC")
		if runsc == "" {
			runsc = "runsc"
		}
		if _, err := exec.LookPath(runsc); err != nil {
			return "no runsc (" + runsc + "): apt-get install runsc, or scripts/deps.sh"
		}
	case "microvm":
		for _, tool := range []string{"qemu-system-x86_64", "mkfs.erofs", "mkfs.ext4"} {
			if _, err := exec.LookPath(tool); err != nil {
				return "no " + tool + ": scripts/deps.sh installs qemu-system-x86, erofs-utils and e2fsprogs"
			}
		}
		if k, _ := filepath.Glob("/boot/vmlinuz-*"); len(k) == 0 {
			return "no guest kernel in /boot: apt-get install linux-image-cloud-amd64"
		}
	}
	return ""
}

// Tier skips t when the host lacks what tier needs and the run does not
// require tier; when it does, the missing piece fails t.
func Tier(t testing.TB, tier string) {
	t.Helper()
	if why := Missing(tier); why != "" {
		Skip(t, tier, why)
	}
}

// Skip skips t for a missing host feature, unless the run requires tier:
// then it fails, naming the feature and $DEN_REQUIRE_TIERS.
func Skip(t testing.TB, tier, why string) {
	t.Helper()
	if Required(tier) {
		t.Fatalf("the %s tier is required by this run (%s=%s) but the host lacks it: %s", tier, RequireEnv, os.Getenv(RequireEnv), why)
	}
	t.Skipf("the %s tier cannot run on this host: %s", tier, why)
}

// Unavailable fails t: den itself could not run tier on a host that has
// what the tier needs (Tier passed), which is den's error, never a skip.
func Unavailable(t testing.TB, tier, why string) {
	t.Helper()
	t.Fatalf("den cannot run the %s tier on this host, which has what it needs: %s", tier, why)
}
