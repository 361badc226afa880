package mcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Output bounds: each stream of a command keeps its first headBytes and
// its last tailBytes; what lies between is replaced by a marker.
const (
	headBytes = 16 << 10
	tailBytes = 48 << 10
	// progressChunk bounds the text of one progress notification.
	progressChunk = 8 << 10
	// defaultExecTimeout applies to foreground commands that name none.
	defaultExecTimeout = 10 * time.Minute
)

// bounded keeps the start and the end of what is written to it.
type bounded struct {
	mu   sync.Mutex
	head []byte
	tail []byte // a ring of the last tailBytes, once head is full
	pos  int    // next write position in tail once it is full
	n    int64  // bytes written in all
}

func (b *bounded) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n += int64(len(p))
	rest := p
	if room := headBytes - len(b.head); room > 0 {
		k := min(room, len(rest))
		b.head = append(b.head, rest[:k]...)
		rest = rest[k:]
	}
	for len(rest) > 0 {
		if len(b.tail) < tailBytes {
			k := min(tailBytes-len(b.tail), len(rest))
			b.tail = append(b.tail, rest[:k]...)
			rest = rest[k:]
			continue
		}
		k := copy(b.tail[b.pos:], rest)
		b.pos = (b.pos + k) % tailBytes
		rest = rest[k:]
	}
	return len(p), nil
}

// cut reports whether output was dropped between the head and the tail.
func (b *bounded) cut() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n > headBytes+tailBytes
}

// String is the output kept, as valid UTF-8, with a marker where bytes
// were dropped.
func (b *bounded) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	tail := append(append([]byte(nil), b.tail[b.pos:]...), b.tail[:b.pos]...)
	if dropped := b.n - int64(len(b.head)+len(tail)); dropped > 0 {
		// Start the tail at a line (or at least a rune) boundary.
		if i := strings.IndexByte(string(tail[:min(len(tail), 4096)]), '\n'); i >= 0 {
			tail = tail[i+1:]
		}
		for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
			tail = tail[1:]
		}
		dropped = b.n - int64(len(b.head)+len(tail))
		return strings.ToValidUTF8(string(b.head), "\uFFFD") +
			fmt.Sprintf("\n[... %d bytes of output left out ...]\n", dropped) +
			strings.ToValidUTF8(string(tail), "\uFFFD")
	}
	return strings.ToValidUTF8(string(b.head)+string(tail), "\uFFFD")
}

type execIn struct {
	sandboxArg
	Cmd        []string `json:"cmd,omitempty" jsonschema:"the command as an argv, like [\"make\", \"test\"]; give cmd or shell"`
	Shell      string   `json:"shell,omitempty" jsonschema:"a script run by /bin/sh -c (or by the session's shell); give cmd or shell"`
	Workdir    string   `json:"workdir,omitempty" jsonschema:"the working directory"`
	Env        []string `json:"env,omitempty" jsonschema:"extra variables, each like KEY=VALUE"`
	User       string   `json:"user,omitempty" jsonschema:"run as this user (name or uid)"`
	Stdin      string   `json:"stdin,omitempty" jsonschema:"text given to the command's standard input"`
	Timeout    string   `json:"timeout,omitempty" jsonschema:"kill the command after this long, like 30s or 5m (default 10m; background processes have none)"`
	Background bool     `json:"background,omitempty" jsonschema:"start a background process that outlives this call and return its id at once"`
	Name       string   `json:"name,omitempty" jsonschema:"a name for the background process"`
	Session    string   `json:"session,omitempty" jsonschema:"run in this named shell session: cwd, variables and functions persist between calls"`
}

type execOut struct {
	ExitCode   int              `json:"exit_code"`
	Reason     string           `json:"reason,omitempty" jsonschema:"exited, signaled, timeout, oom or failed"`
	Signal     string           `json:"signal,omitempty"`
	Error      string           `json:"error,omitempty"`
	Stdout     string           `json:"stdout"`
	Stderr     string           `json:"stderr"`
	Truncated  bool             `json:"truncated,omitempty" jsonschema:"output was cut to its start and end"`
	DurationMS float64          `json:"duration_ms"`
	Process    *api.ProcessInfo `json:"process,omitempty" jsonschema:"the background process started"`
	Denied     []api.DeniedConn `json:"denied,omitempty" jsonschema:"connections and DNS queries the sandbox's network policy refused the command (host, port, proto, rule, reason, count); the net log has them all"`
}

// exec is a handler of its own (not a method onSandbox takes) because it
// needs the request: its progress token and session.
func (s *server) exec(ctx context.Context, req *sdk.CallToolRequest, in execIn) (*sdk.CallToolResult, execOut, error) {
	return onSandbox(s, func(ctx context.Context, c *client.Client, id string, in execIn) (execOut, error) {
		if (len(in.Cmd) == 0) == (in.Shell == "") {
			return execOut{}, errors.New(`invalid: give exactly one of cmd (an argv, like ["ls", "-l"]) and shell (a script)`)
		}
		er := api.ExecRequest{Cmd: in.Cmd, Shell: in.Shell, Workdir: in.Workdir, Env: in.Env, User: in.User, Session: in.Session, Name: in.Name}
		if in.Stdin != "" {
			er.Stdin = []byte(in.Stdin)
		}
		if err := parseDuration("timeout", in.Timeout, &er.Timeout); err != nil {
			return execOut{}, err
		}
		if in.Background {
			if in.Stdin != "" {
				return execOut{}, errors.New("invalid: stdin: a background process reads its input from process_write_stdin")
			}
			p, err := c.StartProcess(ctx, id, er)
			if err != nil {
				return execOut{}, err
			}
			return execOut{Process: p}, nil
		}
		if in.Name != "" {
			return execOut{}, errors.New("invalid: name: only a background process has a name")
		}
		if er.Timeout == 0 {
			er.Timeout = api.Duration(defaultExecTimeout)
		}
		var out, errb bounded
		var st *api.ExitStatus
		var err error
		t0 := time.Now()
		if token := req.Params.GetProgressToken(); token != nil && req.Session != nil {
			p := &progress{ctx: ctx, ss: req.Session, token: token}
			st, err = c.ExecStream(ctx, id, er, p.tee(&out), p.tee(&errb))
		} else {
			var res *api.ExecResult
			if res, err = c.Exec(ctx, id, er); err == nil {
				st = &res.ExitStatus
				out.Write(res.Stdout)
				errb.Write(res.Stderr)
			}
		}
		if err != nil {
			return execOut{}, err
		}
		return execOut{ExitCode: st.ExitCode, Reason: st.Reason, Signal: st.Signal, Error: st.Error,
			Stdout: out.String(), Stderr: errb.String(), Truncated: out.cut() || errb.cut(), Denied: st.Denied,
			DurationMS: float64(time.Since(t0).Microseconds()) / 1000}, nil
	})(ctx, req, in)
}

// progress sends a command's output, as it comes, as progress
// notifications of the call that asked for them.
type progress struct {
	ctx   context.Context
	ss    *sdk.ServerSession
	token any
	mu    sync.Mutex
	n     int64
}

type teeWriter struct {
	p   *progress
	dst *bounded
}

func (p *progress) tee(dst *bounded) *teeWriter { return &teeWriter{p, dst} }

func (t *teeWriter) Write(b []byte) (int, error) {
	t.dst.Write(b)
	p := t.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for rest := b; len(rest) > 0; {
		chunk := rest[:min(len(rest), progressChunk)]
		rest = rest[len(chunk):]
		p.n += int64(len(chunk))
		// A client that stopped listening does not stop the command.
		p.ss.NotifyProgress(p.ctx, &sdk.ProgressNotificationParams{ProgressToken: p.token,
			Progress: float64(p.n), Message: strings.ToValidUTF8(string(chunk), "\uFFFD")})
	}
	return len(b), nil
}
