package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// ip6tSoOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/ip6_tables.h.
const ip6tSoOriginalDst = 80

// originalDst asks conntrack where a redirected connection was going:
// getsockopt(SOL_IP, SO_ORIGINAL_DST) for IPv4, (SOL_IPV6,
// IP6T_SO_ORIGINAL_DST) for IPv6.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("original destination: %T has no socket", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	v4 := addrPortOf(c.LocalAddr()).Addr().Is4()
	var res netip.AddrPort
	var gerr error
	cerr := rc.Control(func(fd uintptr) {
		if v4 {
			m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
			if err == nil {
				// m.Multiaddr holds a struct sockaddr_in.
				b := m.Multiaddr
				if binary.NativeEndian.Uint16(b[0:2]) != unix.AF_INET {
					gerr = errors.New("SO_ORIGINAL_DST: not an IPv4 address")
					return
				}
				res = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), binary.BigEndian.Uint16(b[2:4]))
				return
			}
			gerr = fmt.Errorf("SO_ORIGINAL_DST: %w", err)
		}
		info, err := unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, ip6tSoOriginalDst)
		if err != nil {
			if gerr == nil {
				gerr = fmt.Errorf("IP6T_SO_ORIGINAL_DST: %w", err)
			}
			return
		}
		var pb [2]byte
		binary.NativeEndian.PutUint16(pb[:], info.Addr.Port)
		res = netip.AddrPortFrom(normAddr(netip.AddrFrom16(info.Addr.Addr)), binary.BigEndian.Uint16(pb[:]))
		gerr = nil
	})
	if cerr != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", cerr)
	}
	if gerr != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", gerr)
	}
	if !res.IsValid() || res.Port() == 0 {
		return netip.AddrPort{}, errors.New("original destination: none")
	}
	return res, nil
}
