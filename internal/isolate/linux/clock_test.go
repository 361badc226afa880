package linux

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/den-dev/den/internal/isolate"
	"golang.org/x/sys/unix"
)

// clockProbeEnv makes the test binary try to change the wall clock and
// say how it went: "tick" sets the clock's tick length to the one it has
// (a change of nothing, but refused without CAP_SYS_TIME); "set" also
// steps the clock to the time it reads.
const clockProbeEnv = "DEN_TEST_CLOCK_PROBE"

func init() {
	mode := os.Getenv(clockProbeEnv)
	if mode == "" {
		return
	}
	fmt.Printf("uid %d\n", os.Getuid())
	// The tick it has first (where even that read is refused, the
	// change is not tried).
	var tx unix.Timex
	_, err := unix.Adjtimex(&tx)
	if err == nil {
		tx = unix.Timex{Modes: unix.ADJ_TICK, Tick: tx.Tick}
		_, err = unix.Adjtimex(&tx)
	}
	fmt.Printf("tick: %v\n", errString(err))
	if mode == "set" {
		var ts unix.Timespec
		err := unix.ClockGettime(unix.CLOCK_REALTIME, &ts)
		if err == nil {
			err = unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
		}
		fmt.Printf("set: %v\n", errString(err))
	}
	os.Exit(0)
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// A box shares the host's kernel, hence its wall clock: root inside must
// not change it (den has no call that sets a box's clock on this tier
// either; the microVM's guest init has one for its own kernel). The probe
// is this test binary, which as the host's root succeeds.
func TestBoxCannotSetTheClock(t *testing.T) {
	rt := newRuntime(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Control: the same probe, run by the host's root, is allowed.
	out, err := runProbe(exe, "tick")
	if err != nil || !strings.Contains(out, "tick: ok") {
		t.Fatalf("the probe as the host's root: %v: %s", err, out)
	}

	spec := testSpec(t, rt, "t1clock")
	layer := t.TempDir()
	raw, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(layer, "bin"), 0o755)
	if err := os.WriteFile(filepath.Join(layer, "bin/probe"), raw, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(layer, 0o755)
	os.Mkdir(filepath.Join(spec.Layers[0].Lowers[0], "opt"), 0o755)
	spec.Layers = append(spec.Layers, isolate.Overlay{Target: "/opt", Lowers: []string{layer}, Name: "opt"})
	ctx := context.Background()
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Destroy(ctx, spec)
	defer b.Stop(ctx)
	out, _, st := run(t, b.Agent(), "/bin/sh", "-c", clockProbeEnv+"=set /opt/bin/probe")
	t.Logf("%s", out)
	if st.ExitCode != 0 || !strings.Contains(out, "uid 0\n") {
		t.Fatalf("the probe inside: exit %+v: %q", st, out)
	}
	for _, want := range []string{"tick: operation not permitted", "set: operation not permitted"} {
		if !strings.Contains(out, want) {
			t.Errorf("root in the box: want %q, got %q", want, out)
		}
	}
}

func runProbe(exe, mode string) (string, error) {
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), clockProbeEnv+"="+mode)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
