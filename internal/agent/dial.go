package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/den-dev/den/api"
)

// dialProto is the Upgrade protocol of GET /dial: after the 101 answer the
// connection carries the bytes of a TCP connection the agent made to a
// port on the sandbox's own loopback. Tiers whose loopback the daemon
// cannot reach directly (gVisor's netstack, a microVM's kernel) forward
// ports this way.
const dialProto = "den-tcp"

func (a *Agent) handleDial(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.URL.Query().Get("port"))
	if err != nil || port < 1 || port > 65535 {
		WriteError(w, api.FieldError("port", "%q is not a port number (1-65535)", r.URL.Query().Get("port")))
		return
	}
	if r.Header.Get("Upgrade") != dialProto {
		WriteError(w, api.Errorf(api.KindInvalid, "dial needs Upgrade: %s", dialProto))
		return
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(r.Context(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		c, err = d.DialContext(r.Context(), "tcp", net.JoinHostPort("::1", strconv.Itoa(port)))
	}
	if err != nil {
		WriteError(w, api.Errorf(api.KindConflict, "nothing answers on port %d: %v", port, err))
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		c.Close()
		WriteError(w, fmt.Errorf("dial: connection cannot be taken over"))
		return
	}
	w.Header().Set("Connection", "Upgrade")
	w.Header().Set("Upgrade", dialProto)
	w.WriteHeader(http.StatusSwitchingProtocols)
	conn, brw, err := hj.Hijack()
	if err != nil {
		c.Close()
		return
	}
	// Bytes the client sent after its request are already buffered.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		c.Write(b)
	}
	splice(conn, c)
}

// splice copies both ways until both directions end.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
	a.Close()
	b.Close()
}

// DialPort connects to a TCP port on the sandbox's loopback through the
// agent.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://agent"+PathDial+"?"+url.Values{"port": {strconv.Itoa(port)}}.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", dialProto)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent dial: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, fmt.Errorf("agent dial: the answer is not a connection")
	}
	return &upgradedConn{rwc: rwc}, nil
}

// upgradedConn is the net.Conn shape of an upgraded agent connection.
type upgradedConn struct {
	rwc io.ReadWriteCloser
}

func (u *upgradedConn) Read(p []byte) (int, error)  { return u.rwc.Read(p) }
func (u *upgradedConn) Write(p []byte) (int, error) { return u.rwc.Write(p) }
func (u *upgradedConn) Close() error                { return u.rwc.Close() }
func (u *upgradedConn) LocalAddr() net.Addr         { return agentAddr{} }
func (u *upgradedConn) RemoteAddr() net.Addr        { return agentAddr{} }
func (u *upgradedConn) SetDeadline(t time.Time) error {
	if d, ok := u.rwc.(interface{ SetDeadline(time.Time) error }); ok {
		return d.SetDeadline(t)
	}
	return nil
}
func (u *upgradedConn) SetReadDeadline(t time.Time) error {
	if d, ok := u.rwc.(interface{ SetReadDeadline(time.Time) error }); ok {
		return d.SetReadDeadline(t)
	}
	return nil
}
func (u *upgradedConn) SetWriteDeadline(t time.Time) error {
	if d, ok := u.rwc.(interface{ SetWriteDeadline(time.Time) error }); ok {
		return d.SetWriteDeadline(t)
	}
	return nil
}

type agentAddr struct{}

func (agentAddr) Network() string { return "agent" }
func (agentAddr) String() string  { return "agent" }
