package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/den-dev/den/internal/bench"
)

// The harness's own tests are in internal/bench; these are of the verb.

func TestBenchFormatting(t *testing.T) {
	ptr := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		v    float64
		unit string
		want string
	}{
		{0.4567, "ms", "0.457ms"}, {2.345, "ms", "2.35ms"}, {43.12, "ms", "43.1ms"}, {1234, "ms", "1.23s"}, {3.999, "MiB", "4.00MiB"},
	} {
		if got := benchFmt(ptr(tc.v), tc.unit); got != tc.want {
			t.Errorf("benchFmt(%v %s) = %q, want %q", tc.v, tc.unit, got, tc.want)
		}
	}
	if got := benchFmt(nil, "ms"); got != "-" {
		t.Errorf("nil = %q", got)
	}
}

func TestBenchSelectAndFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"bench", "nosuch"}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown scenario "nosuch"`) {
		t.Errorf("den bench nosuch: exit %d, %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"bench", "--parallel", "0", "cold"}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--parallel") {
		t.Errorf("den bench --parallel 0: exit %d, %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"bench", "-n", "-1", "cold"}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "-n: must not be negative") {
		t.Errorf("den bench -n -1: exit %d, %q", code, errb.String())
	}
	// No daemon: say what to do.
	errb.Reset()
	sock := filepath.Join(t.TempDir(), "none.sock")
	if code := run([]string{"--host", "unix://" + sock, "bench", "exec"}, nil, &out, &errb); code != 1 || !strings.Contains(errb.String(), "den serve") {
		t.Errorf("den bench without a daemon: exit %d, %q", code, errb.String())
	}
}

// den bench -h describes every scenario the harness has, each once.
func TestBenchHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"bench", "--help"}, nil, &out, &errb); code != 0 {
		t.Fatalf("den bench --help: exit %d, %s", code, errb.String())
	}
	for _, c := range bench.Cases() {
		first, _, _ := strings.Cut(c.About, "\n")
		line := "  " + c.Name + strings.Repeat(" ", 15-len(c.Name)) + first + "\n"
		if strings.Count(out.String(), line) != 1 {
			t.Errorf("den bench --help lacks %q:\n%s", line, out.String())
		}
	}
}
