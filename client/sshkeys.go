package client

import (
	"context"
	"net/http"

	"github.com/den-dev/den/api"
)

// Public keys authorised for den's SSH gateway (den serve --ssh). A key
// acts for whoever added it, the admin or a scoped token, and only within
// its sandbox when it names one:
//
//	k, err := c.AddSSHKey(ctx, api.SSHKeyRequest{PublicKey: line, Sandbox: "web"})
//	...
//	// ssh -p 2222 web@host now opens a shell in web with that key.

// AddSSHKey authorises a public key (one line of a .pub file).
func (c *Client) AddSSHKey(ctx context.Context, req api.SSHKeyRequest) (*api.SSHKey, error) {
	var k api.SSHKey
	if err := c.call(ctx, http.MethodPost, "/v1/ssh-keys", nil, req, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// SSHKeys lists the authorised keys the caller may see: all of them for
// the admin, its own for a scoped token.
func (c *Client) SSHKeys(ctx context.Context) ([]*api.SSHKey, error) {
	var list []*api.SSHKey
	if err := c.call(ctx, http.MethodGet, "/v1/ssh-keys", nil, nil, &list); err != nil {
		return nil, err
	}
	return list, nil
}

// RemoveSSHKey revokes a key by id, name or id prefix. Sessions already
// open keep running; new ones are refused.
func (c *Client) RemoveSSHKey(ctx context.Context, id string) error {
	p, err := objectPath("/v1/ssh-keys/", "SSH key id", id)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, nil)
}
