package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
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
	return objectPath("/v1/images/", "image name", name)
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
	var out []*api.Image
	err = readLines(ctx, resp, "image import", func(l *streamLine) bool {
		switch {
		case l.Images != nil:
			out = *l.Images
			return true
		case l.Progress != nil:
			progress(l.Progress.Done, l.Progress.Total, l.Progress.What)
		}
		return false
	})
	return out, err
}

// streamLine is one line of the application/x-ndjson answers of import,
// pull and build.
type streamLine struct {
	Progress *struct {
		Done  int64  `json:"done"`
		Total int64  `json:"total"`
		What  string `json:"what"`
	} `json:"progress"`
	Stream *string       `json:"stream"`
	Image  *api.Image    `json:"image"`
	Images *[]*api.Image `json:"images"`
	Error  *api.Error    `json:"error"`
}

// readLines decodes an ndjson answer line by line, calling line for each
// until it reports the final result. An error line ends the stream with
// that *api.Error; a stream that ends without a result is an error.
func readLines(ctx context.Context, resp *http.Response, what string, line func(*streamLine) bool) error {
	dec := json.NewDecoder(resp.Body)
	for {
		var l streamLine
		if err := dec.Decode(&l); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("%s: the stream ended without a result: %w", what, err)
		}
		if l.Error != nil {
			if l.Error.Kind == "" {
				l.Error.Kind = api.KindInternal
			}
			if l.Error.Message == "" {
				l.Error.Message = l.Error.Kind
			}
			return l.Error
		}
		if line(&l) {
			return nil
		}
	}
}

// PullImage pulls an image from a registry (req.Ref, like
// docker.io/library/alpine:3.20 or alpine). The daemon uses the request's
// credentials, else its own ~/.docker/config.json, else none. If progress
// is not nil it is called as the daemon reports progress: done of total
// bytes (total 0 when unknown) of the step "what".
func (c *Client) PullImage(ctx context.Context, req api.PullRequest, progress func(done, total int64, what string)) (*api.Image, error) {
	if req.Ref == "" {
		return nil, &api.Error{Kind: api.KindInvalid, Message: "no image reference given", Field: "ref"}
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	accept := "application/json"
	if progress != nil {
		accept = "application/x-ndjson"
	}
	r := &request{method: http.MethodPost, path: "/v1/images/pull", body: bytes.NewReader(b),
		contentType: "application/json", accept: accept}
	resp, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if progress == nil || isJSON(resp.Header.Get("Content-Type")) {
		var img api.Image
		if err := decodeBody(resp, r, &img); err != nil {
			return nil, err
		}
		return &img, nil
	}
	var img *api.Image
	err = readLines(ctx, resp, "image pull", func(l *streamLine) bool {
		switch {
		case l.Image != nil:
			img = l.Image
			return true
		case l.Progress != nil:
			progress(l.Progress.Done, l.Progress.Total, l.Progress.What)
		}
		return false
	})
	return img, err
}

// BuildOptions are the parameters of BuildImage.
type BuildOptions struct {
	Tag        string            // the name of the image built (required)
	Dockerfile string            // its path inside the build context; default "Dockerfile"
	BuildArgs  map[string]string // --build-arg values, overriding ARG defaults
	NoCache    bool              // run every step again instead of using the step cache
	Timeout    time.Duration     // bound on the whole build; 0: the daemon's default
	// Debian, if set, makes a minimal Debian image of this suite (like
	// "bookworm") with mmdebstrap instead of building a Dockerfile; the
	// build context is then not used.
	Debian string
	// Network is the RUN steps' network: "none" (or "", the default),
	// "allow" (only the Allow domains and AllowCIDR ranges, through den's
	// egress policy, as a sandbox's) or "open" (any public address).
	Network   string
	Allow     []string
	AllowCIDR []string
}

// BuildImage builds an image from a Dockerfile: contextTar is a tar of the
// build context (the daemon applies its .dockerignore). Every RUN runs in a
// den sandbox; steps are cached. The build output is written to output (if
// not nil) as it comes. A failed build is an *api.Error whose message names
// the Dockerfile line.
func (c *Client) BuildImage(ctx context.Context, contextTar io.Reader, opts BuildOptions, output io.Writer) (*api.Image, error) {
	if opts.Tag == "" {
		return nil, &api.Error{Kind: api.KindInvalid, Message: "no image name given: set BuildOptions.Tag", Field: "t"}
	}
	q := url.Values{"t": {opts.Tag}}
	if opts.Dockerfile != "" {
		q.Set("dockerfile", opts.Dockerfile)
	}
	keys := make([]string, 0, len(opts.BuildArgs))
	for k := range opts.BuildArgs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("build-arg", k+"="+opts.BuildArgs[k])
	}
	if opts.NoCache {
		q.Set("no-cache", "true")
	}
	if opts.Timeout > 0 {
		q.Set("timeout", opts.Timeout.String())
	}
	if opts.Network != "" {
		q.Set("network", opts.Network)
	}
	for _, a := range opts.Allow {
		q.Add("allow", a)
	}
	for _, c := range opts.AllowCIDR {
		q.Add("allow-cidr", c)
	}
	r := &request{method: http.MethodPost, path: "/v1/images/build", query: q, accept: "application/x-ndjson"}
	if opts.Debian != "" {
		q.Set("debian", opts.Debian)
		r.body = http.NoBody
	} else {
		if contextTar == nil {
			contextTar = http.NoBody
		}
		r.body, r.contentType = contextTar, "application/x-tar"
	}
	resp, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if isJSON(resp.Header.Get("Content-Type")) {
		var img api.Image
		if err := decodeBody(resp, r, &img); err != nil {
			return nil, err
		}
		return &img, nil
	}
	var img *api.Image
	var werr error
	err = readLines(ctx, resp, "image build", func(l *streamLine) bool {
		switch {
		case l.Image != nil:
			img = l.Image
			return true
		case l.Stream != nil && output != nil && werr == nil:
			_, werr = io.WriteString(output, *l.Stream)
		}
		return false
	})
	if err == nil && werr != nil {
		err = fmt.Errorf("image build: writing the output: %w", werr)
	}
	return img, err
}

// Commit makes an image named req.Name of a sandbox's files as they are:
// each writable layer becomes a read-only layer on top of the sandbox's
// image. Unless req.Config is given, the image's configuration is the
// parent image's with the sandbox's env, workdir and user applied.
func (c *Client) Commit(ctx context.Context, id string, req api.CommitRequest) (*api.Image, error) {
	p, err := sandboxPath(id, "/commit")
	if err != nil {
		return nil, err
	}
	var img api.Image
	if err := c.call(ctx, http.MethodPost, p, nil, req, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// SaveImages returns the named images as one OCI archive, which
// ImportImage (den image import) or docker load reads. The caller must
// close it. A stream cut short by the daemon ends with an error rather than
// io.EOF.
func (c *Client) SaveImages(ctx context.Context, names []string) (io.ReadCloser, error) {
	if len(names) == 0 {
		return nil, &api.Error{Kind: api.KindInvalid, Message: "no image name given", Field: "name"}
	}
	for _, n := range names {
		if n == "" {
			return nil, &api.Error{Kind: api.KindInvalid, Message: "empty image name", Field: "name"}
		}
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: "/v1/images/save",
		query: url.Values{"name": names}, accept: "application/x-tar"})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// PruneImages removes the build cache no sandbox uses and every layer no
// image uses. It returns the names of the cache images removed and the
// number of layers removed.
func (c *Client) PruneImages(ctx context.Context) (images []string, layers int, err error) {
	var res struct {
		Images []string `json:"images"`
		Layers int      `json:"layers"`
	}
	if err := c.call(ctx, http.MethodPost, "/v1/images/prune", nil, nil, &res); err != nil {
		return nil, 0, err
	}
	return res.Images, res.Layers, nil
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
