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
//	l, err := c.PreviewURLs(ctx, p)
//	// l.HostURL: http://8000-ID.localhost:7420/?den_token=... (the site's root)
//	// l.PathURL: http://127.0.0.1:7420/preview/ID/8000/?den_token=...
//
// DialPort opens a raw TCP connection to it, for any protocol (den forward
// listens locally and dials once per connection):
//
//	conn, err := c.DialPort(ctx, id, 5432)
//	...
//	defer conn.Close()

// SharePort shares a port of sandbox id through den's reverse proxy:
// private (reached with the preview's token) unless public. Sharing a
// private port again keeps its token (SharePortWith with Rotate makes a new
// one). The server may listen on 0.0.0.0 or only on the sandbox's
// 127.0.0.1, and need not listen yet.
func (c *Client) SharePort(ctx context.Context, id string, port int, public bool) (*api.Preview, error) {
	return c.SharePortWith(ctx, id, api.PortRequest{Port: port, Public: public})
}

// SharePortWith is SharePort with every option of the request.
func (c *Client) SharePortWith(ctx context.Context, id string, req api.PortRequest) (*api.Preview, error) {
	path, err := sandboxPath(id, "/ports")
	if err != nil {
		return nil, err
	}
	if err := checkPort(req.Port); err != nil {
		return nil, err
	}
	var p api.Preview
	if err := c.call(ctx, http.MethodPost, path, nil, req, &p); err != nil {
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

// PreviewLinks are the URLs a browser opens a shared port at, with the
// token of a private preview (?den_token=; the daemon then keeps it in a
// cookie for the page's other requests).
type PreviewLinks struct {
	// HostURL is the host-name form, http://PORT-ID.DOMAIN:LISTENPORT/, where
	// the preview is the site's root, so pages that load /app.js or open
	// WebSockets to root-relative paths work (dev servers: Vite, webpack,
	// Next.js, Jupyter). Empty when this client has none it can use.
	HostURL string `json:"host_url,omitempty"`
	// PathURL is http://DAEMON/preview/ID/PORT/, for servers with relative
	// links or configured with that base. With Socket set (a daemon on a
	// unix socket only) it is the path and query alone, reached through
	// the socket, as in
	//
	//	curl --unix-socket SOCK 'http://den/preview/ID/PORT/?den_token=TOKEN'
	PathURL string `json:"path_url"`
	Socket  string `json:"socket,omitempty"`
}

// URL is the one to open: HostURL when there is one, else PathURL.
func (l PreviewLinks) URL() string {
	if l.HostURL != "" {
		return l.HostURL
	}
	return l.PathURL
}

// PreviewURLs returns where a shared port is reached through the daemon
// the client talks to. Over a unix socket that is the daemon's TCP
// listener on this host (from GET /v1/info), as a browser needs.
func (c *Client) PreviewURLs(ctx context.Context, p *api.Preview) (PreviewLinks, error) {
	q := ""
	if !p.Public && p.Token != "" {
		q = "?" + url.Values{"den_token": {p.Token}}.Encode()
	}
	cfg, err := c.config()
	if err != nil {
		return PreviewLinks{}, err
	}
	base := cfg.base
	if sock, ok := strings.CutPrefix(cfg.display, "unix://"); ok {
		info, err := c.Info(ctx)
		if err != nil {
			return PreviewLinks{}, err
		}
		if base = localTCPBase(info.Listeners); base == "" {
			return PreviewLinks{PathURL: p.Path + q, Socket: sock}, nil
		}
	}
	l := PreviewLinks{PathURL: base + p.Path + q}
	b, err := url.Parse(base)
	if err == nil && p.Host != "" && (!strings.HasSuffix(p.Host, ".localhost") || isLoopback(b.Hostname())) {
		h := p.Host
		if b.Port() != "" {
			h = net.JoinHostPort(h, b.Port())
		}
		l.HostURL = b.Scheme + "://" + h + "/" + q
	}
	return l, nil
}

// localTCPBase is the URL, on this host, of the first TCP listener among a
// daemon's listeners (tcp://ADDR:PORT), or "".
func localTCPBase(listeners []string) string {
	for _, l := range listeners {
		hp, ok := strings.CutPrefix(l, "tcp://")
		host, port, err := net.SplitHostPort(hp)
		if !ok || err != nil {
			continue
		}
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			host = "127.0.0.1" // listening on all addresses: loopback too
		}
		return "http://" + net.JoinHostPort(host, port)
	}
	return ""
}

// isLoopback reports whether host names this machine's loopback.
func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || strings.HasSuffix(host, ".localhost") || ip != nil && ip.IsLoopback()
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
