package sandbox

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/den-dev/den/internal/isolate"
)

// socketInode finds this process's own UDP and TCP sockets by their local
// address, IPv4 and IPv6, connected and unconnected, and names why it
// finds none for a port nothing holds.
func TestSocketInode(t *testing.T) {
	owner := func(inode string) bool {
		return socketOwnerIn([]int{os.Getpid()}, inode) == os.Getpid()
	}
	var socks []netip.AddrPort
	udp4, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer udp4.Close()
	socks = append(socks, udp4.LocalAddr().(*net.UDPAddr).AddrPort())
	// A query from a socket never connected nor bound to an address: the
	// kernel shows 0.0.0.0 as its local address.
	anyUDP, err := net.ListenUDP("udp4", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer anyUDP.Close()
	port := anyUDP.LocalAddr().(*net.UDPAddr).Port
	if inode, why := socketInode(os.Getpid(), "udp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))); inode == "" || !owner(inode) {
		t.Errorf("unbound UDP socket on port %d: inode %q (%s)", port, inode, why)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tcpSrc := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if udp6, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback}); err == nil {
		defer udp6.Close()
		socks = append(socks, udp6.LocalAddr().(*net.UDPAddr).AddrPort())
	}
	for _, s := range socks {
		if inode, why := socketInode(os.Getpid(), "udp", s); inode == "" || !owner(inode) {
			t.Errorf("UDP socket %s: inode %q (%s)", s, inode, why)
		}
	}
	if inode, why := socketInode(os.Getpid(), "tcp", tcpSrc); inode == "" || !owner(inode) {
		t.Errorf("TCP socket %s: inode %q (%s)", tcpSrc, inode, why)
	}
	// The same port over the other protocol, or another address on it, is
	// not the socket.
	if inode, _ := socketInode(os.Getpid(), "udp", tcpSrc); inode != "" {
		t.Errorf("TCP source %s found as a UDP socket %s", tcpSrc, inode)
	}
	other := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), tcpSrc.Port())
	if inode, _ := socketInode(os.Getpid(), "tcp", other); inode != "" {
		t.Errorf("%s found as %s's socket %s", other, tcpSrc, inode)
	}
	if inode, why := socketInode(os.Getpid(), "tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 1)); inode != "" || why == "" {
		t.Errorf("port 1: inode %q, why %q", inode, why)
	}
}

func TestParseProcAddr(t *testing.T) {
	for in, want := range map[string]string{
		// /proc/net/tcp prints 32-bit words in host byte order.
		fmt.Sprintf("%08X:0050", nativeWord([4]byte{10, 88, 0, 2})):                                                                "10.88.0.2:80",
		fmt.Sprintf("%08X%08X%08X%08X:01BB", nativeWord([4]byte{0xfd, 0x64, 0x65, 0x6e}), 0, 0, nativeWord([4]byte{10, 88, 0, 2})): "[fd64:656e::a58:2]:443",
	} {
		got, ok := parseProcAddr(in)
		if !ok || got.String() != want {
			t.Errorf("parseProcAddr(%s) = %s, %v; want %s", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "0100007F", "0100007F:", "0100007F:XYZ", "0100007:0050", "0100007G:0050"} {
		if _, ok := parseProcAddr(bad); ok {
			t.Errorf("parseProcAddr(%q) accepted", bad)
		}
	}
}

// nativeWord is b as the kernel prints it in /proc/net: a 32-bit word read
// from memory in host byte order.
func nativeWord(b [4]byte) uint32 { return binary.NativeEndian.Uint32(b[:]) }

// otherTierBox is a running box whose processes and sockets are not the
// host's (a gVisor or microVM box): it has no Procs.
type otherTierBox struct{ isolate.Box }

func (otherTierBox) Pid() int { return os.Getpid() }

// When Attribute cannot name the process it says why: a sandbox not
// running, a tier whose sockets den cannot see, attributions past the
// ration.
func TestAttributeSaysWhyNot(t *testing.T) {
	m := &Manager{boxes: map[string]isolate.Box{"gv": otherTierBox{}}}
	src := netip.MustParseAddrPort("10.88.0.2:40000")
	if p, why := m.Attribute("gone", "tcp", src); p != "" || !strings.Contains(why, "not running") {
		t.Errorf("no box: %q, %q", p, why)
	}
	var last string
	for i := 0; i < int(attributeBurst); i++ {
		p, why := m.Attribute("gv", "udp", src)
		if p != "" || !strings.Contains(why, "network stack of its own") {
			t.Fatalf("another tier: %q, %q", p, why)
		}
		last = why
	}
	if _, why := m.Attribute("gv", "udp", src); why == last || !strings.Contains(why, "rationed") {
		t.Errorf("past the ration: %q", why)
	}
}
