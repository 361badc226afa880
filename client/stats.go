package client

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/den-dev/den/api"
)

// Sessions lists a sandbox's open shell sessions (see ExecRequest.Session).
func (c *Client) Sessions(ctx context.Context, id string) ([]*api.Session, error) {
	p, err := sandboxPath(id, "/sessions")
	if err != nil {
		return nil, err
	}
	var list []*api.Session
	if err := c.call(ctx, http.MethodGet, p, nil, nil, &list); err != nil {
		return nil, err
	}
	return list, nil
}

// CloseSession ends a shell session, killing its shell. The next exec
// naming the session starts a fresh one.
func (c *Client) CloseSession(ctx context.Context, id, name string) error {
	sp, err := objectPath("/sessions/", "session name", name)
	if err != nil {
		return err
	}
	p, err := sandboxPath(id, sp)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, nil)
}

// Stats returns a sandbox's live resource use and limits, and its usage
// totals since it was created.
func (c *Client) Stats(ctx context.Context, id string) (*api.Stats, error) {
	p, err := sandboxPath(id, "/stats")
	if err != nil {
		return nil, err
	}
	var st api.Stats
	if err := c.call(ctx, http.MethodGet, p, nil, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// maxMetrics bounds the answer of Metrics.
const maxMetrics = 64 << 20

// Metrics returns the daemon's metrics in the Prometheus text format, as
// served at GET /metrics.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	r := &request{method: http.MethodGet, path: "/metrics", accept: "text/plain"}
	resp, err := c.send(ctx, r)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxMetrics+1))
	if err != nil {
		return "", fmt.Errorf("GET /metrics: %w", err)
	}
	if len(b) > maxMetrics {
		return "", fmt.Errorf("GET /metrics: answer over %d bytes", maxMetrics)
	}
	return string(b), nil
}
