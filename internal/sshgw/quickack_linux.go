package sshgw

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// quickAck makes the kernel acknowledge what the client sends at once.
// OpenSSH's client leaves Nagle's algorithm on until it opens an
// interactive session, and writes some handshake messages in two parts
// (NEWKEYS, then the service request): with Linux's delayed
// acknowledgements (40 ms) each such pair would wait for a timer. The
// kernel leaves quick-ack mode by itself, so it is set again before every
// read.
func quickAck(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &quickAckConn{TCPConn: tc, raw: raw}
}

type quickAckConn struct {
	*net.TCPConn
	raw syscall.RawConn
}

func (q *quickAckConn) Read(p []byte) (int, error) {
	q.raw.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1)
	})
	return q.TCPConn.Read(p)
}
