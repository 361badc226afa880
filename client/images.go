package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/den-dev/den/api"
)

// Images lists the images.
func (c *Client) Images(ctx context.Context) ([]*api.Image, error) {
	var list []*api.Image
	if err := c.call(ctx, http.MethodGet, "/v1/images", nil, nil, &list); err != nil {
		return nil, err
	}
	return list, nil
}

// Image returns one image by name.
func (c *Client) Image(ctx context.Context, name string) (*api.Image, error) {
	p, err := imagePath(name)
	if err != nil {
		return nil, err
	}
	var img api.Image
	if err := c.call(ctx, http.MethodGet, p, nil, nil, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// RemoveImage removes an image. An image used by a sandbox is a conflict
// error.
func (c *Client) RemoveImage(ctx context.Context, name string) error {
	p, err := imagePath(name)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, nil)
}

func imagePath(name string) (string, error) {
	if name == "" {
		return "", &api.Error{Kind: api.KindInvalid, Message: "no image name given"}
	}
	return "/v1/images/" + url.PathEscape(name), nil
}

// ImportImage imports the images of an OCI archive or a `docker save`
// tarball read from r. name, if not empty, names the image (for an archive
// holding one). If progress is not nil it is called as the daemon reports
// progress: done of total bytes (total 0 when unknown) of the step "what".
func (c *Client) ImportImage(ctx context.Context, name string, r io.Reader, progress func(done, total int64, what string)) ([]*api.Image, error) {
	var q url.Values
	if name != "" {
		q = url.Values{"name": {name}}
	}
	accept := "application/json"
	if progress != nil {
		accept = "application/x-ndjson"
	}
	if r == nil {
		r = http.NoBody
	}
	req := &request{method: http.MethodPost, path: "/v1/images/import", query: q, body: r,
		contentType: "application/x-tar", accept: accept}
	resp, err := c.send(ctx, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if progress == nil || isJSON(resp.Header.Get("Content-Type")) {
		var list []*api.Image
		if err := decodeBody(resp, req, &list); err != nil {
			return nil, err
		}
		return list, nil
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var line struct {
			Progress *struct {
				Done  int64  `json:"done"`
				Total int64  `json:"total"`
				What  string `json:"what"`
			} `json:"progress"`
			Images *[]*api.Image `json:"images"`
			Error  *api.Error    `json:"error"`
		}
		if err := dec.Decode(&line); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("image import: progress stream ended without a result: %w", err)
		}
		switch {
		case line.Error != nil:
			if line.Error.Kind == "" {
				line.Error.Kind = api.KindInternal
			}
			return nil, line.Error
		case line.Images != nil:
			return *line.Images, nil
		case line.Progress != nil:
			progress(line.Progress.Done, line.Progress.Total, line.Progress.What)
		}
	}
}

// EventFilter selects events. Zero fields select everything.
type EventFilter struct {
	Sandbox string    // a sandbox id
	Type    string    // a prefix of the type: "exec." matches "exec.start" and "exec.end"
	Since   time.Time // events at or after this time
	After   int64     // events with a Seq above this one
	Limit   int       // at most this many, the oldest first; 0: no limit
}

// Events returns the events of the log that match filter, oldest first.
func (c *Client) Events(ctx context.Context, filter EventFilter) ([]*api.Event, error) {
	q := url.Values{}
	if filter.Sandbox != "" {
		q.Set("sandbox", filter.Sandbox)
	}
	if filter.Type != "" {
		q.Set("type", filter.Type)
	}
	if !filter.Since.IsZero() {
		q.Set("since", filter.Since.UTC().Format(time.RFC3339Nano))
	}
	if filter.After > 0 {
		q.Set("after", strconv.FormatInt(filter.After, 10))
	}
	if filter.Limit > 0 {
		q.Set("limit", strconv.Itoa(filter.Limit))
	}
	var list []*api.Event
	if err := c.call(ctx, http.MethodGet, "/v1/events", q, nil, &list); err != nil {
		return nil, err
	}
	return list, nil
}
