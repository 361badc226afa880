//go:build !linux

package egress

import (
	"errors"
	"net"
	"net/netip"
)

func originalDst(c net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("original destination: only on Linux")
}
