package server_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// signalWriter collects output and says when it has seen a word.
type signalWriter struct {
	mu   sync.Mutex
	b    strings.Builder
	word string
	seen chan struct{}
	once sync.Once
}

func newSignalWriter(word string) *signalWriter {
	return &signalWriter{word: word, seen: make(chan struct{})}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if strings.Contains(w.b.String(), w.word) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// waitFor fails the test when ch yields nothing within a minute (a bound
// on a hang, not a measure of speed).
func waitFor[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("%s: nothing after a minute", what)
	}
	var zero T
	return zero
}

// Revoking a token ends what it holds open: a long exec stream, a terminal,
// a followed log stream and a port forward end with the revocation as their reason, while
// another token's stream goes on.
func TestRevokeEndsStreams(t *testing.T) {
	te := newTokenEnv(t)
	ctx := context.Background()
	tok, c := te.newToken(t, api.TokenRequest{Name: "leaving"})
	_, stays := te.newToken(t, api.TokenRequest{Name: "staying"})
	sb, err := c.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := stays.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}

	type result struct {
		st  *api.ExitStatus
		err error
	}
	// An exec stream of each token, running until told otherwise.
	execStream := func(cl *client.Client, id string) (<-chan result, *signalWriter) {
		out := newSignalWriter("started")
		done := make(chan result, 1)
		go func() {
			st, err := cl.ExecStream(ctx, id, api.ExecRequest{Shell: "echo started; sleep 600"}, out, io.Discard)
			done <- result{st, err}
		}()
		return done, out
	}
	execDone, execOut := execStream(c, sb.ID)
	otherDone, otherOut := execStream(stays, other.ID)
	waitFor(t, "exec stream start", execOut.seen)
	waitFor(t, "the other token's exec stream start", otherOut.seen)

	// A terminal.
	p, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "echo ready; exec cat", TTY: true, Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	tty, err := c.AttachTTY(ctx, sb.ID, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	ttyOut := newSignalWriter("ready")
	ttyDone := make(chan error, 1)
	go func() {
		_, err := io.Copy(ttyOut, tty)
		ttyDone <- err
	}()
	waitFor(t, "terminal output", ttyOut.seen)

	// A followed log stream of a background process.
	bg, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "echo logging; sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	logOut := newSignalWriter("logging")
	logDone := make(chan result, 1)
	go func() {
		st, err := c.Logs(ctx, sb.ID, bg.ID, client.LogsOptions{Follow: true}, logOut, io.Discard)
		logDone <- result{st, err}
	}()
	waitFor(t, "log output", logOut.seen)

	// A port forward to an echo server inside.
	if _, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: `exec python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 7000)); s.listen(1)
c, _ = s.accept()
while True:
    b = c.recv(4096)
    if not b: break
    c.sendall(b)
'`}); err != nil {
		t.Fatal(err)
	}
	var fwd net.Conn
	for range 100 { // until the server listens
		if fwd, err = c.DialPort(ctx, sb.ID, 7000); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer fwd.Close()
	fwd.Write([]byte("ping"))
	buf := make([]byte, 16)
	if n, err := io.ReadAtLeast(fwd, buf, 4); err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("port forward: %q %v", buf[:n], err)
	}
	fwdDone := make(chan error, 1)
	go func() {
		_, err := fwd.Read(buf)
		fwdDone <- err
	}()

	// Control: nothing has ended yet.
	select {
	case r := <-execDone:
		t.Fatalf("the exec stream ended before the revocation: %+v %v", r.st, r.err)
	case err := <-ttyDone:
		t.Fatalf("the terminal ended before the revocation: %v", err)
	case r := <-logDone:
		t.Fatalf("the log stream ended before the revocation: %+v %v", r.st, r.err)
	case err := <-fwdDone:
		t.Fatalf("the port forward ended before the revocation: %v", err)
	default:
	}

	if err := te.admin.RemoveToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	r := waitFor(t, "the exec stream after the revocation", execDone)
	if ae := wantKind(t, r.err, api.KindUnauthorized); !strings.Contains(ae.Message, "revoked") {
		t.Errorf("exec stream ended with %q, want the revocation named", ae.Message)
	}
	if err := waitFor(t, "the terminal after the revocation", ttyDone); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("terminal ended with %v, want the revocation named", err)
	}
	r = waitFor(t, "the log stream after the revocation", logDone)
	if ae := wantKind(t, r.err, api.KindUnauthorized); !strings.Contains(ae.Message, "revoked") {
		t.Errorf("log stream ended with %q, want the revocation named", ae.Message)
	}
	if err := waitFor(t, "the port forward after the revocation", fwdDone); websocket.CloseStatus(err) != websocket.StatusPolicyViolation || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("port forward ended with %v, want a policy-violation close naming the revocation", err)
	}
	// The other token's stream is untouched.
	select {
	case r := <-otherDone:
		t.Fatalf("another token's exec stream ended too: %+v %v", r.st, r.err)
	default:
	}
	if _, err := stays.Exec(ctx, other.ID, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
		t.Fatalf("the other token after the revocation: %v", err)
	}
}
