package client

import (
	"context"
	"net/http"

	"github.com/den-dev/den/api"
)

// SetNetwork replaces a sandbox's egress policy; the change takes effect
// at once, also for a running sandbox.
func (c *Client) SetNetwork(ctx context.Context, id string, p api.NetworkPolicy) (*api.Sandbox, error) {
	path, err := sandboxPath(id, "/network")
	if err != nil {
		return nil, err
	}
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPut, path, nil, p, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}
