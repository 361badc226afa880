package sshgw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/crypto/ssh"

	"github.com/den-dev/den/api"
)

// directTCPIP is the payload of a direct-tcpip channel (RFC 4254, 7.2).
type directTCPIP struct {
	Host       string
	Port       uint32
	OriginHost string
	OriginPort uint32
}

// insideHosts are the destinations that mean "this sandbox": ssh -L
// LOCAL:localhost:PORT reaches PORT on the sandbox's loopback (servers
// bound to its 127.0.0.1 or to every address alike).
var insideHosts = map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true, "0.0.0.0": true, "::": true, "": true}

// forward serves ssh -L: a connection to a port inside the sandbox, through
// den's port-dial route.
func (g *Gateway) forward(ctx context.Context, l *login, nch ssh.NewChannel) {
	var d directTCPIP
	if err := ssh.Unmarshal(nch.ExtraData(), &d); err != nil {
		nch.Reject(ssh.ConnectionFailed, "bad direct-tcpip request")
		return
	}
	if !insideHosts[d.Host] {
		msg := fmt.Sprintf("den forwards only to ports inside the sandbox: use -L LOCAL:localhost:PORT (not %s)", d.Host)
		g.cfg.Log.Info("ssh: forward refused", "sandbox", l.sb.ID, "to", net.JoinHostPort(d.Host, fmt.Sprint(d.Port)), "why", msg)
		nch.Reject(ssh.Prohibited, msg)
		return
	}
	if d.Port < 1 || d.Port > 65535 {
		nch.Reject(ssh.ConnectionFailed, fmt.Sprintf("%d is not a TCP port", d.Port))
		return
	}
	conn, err := l.c.DialPort(ctx, l.sb.ID, int(d.Port))
	if err != nil {
		msg := err.Error()
		var ae *api.Error
		if errors.As(err, &ae) {
			msg = ae.Message
		}
		g.cfg.Log.Debug("ssh: forward refused", "sandbox", l.sb.ID, "port", d.Port, "err", err)
		nch.Reject(ssh.ConnectionFailed, msg)
		return
	}
	ch, reqs, err := nch.Accept()
	if err != nil {
		conn.Close()
		return
	}
	pipe(ctx, ch, reqs, conn)
}

// pipe copies between an SSH channel and a connection until the server's
// side ends (or the SSH connection does). The port route has no half-close,
// so the client's end of input leaves the connection open for the answer;
// the channel's close (which ends reqs) closes it.
func pipe(ctx context.Context, ch ssh.Channel, reqs <-chan *ssh.Request, conn net.Conn) {
	stop := context.AfterFunc(ctx, func() { conn.Close(); ch.Close() })
	defer stop()
	go func() {
		ssh.DiscardRequests(reqs)
		conn.Close()
	}()
	defer ch.Close()
	defer conn.Close()
	go io.Copy(conn, ch)
	io.Copy(ch, conn)
	ch.CloseWrite()
}
