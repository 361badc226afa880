package egress

import (
	"net/netip"
	"strings"
)

// ParseIP parses s as an IP address in every form a sandbox's C library or
// tools accept: IPv6 (optionally in brackets, with an optional zone that is
// dropped), and IPv4 in all inet_aton forms — dotted quad, "a.b.c", "a.b",
// a single 32-bit number, each part decimal, octal (leading 0) or hex
// (leading 0x) — with an optional trailing dot. IPv4-mapped IPv6 addresses
// come back as IPv4. ok is false when s is not an address in any form.
func ParseIP(s string) (a netip.Addr, ok bool) {
	if len(s) == 0 || len(s) > 256 {
		return netip.Addr{}, false
	}
	if s[0] == '[' {
		if len(s) < 2 || s[len(s)-1] != ']' {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(s[1 : len(s)-1])
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		return normAddr(a), true
	}
	if strings.IndexByte(s, ':') >= 0 {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		return normAddr(a), true
	}
	return parseInetAton(strings.TrimSuffix(s, "."))
}

// parseInetAton follows glibc's inet_aton, minus its acceptance of trailing
// white space and garbage.
func parseInetAton(s string) (netip.Addr, bool) {
	var parts [4]uint64
	n := 0
	i := 0
	for {
		if n == 4 || i >= len(s) || s[i] < '0' || s[i] > '9' {
			return netip.Addr{}, false
		}
		base := uint64(10)
		digits := 0
		if s[i] == '0' {
			i++
			if i < len(s) && (s[i] == 'x' || s[i] == 'X') {
				base = 16
				i++
			} else {
				base = 8
				digits = 1
			}
		}
		var v uint64
		for i < len(s) {
			c := s[i]
			var d uint64
			switch {
			case c >= '0' && c <= '9':
				d = uint64(c - '0')
				if base == 8 && d > 7 {
					return netip.Addr{}, false
				}
			case base == 16 && c >= 'a' && c <= 'f':
				d = uint64(c-'a') + 10
			case base == 16 && c >= 'A' && c <= 'F':
				d = uint64(c-'A') + 10
			default:
				goto endPart
			}
			v = v*base + d
			if v > 0xffffffff {
				return netip.Addr{}, false
			}
			digits++
			i++
		}
	endPart:
		if digits == 0 {
			return netip.Addr{}, false
		}
		parts[n] = v
		n++
		if i == len(s) {
			break
		}
		if s[i] != '.' {
			return netip.Addr{}, false
		}
		i++
	}
	var v uint32
	switch n {
	case 1:
		v = uint32(parts[0])
	case 2:
		if parts[0] > 0xff || parts[1] > 0xffffff {
			return netip.Addr{}, false
		}
		v = uint32(parts[0])<<24 | uint32(parts[1])
	case 3:
		if parts[0] > 0xff || parts[1] > 0xff || parts[2] > 0xffff {
			return netip.Addr{}, false
		}
		v = uint32(parts[0])<<24 | uint32(parts[1])<<16 | uint32(parts[2])
	case 4:
		for _, p := range parts {
			if p > 0xff {
				return netip.Addr{}, false
			}
		}
		v = uint32(parts[0])<<24 | uint32(parts[1])<<16 | uint32(parts[2])<<8 | uint32(parts[3])
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}
