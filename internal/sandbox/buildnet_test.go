package sandbox

import (
	"reflect"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
)

// TestLookupFailed: what common tools print when a name does not resolve
// (as captured from them without network) is recognised, with the name;
// other failures are not.
func TestLookupFailed(t *testing.T) {
	for _, c := range []struct {
		out   string
		names []string
	}{
		{"curl: (6) Could not resolve host: other.test\n", []string{"other.test"}},
		{"wget: bad address 'other.test'\n", []string{"other.test"}},
		{"nslookup: can't connect to remote host (10.255.255.53): Network is unreachable\n", nil},
		{"socket.gaierror: [Errno -3] Temporary failure in name resolution\n", nil},
		{"fatal: unable to access 'https://other.test/x/': Could not resolve host: other.test\n", []string{"other.test"}},
		{"Err:1 http://deb.debian.org/debian bookworm InRelease\n  Temporary failure resolving 'deb.debian.org'\nW: Failed to fetch\nE: Unable to locate package curl\n", []string{"deb.debian.org"}},
		{"wget: unable to resolve host address 'example.org'\n", []string{"example.org"}},
		{"npm ERR! request to https://registry.npmjs.org/x failed, reason: getaddrinfo ENOTFOUND registry.npmjs.org\n", []string{"registry.npmjs.org"}},
		{"go: example.com/m@v1: Get \"https://proxy.golang.org/x\": dial tcp: lookup proxy.golang.org on 127.0.0.53:53: no such host\n", []string{"proxy.golang.org"}},
		{"ping: other.test: Name or service not known\n", nil},
	} {
		failed, names := lookupFailed(c.out)
		if !failed || !reflect.DeepEqual(names, c.names) {
			t.Errorf("%q: failed %v, names %q; want true, %q", c.out, failed, names, c.names)
		}
	}
	for _, out := range []string{"", "make: *** [all] Error 2\n", "cat: /nope: No such file or directory\n"} {
		if failed, _ := lookupFailed(out); failed {
			t.Errorf("%q taken for a failed lookup", out)
		}
	}
}

// TestBuildNetworkHint: without network a failed lookup gets the grant;
// with a policy the refusals are named, an address as an --allow-cidr.
func TestBuildNetworkHint(t *testing.T) {
	h := buildNetworkHint(api.NetNone, "curl: (6) Could not resolve host: a.test\nwget: bad address 'b.test'\n", nil)
	if !strings.Contains(h, "the build has no network") || !strings.Contains(h, "--network allow --allow a.test --allow b.test") {
		t.Errorf("no network: %q", h)
	}
	if h := buildNetworkHint(api.NetNone, "Temporary failure in name resolution", nil); !strings.Contains(h, "--network allow --allow NAME") {
		t.Errorf("no network, no name: %q", h)
	}
	if h := buildNetworkHint(api.NetNone, "exit 3", nil); h != "" {
		t.Errorf("no lookup: %q", h)
	}
	denied := []api.DeniedConn{{Host: "a.test", Port: 443, Proto: "tcp", Rule: "name not in allow list"}, {Host: "a.test", Proto: "dns", Port: 53, Rule: "name not in allow list"}, {Host: "10.1.2.3", Port: 80, Proto: "tcp", Rule: "address not public"}}
	h = buildNetworkHint(api.NetAllow, "", denied)
	for _, want := range []string{"refused a.test: name not in allow list; a.test (a DNS lookup)", "10.1.2.3: address not public", "add --allow a.test --allow-cidr 10.1.2.3 "} {
		if !strings.Contains(h, want) {
			t.Errorf("policy hint %q lacks %q", h, want)
		}
	}
	if h := buildNetworkHint(api.NetAllow, "Could not resolve host: x.test", nil); h != "" {
		t.Errorf("a policy refusing nothing: %q", h)
	}
}
