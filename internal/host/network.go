package host

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/template"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetworkConfig describes the host side of sandbox networking.
type NetworkConfig struct {
	Bridge string       // default "den0"
	Table  string       // nftables table (family inet), default "den" for bridge den0, else "den_BRIDGE"
	Subnet netip.Prefix // IPv4 subnet of the bridge, default 10.88.0.0/16; the first host address is the gateway
	// Subnet6 is the bridge's IPv6 prefix, /64 to /96: a sandbox's IPv6
	// address is the prefix with its IPv4 address in the last 32 bits
	// (the gateway's too). Default: the unique local prefix
	// fd64:656e:X:Y::/64, X:Y being Subnet's network address (10.88.0.0 →
	// fd64:656e:a58:0::/64), so bridges of different subnets differ.
	Subnet6 netip.Prefix
	// Ports of den's egress servers on the gateway address: every TCP
	// connection a sandbox makes is redirected to Transparent, every DNS
	// query to DNS; HTTPProxy serves tools that honour HTTP(S)_PROXY.
	Transparent, DNS, HTTPProxy int
}

// Network is the host side of sandbox networking: one bridge, one veth per
// networked sandbox (ports isolated from each other), and nftables rules
// that send every sandbox TCP connection (IPv4 and IPv6) to den's egress
// proxy and every DNS query to den's DNS, forward only the UDP a sandbox's
// allow_cidr rules name (SetUDPAllow), and accept nothing else on the
// host. A sandbox without network keeps only its loopback.
type Network struct {
	cfg NetworkConfig
	gw  netip.Addr
	gw6 netip.Addr
	no6 bool // the bridge has no IPv6: neither do the sandboxes

	mu     sync.Mutex
	udp    map[int][]netip.Prefix // per slot: UDP destinations forwarded (in the nft sets udp4, udp6)
	guards [2]map[string]bool     // IPv4, IPv6: uplinks den turned forwarding on (sets guard4, guard6)
}

var nftRules = template.Must(template.New("nft").Parse(`table inet {{.Table}}
delete table inet {{.Table}}
table inet {{.Table}} {
	# Per sandbox: source address . destination prefix of the UDP it may
	# send (its allow_cidr rules), kept by SetUDPAllow.
	set udp4 {
		type ipv4_addr . ipv4_addr; flags interval;{{if .udp4}}
		elements = { {{.udp4}} }{{end}}
	}
	set udp6 {
		type ipv6_addr . ipv6_addr; flags interval;{{if .udp6}}
		elements = { {{.udp6}} }{{end}}
	}
	# Uplinks on which den turned forwarding on (replies to that UDP come
	# in there): nothing else arriving on them is forwarded.
	set guard4 {
		type ifname;{{if .guard4}}
		elements = { {{.guard4}} }{{end}}
	}
	set guard6 {
		type ifname;{{if .guard6}}
		elements = { {{.guard6}} }{{end}}
	}
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "{{.Bridge}}" meta nfproto ipv4 meta l4proto { tcp, udp } th dport 53 redirect to :{{.DNS}}
		iifname "{{.Bridge}}" meta nfproto ipv6 meta l4proto { tcp, udp } th dport 53 dnat ip6 to [{{.Gateway6}}]:{{.DNS}}
		iifname "{{.Bridge}}" ip daddr {{.Gateway}} tcp dport {{.HTTPProxy}} accept
		iifname "{{.Bridge}}" ip6 daddr {{.Gateway6}} tcp dport {{.HTTPProxy}} accept
		iifname "{{.Bridge}}" meta nfproto ipv4 meta l4proto tcp redirect to :{{.Transparent}}
		iifname "{{.Bridge}}" meta nfproto ipv6 meta l4proto tcp dnat ip6 to [{{.Gateway6}}]:{{.Transparent}}
	}
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "{{.Bridge}}" ct state established,related accept
		iifname "{{.Bridge}}" ip daddr {{.Gateway}} tcp dport { {{.Transparent}}, {{.DNS}}, {{.HTTPProxy}} } accept
		iifname "{{.Bridge}}" ip daddr {{.Gateway}} udp dport {{.DNS}} accept
		iifname "{{.Bridge}}" ip6 daddr {{.Gateway6}} tcp dport { {{.Transparent}}, {{.DNS}}, {{.HTTPProxy}} } accept
		iifname "{{.Bridge}}" ip6 daddr {{.Gateway6}} udp dport {{.DNS}} accept
		iifname "{{.Bridge}}" icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept
		iifname "{{.Bridge}}" counter drop
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		oifname "{{.Bridge}}" ct direction reply ct state established,related accept
		meta nfproto ipv4 iifname @guard4 drop
		meta nfproto ipv6 iifname @guard6 drop
		iifname "{{.Bridge}}" oifname "{{.Bridge}}" drop
		iifname "{{.Bridge}}" meta l4proto udp ip saddr . ip daddr @udp4 accept
		iifname "{{.Bridge}}" meta l4proto udp ip6 saddr . ip6 daddr @udp6 accept
		iifname "{{.Bridge}}" counter drop
		oifname "{{.Bridge}}" drop
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		iifname "{{.Bridge}}" oifname != "{{.Bridge}}" masquerade
	}
	chain output {
		type filter hook output priority filter; policy accept;
		# The host never opens a connection to a sandbox over the bridge
		# (ports are reached inside the sandbox's namespace), so no proxy
		# can be talked into dialing one.
		oifname "{{.Bridge}}" meta l4proto { tcp, udp } ct state new drop
	}
}
`))

// NoLinkLocal turns off IPv6 link-local addresses on a sandbox's
// interface l (through h, a handle in its namespace) and removes any it
// has. A connection to the bridge's fe80:: address would leave from one,
// which names no sandbox, and den's proxy could only refuse it as from an
// unknown source, outside the sandbox's log; without one it leaves from
// the sandbox's own address and is refused and logged like any connection
// to the host. Neighbour discovery does not need it (the sandbox's address
// answers), nor does anything else on a bridge without router adverts.
func NoLinkLocal(h *netlink.Handle, l netlink.Link) error {
	const addrGenModeNone = 1 // IN6_ADDR_GEN_MODE_NONE
	if err := h.LinkSetIP6AddrGenMode(l, addrGenModeNone); err != nil {
		return fmt.Errorf("turn off IPv6 link-local addresses on %s: %w", l.Attrs().Name, err)
	}
	addrs, _ := h.AddrList(l, netlink.FAMILY_V6)
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			if err := h.AddrDel(l, &a); err != nil {
				return fmt.Errorf("remove %s from %s: %w", a.IPNet, l.Attrs().Name, err)
			}
		}
	}
	return nil
}

// TableName is the nftables table (family inet) of bridge's rules: one
// table per bridge, so two daemons on one host (each with its own
// --bridge) never replace each other's rules.
func TableName(bridge string) string {
	if bridge == "den0" || bridge == "" {
		return "den"
	}
	return "den_" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, bridge)
}

// NewNetwork creates (or adopts) the bridge and installs the rules. The
// UDP allowances of sandboxes still running from a previous daemon are
// kept.
func NewNetwork(cfg NetworkConfig) (*Network, error) {
	if cfg.Bridge == "" {
		cfg.Bridge = "den0"
	}
	if cfg.Table == "" {
		cfg.Table = TableName(cfg.Bridge)
	}
	if !cfg.Subnet.IsValid() {
		cfg.Subnet = netip.MustParsePrefix("10.88.0.0/16")
	}
	if !cfg.Subnet.Addr().Is4() {
		return nil, fmt.Errorf("network: subnet %s is not IPv4", cfg.Subnet)
	}
	cfg.Subnet = cfg.Subnet.Masked()
	if !cfg.Subnet6.IsValid() {
		n := cfg.Subnet.Addr().As4()
		cfg.Subnet6 = netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0x64, 0x65, 0x6e, n[0], n[1], n[2], n[3]}), 64)
	}
	if cfg.Subnet6.Addr().Is4() || cfg.Subnet6.Bits() > 96 {
		return nil, fmt.Errorf("network: IPv6 prefix %s: want an IPv6 prefix of /96 or shorter", cfg.Subnet6)
	}
	cfg.Subnet6 = cfg.Subnet6.Masked()
	if cfg.Transparent == 0 || cfg.DNS == 0 || cfg.HTTPProxy == 0 {
		return nil, fmt.Errorf("network: the egress ports are not set")
	}
	n := &Network{cfg: cfg, gw: cfg.Subnet.Addr().Next(), udp: map[int][]netip.Prefix{}, guards: [2]map[string]bool{{}, {}}}
	n.gw6 = n.v6(n.gw)
	br, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		la := netlink.NewLinkAttrs()
		la.Name = cfg.Bridge
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
			return nil, fmt.Errorf("create bridge %s: %w", cfg.Bridge, err)
		}
		if br, err = netlink.LinkByName(cfg.Bridge); err != nil {
			return nil, err
		}
	}
	if err := pinBridgeMAC(br); err != nil {
		return nil, fmt.Errorf("bridge %s: %w", cfg.Bridge, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.gw.AsSlice(), Mask: net.CIDRMask(cfg.Subnet.Bits(), 32)}}
	if err := netlink.AddrReplace(br, addr); err != nil {
		return nil, fmt.Errorf("address bridge %s: %w", cfg.Bridge, err)
	}
	// IPv6 where the host has it (a host booted with ipv6.disable=1 gives
	// its sandboxes IPv4 only).
	setSysctl("net/ipv6/conf/"+cfg.Bridge+"/disable_ipv6", "0")
	addr6 := &netlink.Addr{IPNet: &net.IPNet{IP: n.gw6.AsSlice(), Mask: net.CIDRMask(cfg.Subnet6.Bits(), 128)}, Flags: unix.IFA_F_NODAD}
	n.no6 = netlink.AddrReplace(br, addr6) != nil
	if err := netlink.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("bring up bridge %s: %w", cfg.Bridge, err)
	}
	// Forwarding on the bridge (and, while a sandbox has a UDP allowance,
	// on the uplinks its replies come in by), not the host's other
	// interfaces, for the UDP that allow_cidr rules let out; the forward
	// chain drops the rest. IPv6 needs force_forwarding (Linux 6.17+):
	// without it, UDP over IPv6 stays dropped even where a CIDR names it.
	// (Where /proc/sys is read-only, UDP stays dropped; TCP and DNS do not
	// need forwarding.)
	setSysctl("net/ipv4/conf/"+cfg.Bridge+"/forwarding", "1")
	setSysctl("net/ipv6/conf/"+cfg.Bridge+"/force_forwarding", "1")
	n.restoreUDP()
	if err := n.installRules(); err != nil {
		return nil, err
	}
	return n, nil
}

// installRules (re)places the nftables table, with the UDP sets holding
// n.udp.
func (n *Network) installRules() error {
	vars := map[string]any{
		"Table": n.cfg.Table, "Bridge": n.cfg.Bridge, "Gateway": n.gw, "Gateway6": n.gw6,
		"Transparent": n.cfg.Transparent, "DNS": n.cfg.DNS, "HTTPProxy": n.cfg.HTTPProxy,
	}
	for name, els := range n.setElements() {
		vars[name] = strings.Join(els, ", ")
	}
	var buf bytes.Buffer
	nftRules.Execute(&buf, vars)
	if out, err := nft(&buf); err != nil {
		return fmt.Errorf("install nftables rules (is the nftables package installed?): %v: %s", err, out)
	}
	return nil
}

func nft(script *bytes.Buffer) ([]byte, error) {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = script
	return cmd.CombinedOutput()
}

func setSysctl(name, value string) error {
	if err := os.WriteFile("/proc/sys/"+name, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s: %w", strings.ReplaceAll(name, "/", "."), err)
	}
	return nil
}

// v6 is the IPv6 address matching the bridge address a: Subnet6 with a's
// 32 bits last.
func (n *Network) v6(a netip.Addr) netip.Addr {
	b := n.cfg.Subnet6.Addr().As16()
	x := a.As4()
	copy(b[12:], x[:])
	return netip.AddrFrom16(b)
}

// Gateway is the bridge's address: where den's egress servers listen.
func (n *Network) Gateway() netip.Addr { return n.gw }

// Gateway6 is the bridge's IPv6 address: den's egress servers must listen
// there too (same ports) for sandboxes' IPv6 connections and DNS queries,
// which nftables sends to it.
func (n *Network) Gateway6() netip.Addr { return n.gw6 }

// Addr6 is the IPv6 address of the sandbox in slot.
func (n *Network) Addr6(slot int) (netip.Addr, error) {
	a, err := n.Addr(slot)
	if err != nil {
		return a, err
	}
	return n.v6(a), nil
}

// Addr is the address of the sandbox in slot.
func (n *Network) Addr(slot int) (netip.Addr, error) {
	a := n.gw
	for i := 0; i <= slot; i++ {
		a = a.Next()
	}
	if !n.cfg.Subnet.Contains(a) || a == n.broadcast() {
		return netip.Addr{}, fmt.Errorf("network: slot %d is outside %s", slot, n.cfg.Subnet)
	}
	return a, nil
}

func (n *Network) broadcast() netip.Addr {
	b := n.cfg.Subnet.Masked().Addr().As4()
	host := uint32(1)<<(32-n.cfg.Subnet.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// vethName is the host end of the slot's veth (the sandbox end is the
// same with "p", renamed eth0 inside). Interface names are host-wide, so a
// bridge other than den0 (a second daemon, a test) gets names of its own:
// "d" + a hash of the bridge name + "x" + slot.
func (n *Network) vethName(slot int) string {
	if n.cfg.Bridge == "den0" {
		return "dv" + strconv.FormatInt(int64(slot), 36)
	}
	h := fnv.New32a()
	h.Write([]byte(n.cfg.Bridge))
	return fmt.Sprintf("d%05xx%s", h.Sum32()&0xfffff, strconv.FormatInt(int64(slot), 36))
}

// Attach gives the network namespace of pid an eth0 on the bridge with the
// slot's address and a default route through the gateway.
func (n *Network) Attach(pid, slot int) (netip.Addr, error) {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("open network namespace of %d: %w", pid, err)
	}
	defer ns.Close()
	return n.attach(ns, slot)
}

// AttachPath is Attach for the network namespace pinned at path (see
// CreateNetNS), for tiers whose box process joins it later (gVisor's
// sandbox, a microVM's tap device).
func (n *Network) AttachPath(path string, slot int) (netip.Addr, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer ns.Close()
	return n.attach(ns, slot)
}

func (n *Network) attach(ns netns.NsHandle, slot int) (netip.Addr, error) {
	addr, err := n.Addr(slot)
	if err != nil {
		return addr, err
	}
	host := n.vethName(slot)
	peer := host + "p"
	n.Detach(slot) // a leftover from a box that died with the daemon
	la := netlink.NewLinkAttrs()
	la.Name = host
	la.MTU = 1500
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: peer}); err != nil {
		return addr, fmt.Errorf("create veth %s: %w", host, err)
	}
	ok := false
	defer func() {
		if !ok {
			n.Detach(slot)
		}
	}()
	hostLink, err := netlink.LinkByName(host)
	if err != nil {
		return addr, err
	}
	peerLink, err := netlink.LinkByName(peer)
	if err != nil {
		return addr, err
	}
	br, err := netlink.LinkByName(n.cfg.Bridge)
	if err != nil {
		return addr, fmt.Errorf("bridge %s: %w", n.cfg.Bridge, err)
	}
	if err := netlink.LinkSetMaster(hostLink, br); err != nil {
		return addr, fmt.Errorf("attach %s to %s: %w", host, n.cfg.Bridge, err)
	}
	// Isolated ports talk to the bridge (the gateway) only, never to each other.
	if err := netlink.LinkSetIsolated(hostLink, true); err != nil {
		return addr, fmt.Errorf("isolate %s: %w", host, err)
	}
	if err := netlink.LinkSetUp(hostLink); err != nil {
		return addr, err
	}
	if err := netlink.LinkSetNsFd(peerLink, int(ns)); err != nil {
		return addr, fmt.Errorf("move %s into the sandbox: %w", peer, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return addr, err
	}
	defer h.Close()
	inner, err := h.LinkByName(peer)
	if err != nil {
		return addr, err
	}
	if err := h.LinkSetName(inner, "eth0"); err != nil {
		return addr, err
	}
	ip := &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(n.cfg.Subnet.Bits(), 32)}}
	if err := h.AddrAdd(inner, ip); err != nil {
		return addr, fmt.Errorf("address eth0: %w", err)
	}
	// IPv6: the slot's address (no duplicate detection: the address is the
	// slot's alone, and DAD would hold it back for a second), and a default
	// route through the gateway. A namespace whose IPv6 is off keeps IPv4.
	if !n.no6 {
		if err := NoLinkLocal(h, inner); err != nil {
			return addr, err
		}
	}
	v6 := n.v6(addr)
	ip6 := &netlink.Addr{IPNet: &net.IPNet{IP: v6.AsSlice(), Mask: net.CIDRMask(n.cfg.Subnet6.Bits(), 128)}, Flags: unix.IFA_F_NODAD}
	has6 := !n.no6 && h.AddrAdd(inner, ip6) == nil
	if err := h.LinkSetUp(inner); err != nil {
		return addr, err
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: inner.Attrs().Index, Gw: n.gw.AsSlice()}); err != nil {
		return addr, fmt.Errorf("default route: %w", err)
	}
	if has6 {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: inner.Attrs().Index, Gw: n.gw6.AsSlice(), Family: netlink.FAMILY_V6}); err != nil {
			return addr, fmt.Errorf("default IPv6 route: %w", err)
		}
	}
	ok = true
	return addr, nil
}

// Detach removes the slot's veth (both ends) and its UDP allowances.
// Idempotent.
func (n *Network) Detach(slot int) error {
	n.mu.Lock()
	_, had := n.udp[slot]
	n.mu.Unlock()
	if had {
		if err := n.SetUDPAllow(slot, nil); err != nil {
			return err
		}
	}
	l, err := netlink.LinkByName(n.vethName(slot))
	if err != nil {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil && !strings.Contains(err.Error(), "no such") {
		return fmt.Errorf("remove veth: %w", err)
	}
	return nil
}

// Slot is the slot whose sandbox has address a (IPv4 or IPv6).
func (n *Network) Slot(a netip.Addr) (int, bool) {
	a = a.WithZone("").Unmap()
	if a.Is6() && n.cfg.Subnet6.Contains(a) {
		b := a.As16()
		if a4 := netip.AddrFrom4([4]byte(b[12:])); n.v6(a4) == a {
			a = a4
		}
	}
	if !a.Is4() || !n.cfg.Subnet.Contains(a) {
		return 0, false
	}
	g, x := n.gw.As4(), a.As4()
	gv := uint32(g[0])<<24 | uint32(g[1])<<16 | uint32(g[2])<<8 | uint32(g[3])
	xv := uint32(x[0])<<24 | uint32(x[1])<<16 | uint32(x[2])<<8 | uint32(x[3])
	if xv <= gv {
		return 0, false
	}
	return int(xv-gv) - 1, true
}

// Ports are the egress ports this network redirects to.
func (n *Network) Ports() (transparent, dns, httpProxy int) {
	return n.cfg.Transparent, n.cfg.DNS, n.cfg.HTTPProxy
}

// Subnet is the bridge's subnet: no sandbox may reach it (other sandboxes).
func (n *Network) Subnet() netip.Prefix { return n.cfg.Subnet.Masked() }

// Subnet6 is the bridge's IPv6 prefix: no sandbox may reach it either.
func (n *Network) Subnet6() netip.Prefix { return n.cfg.Subnet6 }

// shape limits a link's transmit rate with a token bucket (0 removes it).
func shape(h *netlink.Handle, link netlink.Link, rate int64) error {
	if rate <= 0 {
		qs, _ := h.QdiscList(link)
		for _, q := range qs {
			if _, ok := q.(*netlink.Tbf); ok {
				h.QdiscDel(q)
			}
		}
		return nil
	}
	burst := uint32(max(rate/10, 16<<10)) // 100 ms of traffic, at least 16 KiB
	q := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate:       uint64(rate),
		Limit:      burst * 2,
		Buffer:     netlink.Xmittime(uint64(rate), burst),
	}
	return h.QdiscReplace(q)
}

// SetBandwidth limits the slot's traffic each way to rate bytes per
// second (0: unlimited): the host end of the veth shapes what the sandbox
// receives, the sandbox's eth0 what it sends.
func (n *Network) SetBandwidth(pid, slot int, rate int64) error {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return err
	}
	defer ns.Close()
	return n.setBandwidth(ns, slot, rate)
}

// SetBandwidthPath is SetBandwidth for a namespace pinned at path.
func (n *Network) SetBandwidthPath(path string, slot int, rate int64) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	return n.setBandwidth(ns, slot, rate)
}

func (n *Network) setBandwidth(ns netns.NsHandle, slot int, rate int64) error {
	host, err := netlink.LinkByName(n.vethName(slot))
	if err != nil {
		return fmt.Errorf("sandbox interface: %w", err)
	}
	hh, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer hh.Close()
	if err := shape(hh, host, rate); err != nil {
		return fmt.Errorf("shape %s: %w", n.vethName(slot), err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := shape(h, eth, rate); err != nil {
		return fmt.Errorf("shape eth0: %w", err)
	}
	return nil
}

// SetUDPAllow sets the UDP destinations the sandbox in slot may reach
// (its allow_cidr rules, IPv4 and IPv6; IPv4-mapped prefixes count as
// IPv4): its datagrams to them are forwarded and masqueraded, replies come
// back, and every other datagram is dropped (DNS excepted: it goes to
// den's DNS whatever its destination). nil takes every allowance away.
// Denied datagrams are counted by the forward chain's drop rule, not
// logged one by one.
func (n *Network) SetUDPAllow(slot int, cidrs []netip.Prefix) error {
	if _, err := n.Addr(slot); err != nil {
		return err
	}
	var keep []netip.Prefix
	for _, c := range cidrs {
		if !c.IsValid() {
			continue
		}
		a, bits := c.Addr().WithZone(""), c.Bits()
		if a.Is4In6() && bits >= 96 {
			a, bits = a.Unmap(), bits-96
		}
		keep = append(keep, netip.PrefixFrom(a, bits).Masked())
	}
	keep = outermost(keep)
	n.mu.Lock()
	defer n.mu.Unlock()
	if slices.Equal(n.udp[slot], keep) && (len(keep) > 0 || n.udp[slot] == nil) {
		return nil
	}
	old, had := n.udp[slot]
	if len(keep) == 0 {
		delete(n.udp, slot)
	} else {
		n.udp[slot] = keep
	}
	// The uplinks replies come in by must forward them: den turns
	// forwarding on there (guarded: only replies to the bridge pass), and
	// off again when no sandbox has a UDP allowance left.
	var flip [2][]string
	for _, p := range keep {
		fam := 0
		if p.Addr().Is6() {
			fam = 1
		}
		for _, dev := range n.uplinks(p) {
			if !n.guards[fam][dev] && sysctlValue(forwardingKey(fam, dev)) == "0" && (fam == 0 || sysctlValue("net/ipv6/conf/all/forwarding") == "0") {
				n.guards[fam][dev] = true
				flip[fam] = append(flip[fam], dev)
			}
		}
	}
	var unflip [2][]string
	if len(n.udp) == 0 {
		for fam := range n.guards {
			for dev := range n.guards[fam] {
				unflip[fam] = append(unflip[fam], dev)
			}
		}
		for fam := range unflip { // forwarding off before the guards go
			for _, dev := range unflip[fam] {
				setSysctl(forwardingKey(fam, dev), "0")
				delete(n.guards[fam], dev)
			}
		}
	}
	var b bytes.Buffer
	for name, els := range n.setElements() {
		fmt.Fprintf(&b, "flush set inet %s %s\n", n.cfg.Table, name)
		if len(els) > 0 {
			fmt.Fprintf(&b, "add element inet %s %s { %s }\n", n.cfg.Table, name, strings.Join(els, ", "))
		}
	}
	if out, err := nft(&b); err != nil {
		if had {
			n.udp[slot] = old
		} else {
			delete(n.udp, slot)
		}
		for fam := range flip {
			for _, dev := range flip[fam] {
				delete(n.guards[fam], dev)
			}
		}
		return fmt.Errorf("sandbox UDP rules: %v: %s", err, bytes.TrimSpace(out))
	}
	for fam := range flip { // the guards are in place: forwarding on (where /proc/sys lets den: else no replies)
		for _, dev := range flip[fam] {
			setSysctl(forwardingKey(fam, dev), "1")
		}
	}
	return nil
}

// forwardingKey is the sysctl that lets dev forward what it receives:
// IPv4 conf/DEV/forwarding, IPv6 conf/DEV/force_forwarding (Linux 6.17).
func forwardingKey(fam int, dev string) string {
	if fam == 0 {
		return "net/ipv4/conf/" + dev + "/forwarding"
	}
	return "net/ipv6/conf/" + dev + "/force_forwarding"
}

func sysctlValue(name string) string {
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// uplinks are the interfaces by which the host reaches p (found when the
// rule is set), the bridge and loopback excepted.
func (n *Network) uplinks(p netip.Prefix) []string {
	rs, err := netlink.RouteGet(p.Masked().Addr().AsSlice())
	if err != nil {
		return nil
	}
	var out []string
	for _, r := range rs {
		l, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		if name := l.Attrs().Name; name != n.cfg.Bridge && name != "lo" && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// outermost sorts ps and drops the prefixes another one contains (nft
// refuses overlapping intervals).
func outermost(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	var out []netip.Prefix
	for _, p := range ps {
		if len(out) > 0 && out[len(out)-1].Bits() <= p.Bits() && out[len(out)-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// setElements are the elements of the table's sets, by set name, for
// n.udp and n.guards. Call with n.mu held (or before n is shared).
func (n *Network) setElements() map[string][]string {
	u4, u6 := n.udpElements()
	sets := map[string][]string{"udp4": u4, "udp6": u6, "guard4": nil, "guard6": nil}
	for fam, name := range []string{"guard4", "guard6"} {
		for dev := range n.guards[fam] {
			sets[name] = append(sets[name], strconv.Quote(dev))
		}
		slices.Sort(sets[name])
	}
	return sets
}

// udpElements are the elements of the sets udp4 and udp6 for n.udp.
func (n *Network) udpElements() (u4, u6 []string) {
	slots := make([]int, 0, len(n.udp))
	for s := range n.udp {
		slots = append(slots, s)
	}
	slices.Sort(slots)
	for _, s := range slots {
		a, err := n.Addr(s)
		if err != nil {
			continue
		}
		for _, p := range n.udp[s] {
			if p.Addr().Is4() {
				u4 = append(u4, a.String()+" . "+p.String())
			} else {
				u6 = append(u6, n.v6(a).String()+" . "+p.String())
			}
		}
	}
	return u4, u6
}

// restoreUDP reads the UDP allowances a previous daemon left in the table
// (its sandboxes may still run) into n.udp, so that replacing the table
// keeps them.
func (n *Network) restoreUDP() {
	for fam, devs := range listedGuards(n.cfg.Table) {
		for _, dev := range devs {
			n.guards[fam][dev] = true
		}
	}
	for _, set := range []string{"udp4", "udp6"} {
		out, err := exec.Command("nft", "list", "set", "inet", n.cfg.Table, set).Output()
		if err != nil {
			continue
		}
		for _, el := range listedElements(string(out)) {
			src, dst, ok := strings.Cut(el, " . ")
			if !ok {
				continue
			}
			a, err := netip.ParseAddr(strings.TrimSpace(src))
			if err != nil {
				continue
			}
			p, err := parsePrefixOrAddr(strings.TrimSpace(dst))
			if err != nil {
				continue
			}
			if slot, ok := n.Slot(a); ok {
				n.udp[slot] = outermost(append(n.udp[slot], p))
			}
		}
	}
}

// listedGuards reads the uplinks of the sets guard4 and guard6 of table:
// those den turned forwarding on.
func listedGuards(table string) (devs [2][]string) {
	for fam, set := range []string{"guard4", "guard6"} {
		out, err := exec.Command("nft", "list", "set", "inet", table, set).Output()
		if err != nil {
			continue
		}
		for _, el := range listedElements(string(out)) {
			if dev, err := strconv.Unquote(el); err == nil {
				devs[fam] = append(devs[fam], dev)
			}
		}
	}
	return devs
}

// HasTable reports whether the nftables table (family inet) exists.
func HasTable(table string) bool {
	return exec.Command("nft", "list", "table", "inet", table).Run() == nil
}

// RemoveNetwork deletes what NewNetwork made for bridge, for den system
// reset once no daemon uses it: the nftables table (its name from
// TableName when table is ""), after turning forwarding off again on the
// uplinks its guard sets name (den turned it on there), and the bridge. It
// returns what it removed: nothing when neither exists.
func RemoveNetwork(bridge, table string) ([]string, error) {
	if table == "" {
		table = TableName(bridge)
	}
	var gone []string
	var errs []error
	if HasTable(table) {
		for fam, devs := range listedGuards(table) {
			for _, dev := range devs {
				if setSysctl(forwardingKey(fam, dev), "0") == nil {
					gone = append(gone, "forwarding on "+dev+" (den had turned it on)")
				}
			}
		}
		if out, err := exec.Command("nft", "delete", "table", "inet", table).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("delete nftables table inet %s: %v: %s", table, err, bytes.TrimSpace(out)))
		} else {
			gone = append(gone, "nftables table inet "+table)
		}
	}
	if bridge != "" {
		if l, err := netlink.LinkByName(bridge); err == nil {
			if _, ok := l.(*netlink.Bridge); !ok {
				errs = append(errs, fmt.Errorf("link %s is a %s, not den's bridge: not removing it", bridge, l.Type()))
			} else if err := netlink.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete bridge %s: %w", bridge, err))
			} else {
				gone = append(gone, "bridge "+bridge)
			}
		}
	}
	return gone, errors.Join(errs...)
}

// listedElements extracts the elements of "nft list set" output.
func listedElements(out string) []string {
	_, rest, ok := strings.Cut(out, "elements = {")
	if !ok {
		return nil
	}
	body, _, ok := strings.Cut(rest, "}")
	if !ok {
		return nil
	}
	var els []string
	for _, e := range strings.Split(body, ",") {
		if e = strings.TrimSpace(e); e != "" {
			els = append(els, e)
		}
	}
	return els
}

func parsePrefixOrAddr(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// pinBridgeMAC gives the bridge a MAC address of its own (locally
// administered, from its name) unless one was set. Left to the kernel, a
// bridge takes the lowest MAC among its ports and changes it when a sandbox
// with a lower one joins: every other sandbox's ARP entry for the gateway
// then points at a MAC nobody answers to, and its DNS and proxied
// connections go nowhere until the entry goes stale.
func pinBridgeMAC(br netlink.Link) error {
	b, err := os.ReadFile("/sys/class/net/" + br.Attrs().Name + "/addr_assign_type")
	if err == nil && strings.TrimSpace(string(b)) == "3" { // NET_ADDR_SET
		return nil
	}
	h := fnv.New64a()
	h.Write([]byte("den bridge " + br.Attrs().Name))
	sum := h.Sum(nil)
	mac := net.HardwareAddr{0x02, sum[0], sum[1], sum[2], sum[3], sum[4]}
	if err := netlink.LinkSetHardwareAddr(br, mac); err != nil {
		return fmt.Errorf("set its MAC address: %w", err)
	}
	return nil
}
