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
	"time"

	"github.com/den-dev/den/api"
)

// Client is the daemon's side of the agent protocol. Answers come from
// inside a sandbox and are treated as untrusted: sizes are bounded and
// errors are re-wrapped.
type Client struct {
	hc *http.Client
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

// Do sends a request to the agent. path is the agent's path ("/files/list")
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
		return nil, fmt.Errorf("agent %s %s: %w", method, path, err)
	}
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
		return fmt.Errorf("agent %s %s: decode answer: %w", method, path, err)
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
	resp, err := c.Do(ctx, "POST", "/exec", nil, bytes.NewReader(b), nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Ping checks that the agent answers.
func (c *Client) Ping(ctx context.Context) error {
	return c.JSON(ctx, "GET", "/healthz", nil, nil, nil)
}
