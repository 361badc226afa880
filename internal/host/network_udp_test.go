package host

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// The per-sandbox UDP allowances: kept in the table's sets, replaced
// atomically, cleared by Detach, and kept across a new daemon's
// NewNetwork.
func TestUDPAllowances(t *testing.T) {
	cfg := testNetworkConfig(t, "denu", "denudp", 202)
	n, err := NewNetwork(cfg)
	if err != nil {
		t.Fatal(err)
	}
	set := func(name string) string {
		out, err := exec.Command("nft", "list", "set", "inet", cfg.Table, name).CombinedOutput()
		if err != nil {
			t.Fatalf("list set %s: %v %s", name, err, out)
		}
		return strings.Join(listedElements(string(out)), ", ")
	}
	a0, _ := n.Addr(0)
	a1, _ := n.Addr(1)
	v6, _ := n.Addr6(1)
	if err := n.SetUDPAllow(0, []netip.Prefix{
		netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("192.0.2.7/32"), // nested: one element
		netip.MustParsePrefix("::ffff:198.51.100.0/120"), // IPv4-mapped: IPv4
	}); err != nil {
		t.Fatal(err)
	}
	if err := n.SetUDPAllow(1, []netip.Prefix{netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("203.0.113.9/32")}); err != nil {
		t.Fatal(err)
	}
	want4 := fmt.Sprintf("%s . 192.0.2.0/24, %s . 198.51.100.0/24, %s . 203.0.113.9", a0, a0, a1)
	if got := set("udp4"); got != want4 {
		t.Fatalf("udp4 = %q, want %q", got, want4)
	}
	if got, want := set("udp6"), v6.String()+" . 2001:db8::/32"; got != want {
		t.Fatalf("udp6 = %q, want %q", got, want)
	}
	// A new daemon keeps them.
	n2, err := NewNetwork(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := set("udp4"); got != want4 {
		t.Fatalf("after NewNetwork, udp4 = %q, want %q", got, want4)
	}
	// Detach takes a slot's away; a change replaces them.
	if err := n2.Detach(1); err != nil {
		t.Fatal(err)
	}
	if got := set("udp6"); got != "" {
		t.Fatalf("udp6 after Detach = %q", got)
	}
	if err := n2.SetUDPAllow(0, []netip.Prefix{netip.MustParsePrefix("192.0.2.8/29")}); err != nil {
		t.Fatal(err)
	}
	if got, want := set("udp4"), a0.String()+" . 192.0.2.8/29"; got != want {
		t.Fatalf("udp4 after a change = %q, want %q", got, want)
	}
	if err := n2.SetUDPAllow(0, nil); err != nil {
		t.Fatal(err)
	}
	if got := set("udp4") + set("guard4") + set("guard6"); got != "" {
		t.Fatalf("sets after the last allowance went: %q", got)
	}
	// Interface names are host-wide: another bridge's differ from den0's.
	if v := n2.vethName(0); v == "dv0" || len(v)+1 > 15 {
		t.Fatalf("veth name %q for bridge %s", v, cfg.Bridge)
	}
	// Slot and Addr6 agree.
	if s, ok := n2.Slot(v6); !ok || s != 1 {
		t.Fatalf("Slot(%s) = %d %v", v6, s, ok)
	}
}

// testNetworkConfig is a network of the test's own: bridge PREFIX<pid>,
// nftables table TABLE<pid>, subnet 10.NET.x.0/24, both removed when the
// test ends. It skips without root or nftables.
func testNetworkConfig(t *testing.T, prefix, table string, net int) NetworkConfig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (bridge, nftables)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nftables")
	}
	id := os.Getpid() % 100000
	cfg := NetworkConfig{
		Bridge: fmt.Sprintf("%s%d", prefix, id), Table: fmt.Sprintf("%s%d", table, id),
		Subnet:      netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", net, id%200)),
		Transparent: 1, DNS: 2, HTTPProxy: 3,
	}
	t.Cleanup(func() {
		exec.Command("nft", "delete", "table", "inet", cfg.Table).Run()
		if l, err := netlink.LinkByName(cfg.Bridge); err == nil {
			netlink.LinkDel(l)
		}
	})
	return cfg
}

// RemoveNetwork (den system reset) deletes the table and the bridge and
// turns forwarding off again on the uplinks den turned it on; a second
// call finds nothing.
func TestRemoveNetwork(t *testing.T) {
	cfg := testNetworkConfig(t, "denr", "denrm", 203)
	n, err := NewNetwork(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.SetUDPAllow(0, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}); err != nil {
		t.Fatal(err)
	}
	guards := listedGuards(cfg.Table)
	t.Logf("uplinks den turned forwarding on: %v", guards)
	for fam, devs := range guards {
		for _, dev := range devs {
			if sysctlValue(forwardingKey(fam, dev)) != "1" {
				t.Fatalf("%s: forwarding not on under a guard", dev)
			}
		}
	}
	gone, err := RemoveNetwork(cfg.Bridge, cfg.Table)
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(gone, "\n")
	if !strings.Contains(joined, "nftables table inet "+cfg.Table) || !strings.Contains(joined, "bridge "+cfg.Bridge) {
		t.Errorf("removed %q", gone)
	}
	if HasTable(cfg.Table) {
		t.Errorf("table %s is still there", cfg.Table)
	}
	if _, err := netlink.LinkByName(cfg.Bridge); err == nil {
		t.Errorf("bridge %s is still there", cfg.Bridge)
	}
	for fam, devs := range guards {
		for _, dev := range devs {
			if v := sysctlValue(forwardingKey(fam, dev)); v != "0" {
				t.Errorf("%s: forwarding is %s after RemoveNetwork, want 0 (as before den)", dev, v)
			}
		}
	}
	if gone, err := RemoveNetwork(cfg.Bridge, cfg.Table); err != nil || len(gone) != 0 {
		t.Errorf("second RemoveNetwork: %q, %v", gone, err)
	}
}
