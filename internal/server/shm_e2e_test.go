package server_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/testenv/e2e"
)

// shmKiB is the size of /dev/shm in a sandbox, as df sees it.
func (e *env) shmKiB(t *testing.T, id string) string {
	t.Helper()
	res := e.sh(t, id, "df -k /dev/shm | tail -n 1")
	f := strings.Fields(string(res.Stdout))
	if len(f) < 2 {
		t.Fatalf("df /dev/shm: %q", res.Stdout)
	}
	return f[1]
}

// shm_size sizes /dev/shm on every tier (default 64 MiB, Docker's); sizes
// under 1 MiB, over the memory limit or not sizes at all are refused.
func TestShmSize(t *testing.T) {
	e := newTierEnv(t)
	ctx := context.Background()
	for _, tier := range []string{"linux", "gvisor", "microvm"} {
		t.Run(tier, func(t *testing.T) {
			if tier != "linux" {
				e.need(t, tier)
			}
			var img string
			if tier == "microvm" {
				img = e2e.BusyboxImage(t, e.c)
			}
			def := e.create(t, api.CreateRequest{Runtime: tier, Image: img})
			if got := e.shmKiB(t, def.ID); got != "65536" {
				t.Fatalf("default /dev/shm: %s KiB, want 65536", got)
			}
			sb := e.create(t, api.CreateRequest{Runtime: tier, Image: img, ShmSize: 256 << 20})
			if sb.ShmSize != 256<<20 {
				t.Fatalf("created sandbox says shm_size %d", sb.ShmSize)
			}
			if got := e.shmKiB(t, sb.ID); got != "262144" {
				t.Fatalf("/dev/shm with shm_size 256m: %s KiB, want 262144", got)
			}
			// The size is the sandbox's: a restart keeps it, and it holds
			// what it says (a 100 MiB file fits, over the default).
			if _, err := e.c.Stop(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.Start(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			if got := e.shmKiB(t, sb.ID); got != "262144" {
				t.Fatalf("/dev/shm after a restart: %s KiB, want 262144", got)
			}
			if res := e.sh(t, sb.ID, "dd if=/dev/zero of=/dev/shm/big bs=1M count=100 2>&1 && ls -l /dev/shm/big"); !strings.Contains(string(res.Stdout), "104857600") {
				t.Fatalf("100 MiB into /dev/shm: %s", res.Stdout)
			}
		})
	}
	for _, tc := range []struct{ body, want string }{
		{`{"shm_size": "1k"}`, "less than 1m"},
		{`{"shm_size": "1g", "limits": {"memory": "512m"}}`, "memory limit"},
		{`{"shm_size": "lots"}`, "bad size"},
		{`{"shm_size": -5}`, "negative"},
	} {
		status, out := e.raw(t, "POST", "/v1/sandboxes", bytes.NewReader([]byte(tc.body)))
		if status != 400 || !strings.Contains(string(out), tc.want) {
			t.Errorf("create %s: %d %s, want 400 naming %q", tc.body, status, out, tc.want)
		}
	}
}
