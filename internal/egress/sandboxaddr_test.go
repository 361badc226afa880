package egress

import (
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// An address that Config.Sandbox maps to a sandbox is never a destination,
// even when an AllowCIDR rule names it and Config.Deny does not (an IPv6
// bridge prefix left out of Deny).
func TestSandboxAddressDenied(t *testing.T) {
	other := netip.MustParseAddr("127.0.0.3")
	echo := startEcho(t, other.String(), "")
	var h *harness
	h = newHarness(t, Policy{Mode: ModeAllow, AllowCIDR: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, func(c *Config) {
		c.Sandbox = func(src netip.Addr) (string, Policy, bool) {
			switch src {
			case sandboxSrc:
				return sandboxID, *h.pol.Load(), true
			case other:
				return "sb2", Policy{Mode: ModeOpen}, true
			}
			return "", Policy{}, false
		}
	})
	conn, err := h.dialTransparent(echo.addr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, "x")
	if b, _ := readAllTimeout(conn, 5*time.Second); len(b) != 0 {
		t.Fatalf("reached another sandbox: %q", b)
	}
	conn.Close()
	h.log.wait(t, "another sandbox", func(e Event) bool {
		return e.Verdict == VerdictDeny && strings.Contains(e.Reason, "belongs to sandbox sb2")
	})
	if echo.accepted.Load() != 0 {
		t.Fatal("the proxy dialed another sandbox")
	}
}
