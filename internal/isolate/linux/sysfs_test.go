package linux

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A box's /sys does not tell host paths: a loop device's backing file
// (sysfs shows the host's block devices in every namespace) is not
// readable by any of the paths that lead to it.
func TestSysfsHidesHostPaths(t *testing.T) {
	rt := newRuntime(t)
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("losetup not installed")
	}
	backing := filepath.Join(t.TempDir(), "den-secret-backing-file")
	if err := os.WriteFile(backing, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", backing).CombinedOutput()
	if err != nil {
		t.Skipf("no loop device here: losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "-d", dev).Run()
	name := filepath.Base(dev)
	// On the host the path is there to read.
	num, err := os.ReadFile("/sys/block/" + name + "/dev")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile("/sys/block/" + name + "/loop/backing_file"); err != nil || strings.TrimSpace(string(b)) != backing {
		t.Fatalf("host's backing_file of %s: %q %v", dev, b, err)
	}

	spec := testSpec(t, rt, "sysfs")
	t.Cleanup(func() { rt.Destroy(context.Background(), spec) })
	b := startBox(t, rt, spec)
	script := `for d in /sys/block /sys/class/block /sys/devices/virtual/block; do cat $d/` + name + `/loop/backing_file; done; ` +
		`cat /sys/dev/block/` + strings.TrimSpace(string(num)) + `/loop/backing_file; ` +
		`find /sys -name backing_file -o -name backing_dev -o -name backend 2>/dev/null | xargs -r cat; ` +
		`echo listing; ls /sys/devices/virtual/block`
	out2, errOut, st := run(t, b.Agent(), "/bin/sh", "-c", script)
	t.Logf("%s%s", out2, errOut)
	if strings.Contains(out2+errOut, backing) {
		t.Fatalf("a box reads the host path %s from /sys", backing)
	}
	if !strings.HasSuffix(out2, "listing\n") || st.ExitCode != 0 {
		t.Fatalf("/sys/devices/virtual/block in a box is not empty: %q (exit %+v)", out2, st)
	}
}
