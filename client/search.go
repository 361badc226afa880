package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/den-dev/den/api"
)

// GlobOptions select what Glob searches.
type GlobOptions struct {
	// Path is the directory the pattern is relative to ("" means /).
	Path string
	// Limit bounds the matches (0: api.SearchDefaultLimit; at most
	// api.SearchMaxLimit).
	Limit int
}

// Glob lists the paths inside a sandbox matching pattern, like "**/*.go"
// ("**" matches any number of directories; the other wildcards are those of
// path.Match). The search walks the sandbox's own tree without following
// symlinks, whatever tools its image has.
func (c *Client) Glob(ctx context.Context, id, pattern string, opts GlobOptions) (*api.GlobResult, error) {
	q := url.Values{"pattern": {pattern}}
	setSearch(q, opts.Path, opts.Limit)
	var res api.GlobResult
	if err := c.search(ctx, id, "/files/glob", q, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// GrepOptions select what Grep searches.
type GrepOptions struct {
	// Path is a directory to search below or one file ("" means /).
	Path string
	// Glob keeps only files matching it: a pattern without a slash
	// ("*.go") is matched against file names, one with slashes against the
	// path relative to Path.
	Glob string
	// IgnoreCase matches letters in either case.
	IgnoreCase bool
	// Limit bounds the matching lines (0: api.SearchDefaultLimit).
	Limit int
}

// Grep finds the lines matching the regular expression pattern (RE2
// syntax) in the files inside a sandbox. Binary files and files larger than
// api.GrepMaxFileSize are skipped and counted.
func (c *Client) Grep(ctx context.Context, id, pattern string, opts GrepOptions) (*api.GrepResult, error) {
	q := url.Values{"pattern": {pattern}}
	setSearch(q, opts.Path, opts.Limit)
	if opts.Glob != "" {
		q.Set("glob", opts.Glob)
	}
	if opts.IgnoreCase {
		q.Set("ignore_case", "true")
	}
	var res api.GrepResult
	if err := c.search(ctx, id, "/files/grep", q, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

func setSearch(q url.Values, path string, limit int) {
	if path != "" {
		q.Set("path", path)
	}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
}

func (c *Client) search(ctx context.Context, id, suffix string, q url.Values, out any) error {
	p, err := sandboxPath(id, suffix)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodGet, p, q, nil, out)
}
