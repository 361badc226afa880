package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/den-dev/den/api"
)

// Client is the daemon's side of the agent protocol. Answers come from
// inside a sandbox and are treated as untrusted: sizes are bounded and
// errors are re-wrapped.
type Client struct {
	hc *http.Client
	// gone, once set, is the error for a request that fails on the way
	// to the agent or back: its sandbox is being stopped or removed.
	gone atomic.Pointer[api.Error]
}

// NewClient returns a client that reaches the agent through dial.
func NewClient(dial func(ctx context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext:            func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConnsPerHost:    16,
		IdleConnTimeout:        30 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
		DisableCompression:     true,
	}
	return &Client{hc: &http.Client{Transport: tr}}
}

// UnixClient reaches an agent listening on a unix socket path.
func UnixClient(sock string) *Client {
	return NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
}

// HTTP is the client's HTTP client, for protocols layered on it (WebSocket).
func (c *Client) HTTP() *http.Client { return c.hc }

// Close drops idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Gone marks the agent as going away (its sandbox is being stopped or
// removed; the daemon calls it before it ends the sandbox). From then on a
// request that fails in transport, the connection refused, reset or cut
// short, fails with err (a conflict naming what happened) instead of as
// den's own failure: it raced the stop, the server did not break.
func (c *Client) Gone(err *api.Error) { c.gone.Store(err) }

// transportError is err, a request's failure to reach the agent or read its
// answer, or the Gone error if the agent is going away. Errors of another
// kind (the agent's own answers) pass unchanged.
func (c *Client) transportError(err error) error {
	if g := c.gone.Load(); g != nil && api.KindOf(err) == api.KindInternal {
		return g
	}
	return err
}

// goneBody is an answer's body whose read errors become the Gone error
// once the agent is going away.
type goneBody struct {
	io.ReadCloser
	c *Client
}

func (b goneBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		err = b.c.transportError(err)
	}
	return n, err
}

// Do sends a request to the agent. path is one of the agent's paths (protocol.go)
// and query its parameters. A non-2xx answer is returned as *api.Error.
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, body io.Reader, hdr http.Header) (*http.Response, error) {
	u := "http://agent" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.transportError(fmt.Errorf("agent %s %s: %w", method, path, err))
	}
	resp.Body = goneBody{resp.Body, c}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var doc api.ErrorDoc
	if json.Unmarshal(b, &doc) == nil && doc.Error != nil && doc.Error.Kind != "" {
		return doc.Error
	}
	return api.Errorf(api.KindForStatus(resp.StatusCode), "agent answered %s: %.200s", resp.Status, b)
}

// JSON sends a JSON request and decodes a JSON answer into out (if non-nil).
func (c *Client) JSON(ctx context.Context, method, path string, query url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.Do(ctx, method, path, query, body, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(out); err != nil {
		if api.KindOf(err) != api.KindInternal {
			return err // the Gone error, from goneBody
		}
		return c.transportError(fmt.Errorf("agent %s %s: decode answer: %w", method, path, err))
	}
	return nil
}

// Exec starts a command and returns the framed output stream; the caller
// reads it to the exit frame and closes it.
func (c *Client) Exec(ctx context.Context, spec *ExecSpec) (io.ReadCloser, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(ctx, "POST", PathExec, nil, bytes.NewReader(b), nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Ping checks that the agent answers.
func (c *Client) Ping(ctx context.Context) error {
	return c.JSON(ctx, "GET", PathHealth, nil, nil, nil)
}
