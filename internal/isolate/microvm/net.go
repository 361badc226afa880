package microvm

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The box's network namespace (pinned at RUNDIR/netns) gets eth0 from
// den's Network exactly as a linux-tier box does. The guest must own the
// slot's address, so its addresses and routes move to the guest (on the
// kernel command line), and a tap device in the same namespace is wired
// to eth0 with tc: everything arriving on one is redirected out of the
// other (u32 + mirred). The guest's packets thus leave through the
// slot's veth with the slot's source address, under the same nftables
// rules and egress proxy; eth0's qdisc (SetBandwidthPath) shapes them.
// Only frames from the box's own MAC go out: a guest restored from
// another box's checkpoint sends from that box's MAC and addresses until
// the daemon has given it its own (see applyIdentity), and none of that
// may reach the bridge, whose forwarding table would send the other
// box's frames here.

const tapName = "tap0"

// wireTap moves eth0's configuration out of the namespace at nsPath,
// creates the tap device wired to eth0 (passing the guest's frames only
// if they come from mac), and returns its descriptor (for QEMU's -netdev
// tap,fd=N) and the guest's network configuration.
func wireTap(nsPath string, mac net.HardwareAddr) (*os.File, *guestNet, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, nil, fmt.Errorf("open network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, nil, err
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return nil, nil, fmt.Errorf("the box's eth0: %w", err)
	}
	gn := &guestNet{MTU: eth.Attrs().MTU}
	routes, _ := h.RouteList(eth, netlink.FAMILY_ALL)
	for _, r := range routes {
		if r.Gw != nil && (r.Dst == nil || r.Dst.IP.IsUnspecified()) {
			if r.Gw.To4() != nil {
				gn.GW = r.Gw.String()
			} else {
				gn.GW6 = r.Gw.String()
			}
		}
		h.RouteDel(&r)
	}
	addrs, _ := h.AddrList(eth, netlink.FAMILY_ALL)
	for _, a := range addrs {
		if a.Scope != unix.RT_SCOPE_UNIVERSE {
			continue
		}
		gn.Addrs = append(gn.Addrs, a.IPNet.String())
		h.AddrDel(eth, &a)
	}
	// The tap is made on a thread inside the namespace; the thread is
	// never given back (it ends with its goroutine).
	type res struct {
		f   *os.File
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			ch <- res{nil, fmt.Errorf("enter network namespace: %w", err)}
			return
		}
		// eth0 only carries the guest's frames now: no IPv6 of its own.
		os.WriteFile("/proc/sys/net/ipv6/conf/eth0/disable_ipv6", []byte("1"), 0)
		f, err := openTap(tapName)
		if err == nil {
			// The guest's frames from another MAC end in the tap's stack.
			os.WriteFile("/proc/sys/net/ipv6/conf/"+tapName+"/disable_ipv6", []byte("1"), 0)
		}
		ch <- res{f, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, nil, r.err
	}
	ok := false
	defer func() {
		if !ok {
			r.f.Close()
		}
	}()
	tap, err := h.LinkByName(tapName)
	if err != nil {
		return nil, nil, err
	}
	h.LinkSetMTU(tap, gn.MTU)
	if err := h.LinkSetUp(tap); err != nil {
		return nil, nil, err
	}
	if err := redirect(h, eth, tap, nil); err != nil {
		return nil, nil, err
	}
	if err := redirect(h, tap, eth, mac); err != nil {
		return nil, nil, err
	}
	ok = true
	return r.f, gn, nil
}

// redirect sends every frame arriving on from out of to; with src, only
// the frames from that MAC. The others go up from's own stack in the
// namespace, which has no address, no forwarding and no IPv6: nowhere.
// (A drop action would need act_gact, which not every kernel has.)
func redirect(h *netlink.Handle, from, to netlink.Link, src net.HardwareAddr) error {
	q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: from.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
	h.QdiscDel(q)
	if err := h.QdiscAdd(q); err != nil {
		return fmt.Errorf("ingress qdisc on %s: %w", from.Attrs().Name, err)
	}
	// u32 (matchall is not in every kernel): with no key it matches every
	// frame. On ingress the offsets count from the network header, so
	// the source MAC is at -8 (as tc's "match ether src").
	keys := []netlink.TcU32Key{{Mask: 0, Val: 0, Off: 0}}
	if src != nil {
		if len(src) != 6 {
			return fmt.Errorf("guest MAC %v: want 6 bytes", src)
		}
		keys = []netlink.TcU32Key{
			{Mask: 0xffffffff, Val: binary.BigEndian.Uint32(src[:4]), Off: -8},
			{Mask: 0xffff0000, Val: uint32(binary.BigEndian.Uint16(src[4:])) << 16, Off: -4},
		}
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: from.Attrs().Index, Parent: netlink.MakeHandle(0xffff, 0), Priority: 1, Protocol: unix.ETH_P_ALL},
		Sel:         &netlink.TcU32Sel{Flags: nl.TC_U32_TERMINAL, Keys: keys},
		Actions:     []netlink.Action{netlink.NewMirredAction(to.Attrs().Index)},
	}
	if err := h.FilterAdd(f); err != nil {
		return fmt.Errorf("redirect %s to %s: %w", from.Attrs().Name, to.Attrs().Name, err)
	}
	return nil
}

// openTap creates a tap device in the calling thread's namespace; it
// lives as long as the descriptor.
func openTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	var ifr [unix.IFNAMSIZ + 64]byte
	copy(ifr[:], name)
	*(*uint16)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("create tap %s: %w", name, e)
	}
	return os.NewFile(uintptr(fd), "tap"), nil
}

// netCounters reads eth0's counters in the namespace at nsPath.
func netCounters(nsPath string) (rx, tx int64, err error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return 0, 0, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return 0, 0, err
	}
	defer h.Close()
	l, err := h.LinkByName("eth0")
	if err != nil {
		return 0, 0, err
	}
	if s := l.Attrs().Statistics; s != nil {
		// Everything eth0 receives goes to the guest, everything it
		// sends came from it.
		return int64(s.RxBytes), int64(s.TxBytes), nil
	}
	return 0, 0, nil
}

// guestMAC is a locally administered MAC for the box.
func guestMAC(id string) string {
	var h uint32 = 2166136261
	for i := 0; i < len(id); i++ {
		h = (h ^ uint32(id[i])) * 16777619
	}
	return net.HardwareAddr{0x02, 0xde, byte(h >> 24), byte(h >> 16), byte(h >> 8), byte(h)}.String()
}
