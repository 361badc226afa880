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
	"time"

	"github.com/den-dev/den/api"
)

// Version returns the daemon's version and capabilities.
func (c *Client) Version(ctx context.Context) (*api.VersionInfo, error) {
	var v api.VersionInfo
	if err := c.call(ctx, http.MethodGet, "/v1/version", nil, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Info reports what the daemon runs: every isolation tier, whether this
// host can run it (and if not, why), how it runs; storage and network.
func (c *Client) Info(ctx context.Context) (*api.Info, error) {
	var v api.Info
	if err := c.call(ctx, http.MethodGet, "/v1/info", nil, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Escalate moves a sandbox to a stronger isolation tier ("gvisor" or
// "microvm"), keeping its id, files, network policy and ports; its
// processes end and it starts again there if it was up.
func (c *Client) Escalate(ctx context.Context, id, runtime string) (*api.Sandbox, error) {
	p, err := sandboxPath(id, "/escalate")
	if err != nil {
		return nil, err
	}
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, p, nil, api.EscalateRequest{Runtime: runtime}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Create creates a sandbox and returns it running.
func (c *Client) Create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// List returns the sandboxes that carry all the given labels (all sandboxes
// when labels is empty).
func (c *Client) List(ctx context.Context, labels map[string]string) ([]*api.Sandbox, error) {
	var q url.Values
	if len(labels) > 0 {
		keys := make([]string, 0, len(labels))
		for k := range labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		q = url.Values{}
		for _, k := range keys {
			q.Add("label", k+"="+labels[k])
		}
	}
	var list []*api.Sandbox
	if err := c.call(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &list); err != nil {
		return nil, err
	}
	return list, nil
}

// Get returns one sandbox. id is an id, a unique id prefix of at least 4
// characters, or a name.
func (c *Client) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.sandboxCall(ctx, http.MethodGet, id, "")
}

// Stop stops a sandbox, its files kept: its processes get its stop signal
// (default TERM) and its stop timeout (default 10 s) to end, then SIGKILL.
func (c *Client) Stop(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.sandboxCall(ctx, http.MethodPost, id, "/stop")
}

// StopWithin stops a sandbox as Stop does, waiting up to timeout in place
// of its stop timeout (0 kills at once), as docker stop -t.
func (c *Client) StopWithin(ctx context.Context, id string, timeout time.Duration) (*api.Sandbox, error) {
	p, err := sandboxPath(id, "/stop")
	if err != nil {
		return nil, err
	}
	var sb api.Sandbox
	q := url.Values{"timeout": {timeout.String()}}
	if err := c.call(ctx, http.MethodPost, p, q, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Start starts a stopped sandbox.
func (c *Client) Start(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.sandboxCall(ctx, http.MethodPost, id, "/start")
}

// Pause freezes every process of a running sandbox; any later use of the
// sandbox (exec, files, ports) resumes it.
func (c *Client) Pause(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.sandboxCall(ctx, http.MethodPost, id, "/pause")
}

// Resume brings a paused or hibernated sandbox back; Sandbox.Resumed says
// whether its processes continued or were started anew.
func (c *Client) Resume(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.sandboxCall(ctx, http.MethodPost, id, "/resume")
}

// Hibernate frees a sandbox's memory and keeps its files.
func (c *Client) Hibernate(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.sandboxCall(ctx, http.MethodPost, id, "/hibernate")
}

func (c *Client) sandboxCall(ctx context.Context, method, id, suffix string) (*api.Sandbox, error) {
	p, err := sandboxPath(id, suffix)
	if err != nil {
		return nil, err
	}
	var sb api.Sandbox
	if err := c.call(ctx, method, p, nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Remove removes a sandbox and its files. Without force, removing a running
// sandbox is a conflict error.
func (c *Client) Remove(ctx context.Context, id string, force bool) error {
	p, err := sandboxPath(id, "")
	if err != nil {
		return err
	}
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	return c.call(ctx, http.MethodDelete, p, q, nil, nil)
}

// Exec runs a command in a sandbox and returns its captured output and exit
// status. Output beyond the daemon's capture limit (1 MiB per stream) is cut
// and Truncated set; use ExecStream for large output.
//
// A command that ran and failed is not an error: see the result's Reason and
// ExitCode.
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest) (*api.ExecResult, error) {
	p, err := sandboxPath(id, "/exec")
	if err != nil {
		return nil, err
	}
	var res api.ExecResult
	if err := c.call(ctx, http.MethodPost, p, nil, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// DroppedMarker is the line ExecStream writes to stderr when the daemon
// reports output it dropped because the reader fell behind; %d is the
// number of bytes.
const DroppedMarker = "[den: %d bytes of output dropped: the reader fell behind]\n"

// ExecStream runs a command in a sandbox, copying its output to stdout and
// stderr as it arrives (nil writers discard), and returns how it ended.
//
// An error frame from the daemon is returned as an *api.Error. When the
// daemon reports dropped output, a DroppedMarker line is written to stderr.
// Cancelling ctx abandons the command.
func (c *Client) ExecStream(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (*api.ExitStatus, error) {
	p, err := sandboxPath(id, "/exec")
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	r := &request{method: http.MethodPost, path: p, body: bytes.NewReader(b),
		contentType: "application/json", accept: api.StreamContentType}
	resp, err := c.send(ctx, r)
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

	// A daemon that does not stream answers with the JSON form.
	if isJSON(resp.Header.Get("Content-Type")) {
		var res api.ExecResult
		if err := decodeBody(resp, r, &res); err != nil {
			return nil, err
		}
		if _, err := stdout.Write(res.Stdout); err != nil {
			return nil, fmt.Errorf("write stdout: %w", err)
		}
		if _, err := stderr.Write(res.Stderr); err != nil {
			return nil, fmt.Errorf("write stderr: %w", err)
		}
		return &res.ExitStatus, nil
	}

	st, err := copyFrames(ctx, resp.Body, stdout, stderr, "exec")
	if err != nil {
		return nil, err
	}
	if st == nil {
		return nil, fmt.Errorf("exec output stream ended without an exit status: %w", io.ErrUnexpectedEOF)
	}
	return st, nil
}

// copyFrames copies the output frames of a framed stream to stdout and
// stderr (which must not be nil) until the exit frame, whose status it
// returns. An error frame is returned as an *api.Error; dropped output is
// reported with a DroppedMarker line on stderr. At a clean end of the stream
// without an exit frame it returns nil, nil; what names the stream in errors.
func copyFrames(ctx context.Context, body io.Reader, stdout, stderr io.Writer, what string) (*api.ExitStatus, error) {
	errw := &lastByteWriter{w: stderr, last: '\n'}
	var werr error // a failed write to stdout or stderr
	st, err := api.ReadExecStream(body, func(f *api.ExecFrame) error {
		switch f.Type {
		case api.FrameStdout:
			if _, err := stdout.Write(f.Payload); err != nil {
				werr = fmt.Errorf("write stdout: %w", err)
			}
		case api.FrameStderr:
			if _, err := errw.Write(f.Payload); err != nil {
				werr = fmt.Errorf("write stderr: %w", err)
			}
		case api.FrameDropped:
			if errw.last != '\n' {
				errw.Write([]byte{'\n'})
			}
			if _, err := fmt.Fprintf(errw, DroppedMarker, f.Dropped.Bytes); err != nil {
				werr = fmt.Errorf("write stderr: %w", err)
			}
		}
		return werr
	})
	var ae *api.Error
	switch {
	case err == nil:
		return st, nil
	case werr != nil:
		return nil, werr
	case errors.As(err, &ae):
		return nil, ae
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case err == io.EOF:
		return nil, nil
	}
	return nil, fmt.Errorf("%s %w", what, err)
}

// lastByteWriter remembers the last byte written, so a marker line can be
// started on a line of its own.
type lastByteWriter struct {
	w    io.Writer
	last byte
}

func (l *lastByteWriter) Write(p []byte) (int, error) {
	n, err := l.w.Write(p)
	if n > 0 {
		l.last = p[n-1]
	}
	return n, err
}
