package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
)

// SetSecret stores (or replaces) the secret name in den's secret store:
// value is 1 byte to 64 KiB, name is like an environment variable name.
// Running sandboxes whose secret headers refer to it use the new value at
// once.
func (c *Client) SetSecret(ctx context.Context, name string, value []byte) error {
	p, err := secretPath(name)
	if err != nil {
		return err
	}
	resp, err := c.send(ctx, &request{method: http.MethodPut, path: p, body: bytes.NewReader(value), contentType: "application/octet-stream"})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return nil
}

// Secrets lists the names in den's secret store (never the values).
func (c *Client) Secrets(ctx context.Context) ([]string, error) {
	var names []string
	if err := c.call(ctx, http.MethodGet, "/v1/secrets", nil, nil, &names); err != nil {
		return nil, err
	}
	return names, nil
}

// DeleteSecret removes a secret from den's secret store; a missing one is
// an *api.Error of kind not_found.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	p, err := secretPath(name)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, nil)
}

func secretPath(name string) (string, error) {
	return objectPath("/v1/secrets/", "secret name", name)
}
