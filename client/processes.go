package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/den-dev/den/api"
)

// Background processes keep running when the client that started them
// leaves. Their output is kept in a bounded buffer read with Logs; their
// standard input stays open until closed with WriteStdin.

// StartProcess starts a command in the background in a sandbox and returns
// it at once, running.
func (c *Client) StartProcess(ctx context.Context, id string, req api.ExecRequest) (*api.ProcessInfo, error) {
	p, err := sandboxPath(id, "/processes")
	if err != nil {
		return nil, err
	}
	var pi api.ProcessInfo
	if err := c.call(ctx, http.MethodPost, p, nil, req, &pi); err != nil {
		return nil, err
	}
	return &pi, nil
}

// Processes lists a sandbox's background processes, running and recently
// finished.
func (c *Client) Processes(ctx context.Context, id string) ([]*api.ProcessInfo, error) {
	p, err := sandboxPath(id, "/processes")
	if err != nil {
		return nil, err
	}
	var list []*api.ProcessInfo
	if err := c.call(ctx, http.MethodGet, p, nil, nil, &list); err != nil {
		return nil, err
	}
	return list, nil
}

// Process describes one background process.
func (c *Client) Process(ctx context.Context, id, proc string) (*api.ProcessInfo, error) {
	p, err := processPath(id, proc, "")
	if err != nil {
		return nil, err
	}
	var pi api.ProcessInfo
	if err := c.call(ctx, http.MethodGet, p, nil, nil, &pi); err != nil {
		return nil, err
	}
	return &pi, nil
}

// LogsOptions select the output Logs returns.
type LogsOptions struct {
	// Follow keeps the stream open, copying new output as it comes, until
	// the process ends.
	Follow bool
	// Tail, if positive, starts with only the last Tail lines of the
	// retained output; zero means all of it, and a negative Tail none of it
	// (with Follow: only new output).
	Tail int
	// Since, if not zero, starts with the output written at or after this
	// time.
	Since time.Time
}

// Logs copies a background process's output to stdout and stderr (nil
// writers discard): the retained output, then, with opts.Follow, new output
// until the process ends.
//
// It returns how the process ended, or nil when the stream ends while the
// process still runs (possible only without Follow; with Follow such an end
// is an error). An error frame from the daemon is returned as an
// *api.Error; dropped output is reported with a DroppedMarker line on
// stderr. Cancelling ctx stops reading; the process keeps running.
func (c *Client) Logs(ctx context.Context, id, proc string, opts LogsOptions, stdout, stderr io.Writer) (*api.ExitStatus, error) {
	p, err := processPath(id, proc, "/logs")
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if opts.Follow {
		q.Set("follow", "true")
	}
	switch {
	case opts.Tail > 0:
		q.Set("tail", strconv.Itoa(opts.Tail))
	case opts.Tail < 0:
		q.Set("tail", "0")
	}
	if !opts.Since.IsZero() {
		q.Set("since", opts.Since.UTC().Format(time.RFC3339Nano))
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: p, query: q, accept: api.StreamContentType})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	st, err := copyFrames(ctx, resp.Body, stdout, stderr, "logs")
	if err != nil {
		return nil, err
	}
	if st == nil && opts.Follow {
		return nil, fmt.Errorf("logs output stream ended without an exit status: %w", io.ErrUnexpectedEOF)
	}
	return st, nil
}

// Kill sends a signal to a background process's process group. signal is a
// name with or without SIG ("TERM", "SIGINT") or a number; "" means KILL.
func (c *Client) Kill(ctx context.Context, id, proc, signal string) error {
	p, err := processPath(id, proc, "/kill")
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, p, nil, api.SignalRequest{Signal: signal}, nil)
}

// WriteStdin writes the bytes of r (nil: none) to a background process's
// standard input; with close, the input is then closed, so the process
// reads end of file.
func (c *Client) WriteStdin(ctx context.Context, id, proc string, r io.Reader, close bool) error {
	p, err := processPath(id, proc, "/stdin")
	if err != nil {
		return err
	}
	var q url.Values
	if close {
		q = url.Values{"close": {"true"}}
	}
	if r == nil {
		r = http.NoBody
	}
	resp, err := c.send(ctx, &request{method: http.MethodPost, path: p, query: q, body: r, contentType: "application/octet-stream"})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return nil
}

// Wait blocks until a background process has ended and returns how it
// ended. Cancelling ctx stops waiting; the process keeps running.
func (c *Client) Wait(ctx context.Context, id, proc string) (*api.ExitStatus, error) {
	p, err := processPath(id, proc, "/wait")
	if err != nil {
		return nil, err
	}
	var st api.ExitStatus
	if err := c.call(ctx, http.MethodGet, p, nil, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// processPath returns /v1/sandboxes/{id}/processes/{proc} plus suffix.
func processPath(id, proc, suffix string) (string, error) {
	pp, err := objectPath("/processes/", "process id", proc)
	if err != nil {
		return "", err
	}
	return sandboxPath(id, pp+suffix)
}
