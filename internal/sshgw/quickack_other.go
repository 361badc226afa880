//go:build !linux

package sshgw

import "net"

func quickAck(c net.Conn) net.Conn { return c }
