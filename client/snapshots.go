package client

import (
	"context"
	"io"
	"net/http"
	"net/url"

	"github.com/den-dev/den/api"
)

// Snapshot captures a sandbox's files (frozen for the instant of the
// capture if it runs).
func (c *Client) Snapshot(ctx context.Context, id string, req api.SnapshotRequest) (*api.Snapshot, error) {
	p, err := sandboxPath(id, "/snapshots")
	if err != nil {
		return nil, err
	}
	var s api.Snapshot
	if err := c.call(ctx, http.MethodPost, p, nil, req, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Snapshots lists snapshots; of one sandbox when sandbox is not empty.
func (c *Client) Snapshots(ctx context.Context, sandbox string) ([]*api.Snapshot, error) {
	var q url.Values
	if sandbox != "" {
		q = url.Values{"sandbox": {sandbox}}
	}
	var list []*api.Snapshot
	if err := c.call(ctx, http.MethodGet, "/v1/snapshots", q, nil, &list); err != nil {
		return nil, err
	}
	return list, nil
}

// GetSnapshot returns one snapshot by id, id prefix or name.
func (c *Client) GetSnapshot(ctx context.Context, snap string) (*api.Snapshot, error) {
	p, err := objectPath("/v1/snapshots/", "snapshot", snap)
	if err != nil {
		return nil, err
	}
	var s api.Snapshot
	if err := c.call(ctx, http.MethodGet, p, nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// RemoveSnapshot deletes a snapshot.
func (c *Client) RemoveSnapshot(ctx context.Context, snap string) error {
	p, err := objectPath("/v1/snapshots/", "snapshot", snap)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, nil)
}

// Restore rolls a sandbox back to a snapshot in place.
func (c *Client) Restore(ctx context.Context, id, snap string) (*api.Sandbox, error) {
	p, err := sandboxPath(id, "/restore")
	if err != nil {
		return nil, err
	}
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, p, nil, api.RestoreRequest{Snapshot: snap}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Fork makes new sandboxes from a sandbox's current files.
func (c *Client) Fork(ctx context.Context, id string, req api.ForkRequest) ([]*api.Sandbox, error) {
	p, err := sandboxPath(id, "/fork")
	if err != nil {
		return nil, err
	}
	var list []*api.Sandbox
	if err := c.call(ctx, http.MethodPost, p, nil, req, &list); err != nil {
		return nil, err
	}
	return list, nil
}

// SaveSnapshot streams a snapshot archive (its files, checksum manifest
// and image) for LoadSnapshot on another host. Close the reader.
func (c *Client) SaveSnapshot(ctx context.Context, snap string) (io.ReadCloser, error) {
	p, err := objectPath("/v1/snapshots/", "snapshot", snap)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: p + "/archive", accept: "application/x-tar"})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// LoadSnapshot records the snapshot in an archive made by SaveSnapshot,
// after checking its files against its manifest.
func (c *Client) LoadSnapshot(ctx context.Context, r io.Reader) (*api.Snapshot, error) {
	req := &request{method: http.MethodPost, path: "/v1/snapshots/load", body: r, contentType: "application/x-tar", accept: "application/json"}
	resp, err := c.send(ctx, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var s api.Snapshot
	if err := decodeBody(resp, req, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// CreateVolume makes a volume.
func (c *Client) CreateVolume(ctx context.Context, req api.VolumeRequest) (*api.Volume, error) {
	var v api.Volume
	if err := c.call(ctx, http.MethodPost, "/v1/volumes", nil, req, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Volumes lists volumes.
func (c *Client) Volumes(ctx context.Context) ([]*api.Volume, error) {
	var list []*api.Volume
	if err := c.call(ctx, http.MethodGet, "/v1/volumes", nil, nil, &list); err != nil {
		return nil, err
	}
	return list, nil
}

// GetVolume returns one volume with its use.
func (c *Client) GetVolume(ctx context.Context, name string) (*api.Volume, error) {
	p, err := objectPath("/v1/volumes/", "volume", name)
	if err != nil {
		return nil, err
	}
	var v api.Volume
	if err := c.call(ctx, http.MethodGet, p, nil, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// RemoveVolume deletes a volume and its files.
func (c *Client) RemoveVolume(ctx context.Context, name string) error {
	p, err := objectPath("/v1/volumes/", "volume", name)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, nil)
}
