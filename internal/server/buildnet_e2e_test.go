package server_test

import (
	"strings"
	"testing"

	"github.com/den-dev/den/api"
)

// TestBuildNetwork: a build's RUN steps have no network unless asked; a
// lookup that fails for want of it says so and names the flag that
// grants it; --network allow lets the allowed names through den's policy,
// and a name it refuses is named; bad network parameters are refused.
func TestBuildNetwork(t *testing.T) {
	e, _ := newNetEnv(t)
	fetch := func(name string) map[string]string {
		return map[string]string{"Dockerfile": "FROM host\nRUN curl -fsS --max-time 10 http://" + name + "/ > /fetched && cat /fetched\n"}
	}

	// Allowed, the step reaches the test internet (the control for the
	// refusals below).
	img, berr, out := e.build(t, "t=netok&network=allow&allow=other.test", fetch("other.test"))
	if berr != nil {
		t.Fatalf("build with --network allow --allow other.test: %s\n%s", berr.Message, out)
	}
	if !strings.Contains(out, "hello from the test internet, host other.test") {
		t.Fatalf("the RUN step did not reach other.test:\n%s", out)
	}
	sb := e.create(t, api.CreateRequest{Image: img.Name})
	if r := e.sh(t, sb.ID, "cat /fetched"); !strings.Contains(string(r.Stdout), "host other.test") {
		t.Fatalf("the image lacks what the step fetched: %q", r.Stdout)
	}

	// By default, no network: the same step (not taken from the cache of
	// the networked build, whose key has its mode) fails, and the error
	// says why and how to grant it.
	_, berr, out = e.build(t, "t=netnone", fetch("other.test"))
	if berr == nil {
		t.Fatalf("a build without network reached other.test:\n%s", out)
	}
	if strings.Contains(out, "using cache") {
		t.Errorf("the build without network used the networked build's cache:\n%s", out)
	}
	t.Logf("without network: %s", berr.Message)
	for _, want := range []string{"Dockerfile line 2", "the build has no network", "it looked up other.test", "den image build --network allow --allow other.test"} {
		if !strings.Contains(berr.Message, want) {
			t.Errorf("build error without network lacks %q: %s", want, berr.Message)
		}
	}

	// busybox's wget and nslookup, as a small image has them.
	for _, c := range []struct{ run, want string }{
		{"busybox wget -q -O- http://other.test/", "--network allow --allow other.test"},
		{"busybox nslookup other.test", "--network allow --allow NAME"},
	} {
		_, berr, out = e.build(t, "t=netbusybox", map[string]string{"Dockerfile": "FROM host\nRUN " + c.run + "\n"})
		if berr == nil || !strings.Contains(berr.Message, "the build has no network") || !strings.Contains(berr.Message, c.want) {
			t.Errorf("RUN %s without network: %+v\n%s", c.run, berr, out)
		}
	}

	// A step that fails with no lookup in its output gets no hint.
	_, berr, _ = e.build(t, "t=netfalse", map[string]string{"Dockerfile": "FROM host\nRUN echo plain failure; exit 3\n"})
	if berr == nil || !strings.Contains(berr.Message, "exited with code 3") || strings.Contains(berr.Message, "network") {
		t.Errorf("a plain failing step: %+v", berr)
	}

	// With a policy that does not allow the name, den's egress refuses
	// it and the error names it and the flag that would allow it.
	_, berr, out = e.build(t, "t=netother&network=allow&allow=allowed.test&no-cache=true", fetch("other.test"))
	if berr == nil {
		t.Fatalf("other.test reached with only allowed.test allowed:\n%s", out)
	}
	t.Logf("with a policy: %s", berr.Message)
	for _, want := range []string{"refused other.test", "name not in allow list", "add --allow other.test"} {
		if !strings.Contains(berr.Message, want) {
			t.Errorf("build error with a policy lacks %q: %s", want, berr.Message)
		}
	}

	// The allow lists are not in the cache key (as BuildKit keeps proxy
	// settings out of it): another allow list reuses the step.
	_, berr, out = e.build(t, "t=netok2&network=allow&allow=other.test&allow=allowed.test", fetch("other.test"))
	if berr != nil || !strings.Contains(out, "using cache") {
		t.Errorf("a networked rebuild with another allow list: %v\n%s", berr, out)
	}

	// Open reaches any public address.
	if _, berr, out = e.build(t, "t=netopen&network=open&no-cache=true", fetch("allowed.test")); berr != nil || !strings.Contains(out, "host allowed.test") {
		t.Errorf("build with --network open: %v\n%s", berr, out)
	}

	// Bad parameters are refused, naming the problem, before any step.
	for _, c := range []struct{ query, want string }{
		{"network=bogus", `"bogus" is not a network mode`},
		{"allow=other.test", "need network=allow"},
		{"network=none&allow-cidr=198.51.100.0/24", "need network=allow"},
		{"network=allow", "needs at least one allow name"},
		{"network=open&allow=other.test", "do not go with network=open"},
		{"network=allow&allow-cidr=not-a-cidr", "not a CIDR"},
		{"network=allow&allow=bad%20name", "allow rule"},
		{"debian=bookworm&network=open", "takes no network"},
	} {
		_, berr, out := e.build(t, "t=netbad&"+c.query, fetch("other.test"))
		if berr == nil || berr.Kind != api.KindInvalid || !strings.Contains(berr.Message, c.want) || strings.Contains(out, "Step 1") {
			t.Errorf("?%s: want an invalid error with %q before any step, got %+v\n%s", c.query, c.want, berr, out)
		}
	}
}
