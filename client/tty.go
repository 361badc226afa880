package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"

	"github.com/coder/websocket"

	"github.com/den-dev/den/api"
)

// A process started with ExecRequest.TTY runs on a terminal. AttachTTY
// connects to that terminal:
//
//	p, err := c.StartProcess(ctx, id, api.ExecRequest{Cmd: []string{"bash", "-l"}, TTY: true, Rows: 24, Cols: 80})
//	...
//	t, err := c.AttachTTY(ctx, id, p.ID)
//	...
//	defer t.Close()
//	go io.Copy(t, os.Stdin)
//	io.Copy(os.Stdout, t) // until the process ends
//	st, err := t.Wait()

// TTY is a connection to the terminal of a process: what is written to it
// is typed on the terminal, what is read from it is what the terminal
// shows (first what the daemon kept of the screen output, then new output).
// Read returns io.EOF once the process has ended; Wait then gives how.
//
// Write, Resize, Signal and Close may be called concurrently with each
// other and with Read; Read and Wait must not be called concurrently with
// themselves or each other.
type TTY struct {
	conn   *websocket.Conn
	ctx    context.Context // the connection's life; cancelled by Close
	cancel context.CancelFunc
	proc   string

	// Read state (see Read and Wait).
	pending []byte
	exit    *api.ExitStatus
	err     error // the error ending the reading: io.EOF after the exit message

	closeOnce sync.Once
	closeErr  error
}

// AttachTTY connects to the terminal of process proc of sandbox id, a
// process started with ExecRequest.TTY. ctx bounds the connection's set-up
// only; Close ends the connection. Leaving never stops the process: to end
// it, send a signal (Signal), type exit, or use Kill.
func (c *Client) AttachTTY(ctx context.Context, id, proc string) (*TTY, error) {
	p, err := processPath(id, proc, "/tty")
	if err != nil {
		return nil, err
	}
	conn, err := c.dialWebSocket(ctx, p, "attach to the terminal of "+proc)
	if err != nil {
		return nil, err
	}
	// A message may carry up to api.MaxTTYMessage bytes, plus framing.
	conn.SetReadLimit(api.MaxTTYMessage + 1024)
	tctx, cancel := context.WithCancel(context.Background())
	return &TTY{conn: conn, ctx: tctx, cancel: cancel, proc: proc}, nil
}

// Read reads terminal output. It returns io.EOF after the process has
// ended (see Wait), and another error when the connection broke first.
func (t *TTY) Read(p []byte) (int, error) {
	for len(t.pending) == 0 {
		if t.err != nil {
			return 0, t.err
		}
		t.next()
	}
	n := copy(p, t.pending)
	t.pending = t.pending[n:]
	return n, nil
}

// next reads one message: output into t.pending, or the end into t.exit
// and t.err.
func (t *TTY) next() {
	typ, msg, err := t.conn.Read(t.ctx)
	if err != nil {
		switch {
		case t.ctx.Err() != nil:
			t.err = fmt.Errorf("terminal of %s: %w", t.proc, net.ErrClosed)
		case websocket.CloseStatus(err) != -1:
			var ce websocket.CloseError
			errors.As(err, &ce)
			t.err = fmt.Errorf("terminal of %s: the connection closed (%v%s) without an exit status: %w", t.proc, ce.Code, reasonSuffix(ce.Reason), io.ErrUnexpectedEOF)
		case errors.Is(err, io.EOF):
			t.err = fmt.Errorf("terminal of %s: the connection ended without an exit status: %w", t.proc, io.ErrUnexpectedEOF)
		default:
			t.err = fmt.Errorf("terminal of %s: %w", t.proc, err)
		}
		return
	}
	if typ == websocket.MessageBinary {
		t.pending = msg
		return
	}
	var ctl api.TTYControl
	if json.Unmarshal(msg, &ctl) != nil || ctl.Exit == nil {
		return // not for us
	}
	t.exit, t.err = ctl.Exit, io.EOF
}

// Wait returns how the process ended, once the daemon has said so (the
// last message on the connection, after all output). Output not yet read
// is discarded; to keep it, Read until io.EOF before calling Wait.
func (t *TTY) Wait() (*api.ExitStatus, error) {
	t.pending = nil
	for t.err == nil {
		t.next()
		t.pending = nil
	}
	if t.exit == nil {
		return nil, t.err
	}
	return t.exit, nil
}

// Write types p on the terminal, in messages of at most api.MaxTTYMessage
// bytes.
func (t *TTY) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p
		if len(chunk) > api.MaxTTYMessage {
			chunk = chunk[:api.MaxTTYMessage]
		}
		if err := t.conn.Write(t.ctx, websocket.MessageBinary, chunk); err != nil {
			return n, t.writeErr(err)
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// Resize sets the terminal's size, which sends SIGWINCH to its foreground
// processes. Zero sizes are ignored by the daemon.
func (t *TTY) Resize(rows, cols uint16) error {
	return t.control(api.TTYControl{Resize: &api.WindowSize{Rows: rows, Cols: cols}})
}

// Signal sends a signal to the process: a name with or without SIG ("INT",
// "SIGHUP") or a number. Typing Ctrl-C (Write of "\x03") is usually what a
// user means instead: it interrupts the terminal's foreground job.
func (t *TTY) Signal(sig string) error {
	if sig == "" {
		return &api.Error{Kind: api.KindInvalid, Message: "no signal given"}
	}
	return t.control(api.TTYControl{Signal: sig})
}

func (t *TTY) control(ctl api.TTYControl) error {
	b, err := json.Marshal(ctl)
	if err != nil {
		return err
	}
	if err := t.conn.Write(t.ctx, websocket.MessageText, b); err != nil {
		return t.writeErr(err)
	}
	return nil
}

func (t *TTY) writeErr(err error) error {
	if t.ctx.Err() != nil {
		return fmt.Errorf("terminal of %s: %w", t.proc, net.ErrClosed)
	}
	return fmt.Errorf("terminal of %s: %w", t.proc, err)
}

// Close ends the connection; the process keeps running. A Read or Write in
// progress returns an error.
func (t *TTY) Close() error {
	t.closeOnce.Do(func() {
		err := t.conn.Close(websocket.StatusNormalClosure, "")
		t.cancel()
		// A connection the daemon already closed (after the exit message)
		// needs no more.
		if err != nil && websocket.CloseStatus(err) == -1 && !errors.Is(err, net.ErrClosed) && !errors.Is(err, context.Canceled) && !errors.Is(err, io.EOF) {
			t.closeErr = err
		}
	})
	return t.closeErr
}

// dialWebSocket opens a WebSocket to the daemon at path with the client's
// transport and token. A refusal comes back as the daemon's *api.Error, an
// unreachable daemon as *ConnError; other failures are wrapped with what.
func (c *Client) dialWebSocket(ctx context.Context, path, what string) (*websocket.Conn, error) {
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	if cfg.bearer != "" {
		h.Set("Authorization", "Bearer "+cfg.bearer)
	}
	h.Set("User-Agent", "den-client")
	conn, resp, err := websocket.Dial(ctx, cfg.base+path, &websocket.DialOptions{HTTPClient: cfg.http, HTTPHeader: h})
	if err == nil {
		return conn, nil
	}
	if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && (resp.StatusCode < 200 || resp.StatusCode > 299) {
		// The daemon refused with an error document.
		if resp.Body == nil {
			resp.Body = http.NoBody
		}
		return nil, decodeError(resp)
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%s: %w", what, ctx.Err())
	}
	if isDialError(err) {
		return nil, &ConnError{Host: cfg.display, Err: err}
	}
	return nil, fmt.Errorf("%s: %w", what, err)
}

// reasonSuffix is ": reason" for a WebSocket close reason, or "".
func reasonSuffix(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}
