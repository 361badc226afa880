package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"

	"github.com/den-dev/den/api"
)

// Paths inside a sandbox are absolute or relative to "/" and always resolved
// inside the sandbox.

// ReadFile opens a file inside a sandbox for reading. The caller must close
// the returned reader.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	return c.openStream(ctx, id, "/files", path, "application/octet-stream")
}

// WriteFile creates or replaces a file inside a sandbox with the bytes of r,
// creating its parent directories. mode 0 leaves the permissions to the
// daemon (0644 for a new file).
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, mode os.FileMode) (*api.FileInfo, error) {
	p, err := sandboxPath(id, "/files")
	if err != nil {
		return nil, err
	}
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", "0"+strconv.FormatUint(uint64(UnixMode(mode)), 8))
	}
	if r == nil {
		r = http.NoBody
	}
	req := &request{method: http.MethodPut, path: p, query: q, body: r, contentType: "application/octet-stream"}
	resp, err := c.send(ctx, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fi api.FileInfo
	if err := decodeBody(resp, req, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// ListDir lists a directory inside a sandbox.
func (c *Client) ListDir(ctx context.Context, id, path string) ([]*api.FileInfo, error) {
	p, err := sandboxPath(id, "/files/list")
	if err != nil {
		return nil, err
	}
	var list []*api.FileInfo
	if err := c.call(ctx, http.MethodGet, p, url.Values{"path": {path}}, nil, &list); err != nil {
		return nil, err
	}
	return list, nil
}

// Stat describes a file inside a sandbox. A final symlink is not followed.
func (c *Client) Stat(ctx context.Context, id, path string) (*api.FileInfo, error) {
	p, err := sandboxPath(id, "/files/stat")
	if err != nil {
		return nil, err
	}
	var fi api.FileInfo
	if err := c.call(ctx, http.MethodGet, p, url.Values{"path": {path}}, nil, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Mkdir creates a directory inside a sandbox; with parents, missing parent
// directories too (and an existing directory is not an error). mode 0
// means 0755.
func (c *Client) Mkdir(ctx context.Context, id, path string, mode os.FileMode, parents bool) (*api.FileInfo, error) {
	p, err := sandboxPath(id, "/files/mkdir")
	if err != nil {
		return nil, err
	}
	var fi api.FileInfo
	req := api.MkdirRequest{Path: path, Mode: UnixMode(mode), Parents: parents}
	if err := c.call(ctx, http.MethodPost, p, nil, req, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Rename renames a file or directory inside a sandbox and describes it at
// its new path.
func (c *Client) Rename(ctx context.Context, id, from, to string) (*api.FileInfo, error) {
	p, err := sandboxPath(id, "/files/rename")
	if err != nil {
		return nil, err
	}
	var fi api.FileInfo
	if err := c.call(ctx, http.MethodPost, p, nil, api.RenameRequest{From: from, To: to}, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// RemoveFile removes a file or an empty directory inside a sandbox; with
// recursive, a directory and everything below it.
func (c *Client) RemoveFile(ctx context.Context, id, path string, recursive bool) error {
	p, err := sandboxPath(id, "/files")
	if err != nil {
		return err
	}
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return c.call(ctx, http.MethodDelete, p, q, nil, nil)
}

// Download returns a tar stream of the file or directory at path inside a
// sandbox. Entry names are relative to the path's parent: downloading /src
// gives "src/", "src/main.go", ... The caller must close the reader.
func (c *Client) Download(ctx context.Context, id, path string) (io.ReadCloser, error) {
	return c.openStream(ctx, id, "/archive", path, "application/x-tar")
}

// Upload unpacks a tar stream into the directory dir inside a sandbox,
// creating dir if it is missing. Entries that would escape dir are refused.
// The files belong to the sandbox's user (root when it has none), whatever
// owners the archive names.
func (c *Client) Upload(ctx context.Context, id, dir string, tar io.Reader) error {
	return c.upload(ctx, id, dir, tar, false)
}

// UploadKeepingOwners is Upload keeping the uid/gid each archive entry
// names (den cp -a).
func (c *Client) UploadKeepingOwners(ctx context.Context, id, dir string, tar io.Reader) error {
	return c.upload(ctx, id, dir, tar, true)
}

func (c *Client) upload(ctx context.Context, id, dir string, tar io.Reader, keepOwners bool) error {
	p, err := sandboxPath(id, "/archive")
	if err != nil {
		return err
	}
	if tar == nil {
		tar = http.NoBody
	}
	q := url.Values{"path": {dir}}
	if keepOwners {
		q.Set("keep_owners", "true")
	}
	req := &request{method: http.MethodPut, path: p, query: q, body: tar, contentType: "application/x-tar"}
	resp, err := c.send(ctx, req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeBody(resp, req, nil)
}

func (c *Client) openStream(ctx context.Context, id, suffix, path, accept string) (io.ReadCloser, error) {
	p, err := sandboxPath(id, suffix)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: p, query: url.Values{"path": {path}}, accept: accept})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// UnixMode converts an os.FileMode to the unix mode bits of the API:
// permissions plus setuid (04000), setgid (02000) and sticky (01000).
func UnixMode(m os.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// FileMode converts the API's unix mode bits to an os.FileMode (permission
// and special bits only; see FileInfo.Type for the file type).
func FileMode(u uint32) os.FileMode {
	m := os.FileMode(u & 0o777)
	if u&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if u&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if u&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m
}
