package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/den-dev/den/api"
)

// ttyFake is a daemon with a terminal endpoint for process p1 of sandbox
// web: it sends a screen replay, echoes what is typed, answers a resize
// with a line naming the size, a signal with an exit by that signal, and
// the line "exit N" with an exit with code N. Process p2 has no terminal;
// for process p3 the connection closes without an exit status.
type ttyFake struct {
	host string

	mu       sync.Mutex
	auth     []string // the Authorization header of each connection
	binary   [][]byte // binary messages received
	text     []string // text messages received
	closedBy chan websocket.StatusCode
}

func newTTYFake(t *testing.T, unix bool) *ttyFake {
	f := &ttyFake{closedBy: make(chan websocket.StatusCode, 8)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{proc}/tty", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.auth = append(f.auth, r.Header.Get("Authorization"))
		f.mu.Unlock()
		switch {
		case r.PathValue("id") != "web" || r.PathValue("proc") == "p9":
			jsonAnswer(404, api.ErrorDoc{Error: &api.Error{Kind: api.KindNotFound, Message: "no process \"p9\""}})(w, r)
			return
		case r.PathValue("proc") == "p2":
			jsonAnswer(409, api.ErrorDoc{Error: &api.Error{Kind: api.KindConflict, Message: "process p2 was not started with a terminal (tty)"}})(w, r)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(api.MaxTTYMessage)
		ctx := r.Context()
		if r.PathValue("proc") == "p3" {
			c.Write(ctx, websocket.MessageBinary, []byte("bye"))
			c.Close(websocket.StatusGoingAway, "daemon stopping")
			return
		}
		c.Write(ctx, websocket.MessageBinary, []byte("$ "))
		exit := func(st api.ExitStatus) {
			b, _ := json.Marshal(api.TTYControl{Exit: &st})
			c.Write(ctx, websocket.MessageText, b)
			c.Close(websocket.StatusNormalClosure, "exited")
		}
		var line []byte
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				f.closedBy <- websocket.CloseStatus(err)
				return
			}
			f.mu.Lock()
			if typ == websocket.MessageBinary {
				f.binary = append(f.binary, msg)
			} else {
				f.text = append(f.text, string(msg))
			}
			f.mu.Unlock()
			if typ == websocket.MessageText {
				var ctl api.TTYControl
				if err := json.Unmarshal(msg, &ctl); err != nil {
					t.Errorf("control message %q: %v", msg, err)
					continue
				}
				if ctl.Resize != nil {
					c.Write(ctx, websocket.MessageBinary, fmt.Appendf(nil, "[%dx%d]", ctl.Resize.Rows, ctl.Resize.Cols))
				}
				if ctl.Signal != "" {
					exit(api.ExitStatus{Reason: api.ReasonSignaled, Signal: "SIG" + ctl.Signal, ExitCode: -1})
					return
				}
				continue
			}
			if len(msg) > 1000 {
				c.Write(ctx, websocket.MessageBinary, fmt.Appendf(nil, "<%d bytes>", len(msg)))
				continue
			}
			c.Write(ctx, websocket.MessageBinary, msg)
			line = append(line, msg...)
			for {
				l, rest, ok := bytes.Cut(line, []byte("\n"))
				if !ok {
					break
				}
				line = rest
				var code int
				if _, err := fmt.Sscanf(string(l), "exit %d", &code); err == nil {
					c.Write(ctx, websocket.MessageBinary, []byte("logout\r\n"))
					exit(api.ExitStatus{Reason: api.ReasonExited, ExitCode: code})
					return
				}
			}
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("request outside the API contract: %s %s", r.Method, r.URL)
		http.Error(w, "no such route", http.StatusTeapot)
	})
	srv := httptest.NewUnstartedServer(mux)
	if unix {
		f.host = "unix://" + onUnixSocket(t, srv)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	if !unix {
		f.host = "tcp://" + srv.Listener.Addr().String()
	}
	return f
}

// readUntil reads from r until what it read ends with want.
func readUntil(t *testing.T, r io.Reader, want string) string {
	t.Helper()
	var got []byte
	buf := make([]byte, 3) // small, to exercise partial reads
	for !bytes.HasSuffix(got, []byte(want)) {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("read %q, then %v; want %q", got, err, want)
		}
	}
	return string(got)
}

func TestTTY(t *testing.T) {
	for _, transport := range []string{"tcp", "unix"} {
		t.Run(transport, func(t *testing.T) {
			t.Setenv("DEN_TOKEN", "")
			t.Setenv("DEN_DATA", t.TempDir())
			f := newTTYFake(t, transport == "unix")
			c := &Client{Host: f.host, Token: "s3cret"}
			tty, err := c.AttachTTY(ctx, "web", "p1")
			if err != nil {
				t.Fatal(err)
			}
			defer tty.Close()
			if got := readUntil(t, tty, "$ "); got != "$ " {
				t.Errorf("replay %q", got)
			}
			if _, err := io.WriteString(tty, "echo hi\r"); err != nil {
				t.Fatal(err)
			}
			readUntil(t, tty, "echo hi\r")
			if err := tty.Resize(40, 120); err != nil {
				t.Fatal(err)
			}
			readUntil(t, tty, "[40x120]")
			// A write over the message limit goes in several messages.
			big := bytes.Repeat([]byte("x"), api.MaxTTYMessage+10)
			if n, err := tty.Write(big); err != nil || n != len(big) {
				t.Fatalf("big write: %d, %v", n, err)
			}
			readUntil(t, tty, fmt.Sprintf("<%d bytes>", api.MaxTTYMessage))
			readUntil(t, tty, strings.Repeat("x", 10))
			io.WriteString(tty, "\nexit 3\n")
			out, err := io.ReadAll(tty)
			if err != nil {
				t.Fatalf("read to the end: %q, %v", out, err)
			}
			if !strings.HasSuffix(string(out), "logout\r\n") {
				t.Errorf("output before the end %q", out)
			}
			st, err := tty.Wait()
			if err != nil || st.ExitCode != 3 || st.Reason != api.ReasonExited {
				t.Errorf("Wait: %+v, %v", st, err)
			}
			if n, err := tty.Read(make([]byte, 10)); n != 0 || err != io.EOF {
				t.Errorf("Read after the end: %d, %v", n, err)
			}
			if err := tty.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if _, err := tty.Write([]byte("x")); err == nil {
				t.Errorf("Write after Close succeeded")
			}

			f.mu.Lock()
			for _, a := range f.auth {
				if a != "Bearer s3cret" {
					t.Errorf("Authorization %q, want the bearer token", a)
				}
			}
			text := f.text
			f.mu.Unlock()
			if len(text) != 1 || text[0] != `{"resize":{"rows":40,"cols":120}}` {
				t.Errorf("control messages %q", text)
			}
		})
	}
}

func TestTTYSignalAndWait(t *testing.T) {
	f := newTTYFake(t, true)
	c := New(f.host)
	tty, err := c.AttachTTY(ctx, "web", "p1")
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	if err := tty.Signal(""); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("empty signal: %v", err)
	}
	if err := tty.Signal("INT"); err != nil {
		t.Fatal(err)
	}
	// Wait without reading discards the output.
	st, err := tty.Wait()
	if err != nil || st.Reason != api.ReasonSignaled || st.Signal != "SIGINT" {
		t.Errorf("Wait: %+v, %v", st, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.text) != 1 || f.text[0] != `{"signal":"INT"}` {
		t.Errorf("control messages %q", f.text)
	}
}

func TestTTYErrors(t *testing.T) {
	f := newTTYFake(t, true)
	c := New(f.host)
	if _, err := c.AttachTTY(ctx, "web", "p9"); !errors.Is(err, api.ErrNotFound) || !strings.Contains(err.Error(), "no process") {
		t.Errorf("missing process: %v", err)
	}
	if _, err := c.AttachTTY(ctx, "web", "p2"); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "terminal") {
		t.Errorf("process without a terminal: %v", err)
	}
	if _, err := c.AttachTTY(ctx, "web", ""); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("no process id: %v", err)
	}

	// The connection ends without an exit status.
	tty, err := c.AttachTTY(ctx, "web", "p3")
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(tty)
	if string(out) != "bye" || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("ReadAll: %q, %v", out, err)
	}
	if st, err := tty.Wait(); st != nil || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("Wait: %+v, %v", st, err)
	}
	tty.Close()

	// Close unblocks a Read and leaves with a normal closure.
	tty, err = c.AttachTTY(ctx, "web", "p1")
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, tty, "$ ")
	done := make(chan error, 1)
	go func() {
		_, err := tty.Read(make([]byte, 10))
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	tty.Close()
	select {
	case err := <-done:
		if err == nil || err == io.EOF {
			t.Errorf("Read after Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not unblock Read")
	}
	select {
	case st := <-f.closedBy:
		if st != websocket.StatusNormalClosure {
			t.Errorf("the daemon saw close status %v", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon did not see the connection close")
	}

	// An unreachable daemon is a ConnError.
	_, err = New("unix://"+filepath.Join(t.TempDir(), "none.sock")).AttachTTY(ctx, "web", "p1")
	var ce *ConnError
	if !errors.As(err, &ce) {
		t.Errorf("unreachable daemon: %T %v", err, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.AttachTTY(cctx, "web", "p1"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}
