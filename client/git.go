package client

import (
	"context"
	"net/http"

	"github.com/den-dev/den/api"
)

// Diff describes what changed in a sandbox's git workspace (created with
// CreateRequest.Git) since its base commit, committed inside or not.
func (c *Client) Diff(ctx context.Context, id string) (*api.Diff, error) {
	p, err := sandboxPath(id, "/diff")
	if err != nil {
		return nil, err
	}
	var d api.Diff
	if err := c.call(ctx, http.MethodGet, p, nil, nil, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// Export writes a git workspace's changes as commits on a branch of the
// host repository it was cloned from (admin only).
func (c *Client) Export(ctx context.Context, id string, req api.ExportRequest) (*api.ExportResult, error) {
	p, err := sandboxPath(id, "/export")
	if err != nil {
		return nil, err
	}
	var res api.ExportResult
	if err := c.call(ctx, http.MethodPost, p, nil, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
