package client

import (
	"context"
	"net/http"

	"github.com/den-dev/den/api"
)

// CreateToken makes a scoped API token (admin only). The answer's Token
// field is the secret, given this once: den keeps only its hash. A client
// whose Token is that secret sees and controls only the sandboxes it
// creates, within the bounds and caps of req (sandboxes, volumes,
// snapshots and images it may have; CPUs, memory and disk of each).
func (c *Client) CreateToken(ctx context.Context, req api.TokenRequest) (*api.Token, error) {
	var t api.Token
	if err := c.call(ctx, http.MethodPost, "/v1/tokens", nil, req, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Tokens lists the scoped tokens (admin only), never their secrets.
func (c *Client) Tokens(ctx context.Context) ([]*api.Token, error) {
	var list []*api.Token
	if err := c.call(ctx, http.MethodGet, "/v1/tokens", nil, nil, &list); err != nil {
		return nil, err
	}
	return list, nil
}

// RemoveToken revokes a token by id, unique id prefix or name (admin
// only); its next request is refused. Its sandboxes are kept.
func (c *Client) RemoveToken(ctx context.Context, idOrName string) error {
	p, err := objectPath("/v1/tokens/", "token id or name", idOrName)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, nil)
}
