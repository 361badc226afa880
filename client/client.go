// Package client is the Go SDK of den's HTTP API (docs/api.md). The den CLI
// talks to the daemon only through it.
//
// A zero Client is ready to use, like an http.Client: it talks to the daemon
// named by $DEN_HOST, or to the unix socket unix:///run/den/den.sock.
//
//	c := new(client.Client)
//	sb, err := c.Create(ctx, api.CreateRequest{Image: "host"})
//	...
//	st, err := c.ExecStream(ctx, sb.ID, api.ExecRequest{Cmd: []string{"make", "test"}}, os.Stdout, os.Stderr)
//
// Hosts are written "unix:///path/to/den.sock", "tcp://host:port" (plain
// HTTP) or "http://host:port" / "https://host:port". Over TCP the daemon
// wants a bearer token: Client.Token, else $DEN_TOKEN, else, for a daemon on
// the same machine, the token file in the daemon's data directory
// ($DEN_DATA/token, by default /var/lib/den/token).
//
// Every answer of the daemon with a non-2xx status comes back as an
// *api.Error, so callers can test its kind:
//
//	if errors.Is(err, api.ErrNotFound) { ... }
//
// A daemon that cannot be reached at all gives a *ConnError.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"

	"github.com/den-dev/den/api"
)

// DefaultHost is the daemon address used when neither Client.Host nor
// $DEN_HOST is set.
const DefaultHost = "unix:///run/den/den.sock"

// DefaultDataDir is the daemon's data directory when $DEN_DATA is not set.
const DefaultDataDir = "/var/lib/den"

// Client is a client of den's HTTP API. The zero value is usable; a Client is
// safe for concurrent use. Its fields should not be changed while requests
// are in flight.
type Client struct {
	// Host is the daemon address: "unix:///run/den/den.sock" (default; $DEN_HOST
	// if empty), "tcp://127.0.0.1:7420" or "http://...".
	Host string
	// Token is the bearer token. If empty: $DEN_TOKEN, else for a tcp or
	// http host on this machine the file DataDir/token (DataDir is $DEN_DATA
	// or /var/lib/den).
	Token string
	// HTTPClient, if set, sends the requests. For a unix host its Transport
	// must be nil or an *http.Transport; it is cloned with a dialer for the
	// socket.
	HTTPClient *http.Client

	mu  sync.Mutex
	cfg *config
}

// New returns a Client for host ("" picks $DEN_HOST or DefaultHost).
func New(host string) *Client { return &Client{Host: host} }

// ConnError reports that the daemon could not be reached at all.
type ConnError struct {
	Host string // the daemon address, like "unix:///run/den/den.sock"
	Err  error  // the dial error
}

func (e *ConnError) Error() string {
	if errors.Is(e.Err, syscall.EACCES) || errors.Is(e.Err, syscall.EPERM) {
		return fmt.Sprintf("cannot reach den at %s: permission denied (the socket is root only: run as root, or set DEN_HOST or --host to pick another daemon)", e.Host)
	}
	return fmt.Sprintf("cannot reach den at %s: is \"den serve\" running? (set DEN_HOST or --host to pick another daemon)", e.Host)
}

func (e *ConnError) Unwrap() error { return e.Err }

// config is what a Client's fields resolve to.
type config struct {
	host, token string       // the fields it was made from
	hc          *http.Client // the field it was made from
	http        *http.Client // the client that sends requests
	base        string       // URL prefix, like "http://den"
	display     string       // the address for messages
	bearer      string       // the token sent, or ""
}

// config returns the resolved configuration, rebuilding it when the fields
// changed since the last call.
func (c *Client) config() (*config, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cfg != nil && c.cfg.host == c.Host && c.cfg.token == c.Token && c.cfg.hc == c.HTTPClient {
		return c.cfg, nil
	}
	cfg, err := resolve(c.Host, c.Token, c.HTTPClient)
	if err != nil {
		return nil, err
	}
	c.cfg = cfg
	return cfg, nil
}

// Addr returns the daemon address the client talks to, with the defaults
// applied, like "unix:///run/den/den.sock".
func (c *Client) Addr() string {
	cfg, err := c.config()
	if err != nil {
		return c.Host
	}
	return cfg.display
}

func resolve(host, token string, hc *http.Client) (*config, error) {
	cfg := &config{host: host, token: token, hc: hc}
	h := host
	if h == "" {
		h = os.Getenv("DEN_HOST")
	}
	if h == "" {
		h = DefaultHost
	}
	var sock, hostport string
	switch {
	case strings.HasPrefix(h, "unix://"):
		sock = strings.TrimPrefix(h, "unix://")
	case strings.HasPrefix(h, "/"):
		sock = h
	case strings.HasPrefix(h, "tcp://"):
		hostport = strings.TrimRight(strings.TrimPrefix(h, "tcp://"), "/")
		cfg.base = "http://" + hostport
		cfg.display = h
	case strings.HasPrefix(h, "http://"), strings.HasPrefix(h, "https://"):
		u, err := url.Parse(h)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("bad den host %q: want unix:///path, tcp://host:port or http://host:port", h)
		}
		hostport = u.Host
		cfg.base = strings.TrimRight(h, "/")
		cfg.display = h
	default:
		return nil, fmt.Errorf("bad den host %q: want unix:///path, tcp://host:port or http://host:port", h)
	}
	if hostport == "" && sock == "" {
		return nil, fmt.Errorf("bad den host %q: no address", h)
	}

	if sock != "" {
		cfg.base = "http://den"
		cfg.display = "unix://" + sock
		var tr *http.Transport
		switch {
		case hc == nil || hc.Transport == nil:
			tr = http.DefaultTransport.(*http.Transport).Clone()
		default:
			t, ok := hc.Transport.(*http.Transport)
			if !ok {
				return nil, fmt.Errorf("den host %s: HTTPClient.Transport must be an *http.Transport for a unix socket", cfg.display)
			}
			tr = t.Clone()
		}
		tr.Proxy = nil
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
		cfg.http = &http.Client{Transport: tr}
		if hc != nil {
			cfg.http.CheckRedirect, cfg.http.Jar, cfg.http.Timeout = hc.CheckRedirect, hc.Jar, hc.Timeout
		}
	} else {
		cfg.http = hc
		if cfg.http == nil {
			cfg.http = http.DefaultClient
		}
	}

	cfg.bearer = token
	if cfg.bearer == "" {
		cfg.bearer = os.Getenv("DEN_TOKEN")
	}
	if cfg.bearer == "" && sock == "" && isLocal(hostport) {
		dir := os.Getenv("DEN_DATA")
		if dir == "" {
			dir = DefaultDataDir
		}
		if b, err := os.ReadFile(filepath.Join(dir, "token")); err == nil {
			cfg.bearer = strings.TrimSpace(string(b))
		}
	}
	return cfg, nil
}

// isLocal reports whether hostport names this machine.
func isLocal(hostport string) bool {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		h = strings.Trim(hostport, "[]")
	}
	if strings.EqualFold(h, "localhost") || strings.HasSuffix(strings.ToLower(h), ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() || ip.IsUnspecified() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// request describes one API call.
type request struct {
	method      string
	path        string // starting with /v1/
	query       url.Values
	body        io.Reader
	contentType string
	accept      string
}

// send makes the call and returns the response if its status is 2xx. Any
// other status is decoded into an *api.Error.
func (c *Client) send(ctx context.Context, r *request) (*http.Response, error) {
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	u := cfg.base + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, r.body)
	if err != nil {
		return nil, err
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if r.accept != "" {
		req.Header.Set("Accept", r.accept)
	} else {
		req.Header.Set("Accept", "application/json")
	}
	if cfg.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.bearer)
	}
	req.Header.Set("User-Agent", "den-client")
	resp, err := cfg.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s %s: %w", r.method, r.path, ctx.Err())
		}
		if isDialError(err) {
			return nil, &ConnError{Host: cfg.display, Err: err}
		}
		return nil, fmt.Errorf("%s %s: %w", r.method, r.path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

func isDialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// decodeError turns a non-2xx answer into an *api.Error: the error document
// if the body is one, else an Error made of the status and the body's first
// 200 bytes.
func decodeError(resp *http.Response) *api.Error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	kind := api.KindForStatus(resp.StatusCode)
	var doc api.ErrorDoc
	if json.Unmarshal(body, &doc) == nil && doc.Error != nil && (doc.Error.Kind != "" || doc.Error.Message != "") {
		e := doc.Error
		if e.Kind == "" {
			e.Kind = kind
		}
		if e.Message == "" {
			e.Message = e.Kind
		}
		return e
	}
	msg := "HTTP " + resp.Status
	if s := snippet(body, 200); s != "" {
		msg += ": " + s
	}
	return &api.Error{Kind: kind, Message: msg}
}

// snippet returns the first n bytes of b as trimmed text, cut at a rune
// boundary.
func snippet(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
		for len(b) > 0 && !utf8.Valid(b) {
			b = b[:len(b)-1]
		}
	}
	return strings.TrimSpace(string(b))
}

// call sends a request with a JSON body in (if not nil) and decodes a JSON
// answer into out (if not nil).
func (c *Client) call(ctx context.Context, method, path string, query url.Values, in, out any) error {
	r := &request{method: method, path: path, query: query}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		r.body, r.contentType = bytes.NewReader(b), "application/json"
	}
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeBody(resp, r, out)
}

// decodeBody decodes a JSON answer into out, or discards it when out is nil.
func decodeBody(resp *http.Response, r *request, out any) error {
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", r.method, r.path, err)
	}
	return nil
}

// isJSON reports whether a Content-Type header is JSON.
func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// sandboxPath returns /v1/sandboxes/{id} plus suffix.
func sandboxPath(id, suffix string) (string, error) {
	p, err := objectPath("/v1/sandboxes/", "sandbox id", id)
	return p + suffix, err
}

// objectPath returns prefix followed by id as one escaped path segment;
// what names id in errors. "." and ".." are refused: escaping leaves them
// as they are, and the server's router would take them as a path step
// (/v1/sandboxes/.. is /v1).
func objectPath(prefix, what, id string) (string, error) {
	switch id {
	case "":
		return "", &api.Error{Kind: api.KindInvalid, Message: "no " + what + " given"}
	}
	// The server's router cleans the unescaped path before it matches a
	// route: an id that is ".", "..", "/", or that holds such a segment or
	// an empty one, would be redirected to another route.
	if p := prefix + id; path.Clean(p) != p {
		return "", &api.Error{Kind: api.KindInvalid, Message: fmt.Sprintf("%q is not a %s", id, what)}
	}
	return prefix + url.PathEscape(id), nil
}
