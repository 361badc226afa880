package server_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/testenv/e2e"
)

// busyboxHosts is the first line of the /etc/hosts den writes where an
// image has none.
const busyboxHosts = "127.0.0.1\tlocalhost"

// Every tier names the sandbox's hostname in its /etc/hosts (127.0.1.1,
// as Debian and Docker do), keeping the image's own lines, so a lookup
// of the machine's own name (hostname -f, sudo, Java) answers at once; a
// fork names itself, not its source. The host's file is not touched.
func TestHostnameInEtcHosts(t *testing.T) {
	e := newTierEnv(t)
	ctx := context.Background()
	hostHosts, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	imageLine, _, _ := strings.Cut(string(hostHosts), "\n") // the host image's /etc/hosts is the host's
	check := func(t *testing.T, id, name, imageLine string) {
		t.Helper()
		// busybox has no getent: there the file is what is checked.
		withLibc := imageLine != busyboxHosts
		lookup := "true"
		if withLibc {
			lookup = "getent hosts $(hostname)"
		}
		res := e.sh(t, id, "hostname; cat /etc/hosts; echo ---; "+lookup)
		got := string(res.Stdout)
		if !strings.HasPrefix(got, name+"\n") {
			t.Fatalf("hostname in %s: %q, want %s", id, got, name)
		}
		hosts, lookup, _ := strings.Cut(strings.TrimPrefix(got, name+"\n"), "---\n")
		if !strings.Contains(hosts, "\n127.0.1.1\t"+name+"\n") || strings.Count(hosts, "127.0.1.1") != 1 || !strings.HasPrefix(hosts, imageLine+"\n") {
			t.Fatalf("/etc/hosts of %s:\n%s\nwant the image's lines and one 127.0.1.1 %s", id, hosts, name)
		}
		if f := strings.Fields(lookup); withLibc && (len(f) < 2 || f[0] != "127.0.1.1" || f[1] != name) {
			t.Fatalf("getent hosts %s: %q", name, lookup)
		}
	}
	for _, tier := range []string{"linux", "gvisor", "microvm"} {
		t.Run(tier, func(t *testing.T) {
			if tier != "linux" {
				e.need(t, tier)
			}
			req, line := api.CreateRequest{Name: "hosty-" + tier, Runtime: tier}, imageLine
			if tier == "microvm" { // an image without /etc/hosts: den writes one
				req.Image, line = e2e.BusyboxImage(t, e.c), busyboxHosts
			}
			sb := e.create(t, req)
			check(t, sb.ID, sb.Hostname, line)
			// A fork boots from the source's files (linux) or resumes its
			// memory (gvisor, microvm): either way it names itself.
			forks, err := e.c.Fork(ctx, sb.ID, api.ForkRequest{Memory: tier != "linux"})
			if err != nil {
				t.Fatal(err)
			}
			if forks[0].Hostname == sb.Hostname {
				t.Fatalf("fork kept the hostname %s", sb.Hostname)
			}
			check(t, forks[0].ID, forks[0].Hostname, line)
		})
	}
	if after, _ := os.ReadFile("/etc/hosts"); string(after) != string(hostHosts) {
		t.Fatalf("the host's /etc/hosts changed:\n%s", after)
	}
}
