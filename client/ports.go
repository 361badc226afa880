package client

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"github.com/den-dev/den/api"
)

// A server listening inside a sandbox is reached in two ways. SharePort
// opens it to den's reverse proxy (HTTP and WebSocket), at a URL that
// PreviewURL composes:
//
//	p, err := c.SharePort(ctx, id, 8000, false)
//	...
//	u, sock := c.PreviewURL(p) // http://127.0.0.1:7420/preview/ID/8000/?den_token=...
//
// DialPort opens a raw TCP connection to it, for any protocol (den forward
// listens locally and dials once per connection):
//
//	conn, err := c.DialPort(ctx, id, 5432)
//	...
//	defer conn.Close()

// SharePort shares a port of sandbox id through den's reverse proxy:
// private (reached with the preview's token) unless public. Sharing a port
// again replaces its token. The server may listen on 0.0.0.0 or only on the
// sandbox's 127.0.0.1, and need not listen yet.
func (c *Client) SharePort(ctx context.Context, id string, port int, public bool) (*api.Preview, error) {
	path, err := sandboxPath(id, "/ports")
	if err != nil {
		return nil, err
	}
	if err := checkPort(port); err != nil {
		return nil, err
	}
	var p api.Preview
	if err := c.call(ctx, http.MethodPost, path, nil, api.PortRequest{Port: port, Public: public}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Ports lists the shared ports of sandbox id, with their tokens.
func (c *Client) Ports(ctx context.Context, id string) ([]*api.Preview, error) {
	path, err := sandboxPath(id, "/ports")
	if err != nil {
		return nil, err
	}
	var list []*api.Preview
	if err := c.call(ctx, http.MethodGet, path, nil, nil, &list); err != nil {
		return nil, err
	}
	return list, nil
}

// UnsharePort stops sharing a port; the server inside keeps running. A
// port that is not shared is api.ErrNotFound.
func (c *Client) UnsharePort(ctx context.Context, id string, port int) error {
	path, err := portPath(id, port, "")
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, path, nil, nil, nil)
}

// DialPort opens a TCP connection to port on the loopback of the running
// sandbox id (servers bound only to its 127.0.0.1 included; the port need
// not be shared), carried over a WebSocket to the daemon. ctx bounds the
// set-up only; Close ends the connection. A stopped sandbox, or a port
// nothing listens on, is an *api.Error (conflict).
//
// The connection has no half-close: closing it closes both directions, and
// Read returns io.EOF once the server inside has closed its end. Its
// addresses are placeholders, and a deadline that expires during a Read
// or Write closes it.
func (c *Client) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	p, err := portPath(id, port, "/tcp")
	if err != nil {
		return nil, err
	}
	conn, err := c.dialWebSocket(ctx, p, fmt.Sprintf("connect to port %d of %s", port, id))
	if err != nil {
		return nil, err
	}
	return &portConn{Conn: websocket.NetConn(context.Background(), conn, websocket.MessageBinary)}, nil
}

// portConn splits writes into messages the daemon accepts.
type portConn struct{ net.Conn }

func (p *portConn) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		chunk := b
		if len(chunk) > api.MaxTTYMessage {
			chunk = chunk[:api.MaxTTYMessage]
		}
		m, err := p.Conn.Write(chunk)
		n += m
		if err != nil {
			return n, err
		}
		b = b[len(chunk):]
	}
	return n, nil
}

// PreviewURL returns where a shared port is reached through the daemon
// the client talks to: for a TCP or HTTP host the full URL,
// http://HOST:PORT/preview/ID/PORT/ with ?den_token=TOKEN for a private
// preview, and an empty sock.
//
// For a unix-socket host the preview is reachable only through the socket
// (unless the daemon also listens on TCP): u is then the path and query
// alone and sock the socket's path, as in
//
//	curl --unix-socket SOCK 'http://den/preview/ID/PORT/?den_token=TOKEN'
//
// With a preview domain the daemon also serves the preview at the root of
// http://p.Host (see api.Preview), with the same token.
func (c *Client) PreviewURL(p *api.Preview) (u, sock string) {
	u = p.Path
	if !p.Public && p.Token != "" {
		u += "?" + url.Values{"den_token": {p.Token}}.Encode()
	}
	cfg, err := c.config()
	if err != nil {
		return u, ""
	}
	if s, ok := strings.CutPrefix(cfg.display, "unix://"); ok {
		return u, s
	}
	return cfg.base + u, ""
}

// portPath returns /v1/sandboxes/{id}/ports/{port} plus suffix.
func portPath(id string, port int, suffix string) (string, error) {
	if err := checkPort(port); err != nil {
		return "", err
	}
	return sandboxPath(id, "/ports/"+strconv.Itoa(port)+suffix)
}

func checkPort(port int) error {
	if port < 1 || port > 65535 {
		return &api.Error{Kind: api.KindInvalid, Message: fmt.Sprintf("%d is not a TCP port (1-65535)", port), Field: "port"}
	}
	return nil
}
