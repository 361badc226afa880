package main

import (
	"strings"
	"testing"
)

// den create --shm-size sizes /dev/shm (Docker's flag and units); a bad
// size is a usage error naming the flag.
func TestCreateShmSize(t *testing.T) {
	d := newDaemon(t)
	df := func(id string) string {
		t.Helper()
		out, err := d.cli(0, "exec", id, "--", "sh", "-c", "df -k /dev/shm | tail -n 1")
		if f := strings.Fields(out); err == nil && len(f) > 1 {
			return f[1]
		}
		t.Fatalf("df in %s: %q %v", id, out, err)
		return ""
	}
	def, err := d.cli(0, "create")
	if err != nil {
		t.Fatalf("den create: %v %s", err, def)
	}
	if got := df(strings.TrimSpace(def)); got != "65536" {
		t.Fatalf("default /dev/shm: %s KiB", got)
	}
	id, err := d.cli(0, "create", "--shm-size", "128m")
	if err != nil {
		t.Fatalf("den create --shm-size 128m: %v %s", err, id)
	}
	if got := df(strings.TrimSpace(id)); got != "131072" {
		t.Fatalf("/dev/shm with --shm-size 128m: %s KiB, want 131072", got)
	}
	for _, bad := range []string{"12x", "1k"} {
		if out, err := d.cli(0, "create", "--shm-size", bad); err == nil || !strings.Contains(out, "shm") {
			t.Errorf("den create --shm-size %s: %q %v, want an error naming it", bad, out, err)
		}
	}
}
