package host

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestBridgeMACStays: a port with a lower MAC than the bridge's joining it
// does not change the bridge's MAC (left to the kernel it would, and every
// sandbox's ARP entry for the gateway would point nowhere: their DNS and
// proxied connections died until the entry went stale).
func TestBridgeMACStays(t *testing.T) {
	cfg := testNetworkConfig(t, "denm", "denmac", 203)
	veth := fmt.Sprintf("denmv%d", os.Getpid()%100000)
	t.Cleanup(func() { // before the bridge goes (cleanups run last-in, first-out)
		if l, err := netlink.LinkByName(veth); err == nil {
			netlink.LinkDel(l)
		}
	})
	if _, err := NewNetwork(cfg); err != nil {
		t.Fatal(err)
	}
	br, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	before := br.Attrs().HardwareAddr
	// A port whose MAC is below any the bridge could have had.
	low := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	la := netlink.NewLinkAttrs()
	la.Name, la.HardwareAddr = veth, low
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: veth + "p"}); err != nil {
		t.Fatal(err)
	}
	v, err := netlink.LinkByName(veth)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetMaster(v, br); err != nil {
		t.Fatal(err)
	}
	netlink.LinkSetUp(v)
	if br, err = netlink.LinkByName(cfg.Bridge); err != nil {
		t.Fatal(err)
	}
	if after := br.Attrs().HardwareAddr; !bytes.Equal(after, before) {
		t.Fatalf("the bridge's MAC changed from %s to %s when a port joined", before, after)
	}
	// A new daemon on the same bridge keeps it too.
	if _, err := NewNetwork(cfg); err != nil {
		t.Fatal(err)
	}
	if br, _ = netlink.LinkByName(cfg.Bridge); !bytes.Equal(br.Attrs().HardwareAddr, before) {
		t.Fatalf("a second NewNetwork changed the bridge's MAC to %s", br.Attrs().HardwareAddr)
	}
}
