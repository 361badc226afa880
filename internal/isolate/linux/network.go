package linux

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"text/template"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// NetworkConfig describes the host side of sandbox networking.
type NetworkConfig struct {
	Bridge string       // default "den0"
	Table  string       // nftables table (family inet), default "den"
	Subnet netip.Prefix // IPv4 subnet of the bridge, default 10.88.0.0/16; the first host address is the gateway
	// Ports of den's egress servers on the gateway address: every TCP
	// connection a sandbox makes is redirected to Transparent, every DNS
	// query to DNS; HTTPProxy serves tools that honour HTTP(S)_PROXY.
	Transparent, DNS, HTTPProxy int
}

// Network is the host side of sandbox networking: one bridge, one veth per
// networked sandbox (ports isolated from each other), and nftables rules
// that send every sandbox connection to den's egress proxy and DNS, forward
// nothing, and accept nothing else on the host. A sandbox without network
// keeps only its loopback.
type Network struct {
	cfg NetworkConfig
	gw  netip.Addr
}

var nftRules = template.Must(template.New("nft").Parse(`table inet {{.Table}}
delete table inet {{.Table}}
table inet {{.Table}} {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "{{.Bridge}}" meta l4proto { tcp, udp } th dport 53 redirect to :{{.DNS}}
		iifname "{{.Bridge}}" ip daddr {{.Gateway}} tcp dport {{.HTTPProxy}} accept
		iifname "{{.Bridge}}" meta l4proto tcp redirect to :{{.Transparent}}
	}
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "{{.Bridge}}" ct state established,related accept
		iifname "{{.Bridge}}" ip daddr {{.Gateway}} tcp dport { {{.Transparent}}, {{.DNS}}, {{.HTTPProxy}} } accept
		iifname "{{.Bridge}}" ip daddr {{.Gateway}} udp dport {{.DNS}} accept
		iifname "{{.Bridge}}" drop
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname "{{.Bridge}}" drop
		oifname "{{.Bridge}}" drop
	}
}
`))

// NewNetwork creates (or adopts) the bridge and installs the rules.
func NewNetwork(cfg NetworkConfig) (*Network, error) {
	if cfg.Bridge == "" {
		cfg.Bridge = "den0"
	}
	if cfg.Table == "" {
		cfg.Table = "den"
	}
	if !cfg.Subnet.IsValid() {
		cfg.Subnet = netip.MustParsePrefix("10.88.0.0/16")
	}
	if cfg.Transparent == 0 || cfg.DNS == 0 || cfg.HTTPProxy == 0 {
		return nil, fmt.Errorf("network: the egress ports are not set")
	}
	n := &Network{cfg: cfg, gw: cfg.Subnet.Masked().Addr().Next()}
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
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.gw.AsSlice(), Mask: net.CIDRMask(cfg.Subnet.Bits(), 32)}}
	if err := netlink.AddrReplace(br, addr); err != nil {
		return nil, fmt.Errorf("address bridge %s: %w", cfg.Bridge, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("bring up bridge %s: %w", cfg.Bridge, err)
	}
	var buf bytes.Buffer
	nftRules.Execute(&buf, map[string]any{
		"Table": cfg.Table, "Bridge": cfg.Bridge, "Gateway": n.gw,
		"Transparent": cfg.Transparent, "DNS": cfg.DNS, "HTTPProxy": cfg.HTTPProxy,
	})
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("install nftables rules (is the nftables package installed?): %v: %s", err, out)
	}
	return n, nil
}

// Gateway is the bridge's address: where den's egress servers listen.
func (n *Network) Gateway() netip.Addr { return n.gw }

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

func vethName(slot int) string { return "dv" + strconv.FormatInt(int64(slot), 36) }

// Attach gives the network namespace of pid an eth0 on the bridge with the
// slot's address and a default route through the gateway.
func (n *Network) Attach(pid, slot int) (netip.Addr, error) {
	addr, err := n.Addr(slot)
	if err != nil {
		return addr, err
	}
	host := vethName(slot)
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
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return addr, fmt.Errorf("open network namespace of %d: %w", pid, err)
	}
	defer ns.Close()
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
	if err := h.LinkSetUp(inner); err != nil {
		return addr, err
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: inner.Attrs().Index, Gw: n.gw.AsSlice()}); err != nil {
		return addr, fmt.Errorf("default route: %w", err)
	}
	ok = true
	return addr, nil
}

// Detach removes the slot's veth (both ends). Idempotent.
func (n *Network) Detach(slot int) error {
	l, err := netlink.LinkByName(vethName(slot))
	if err != nil {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil && !strings.Contains(err.Error(), "no such") {
		return fmt.Errorf("remove veth: %w", err)
	}
	return nil
}

// Slot is the slot whose sandbox has address a.
func (n *Network) Slot(a netip.Addr) (int, bool) {
	a = a.Unmap()
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

// DialInside connects to 127.0.0.1:port in the box's network namespace:
// the socket is made on a thread that has entered that namespace, so it
// reaches servers bound to the box's loopback, with or without a network.
func (b *box) DialInside(ctx context.Context, port int) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is left locked (and so discarded when this goroutine
		// ends) if it could not go back to the daemon's namespace.
		orig, err := netns.Get()
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPid(b.pid)
		if err != nil {
			ch <- result{nil, fmt.Errorf("sandbox network namespace: %w", err)}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			ch <- result{nil, err}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

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
	host, err := netlink.LinkByName(vethName(slot))
	if err != nil {
		return fmt.Errorf("sandbox interface: %w", err)
	}
	hh, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer hh.Close()
	if err := shape(hh, host, rate); err != nil {
		return fmt.Errorf("shape %s: %w", vethName(slot), err)
	}
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return err
	}
	defer ns.Close()
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
