package host

import (
	"os"
	"strconv"
	"testing"
)

func TestProcStat(t *testing.T) {
	comm, f, err := ProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile("/proc/self/comm")
	if comm+"\n" != string(want) {
		t.Fatalf("comm %q, /proc/self/comm %q", comm, want)
	}
	// The main thread of a Go test may be running or sleeping.
	if len(f) < 20 || (f[0] != "R" && f[0] != "S") || f[1] != strconv.Itoa(os.Getppid()) {
		t.Fatalf("fields %q: want state R or S and ppid %d", f, os.Getppid())
	}
	if _, _, err := ProcStat(-1); err == nil {
		t.Fatal("no error for pid -1")
	}
}
