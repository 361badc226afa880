package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/den-dev/den/api"
)

func (e *env) dialTTY(t *testing.T, ctx context.Context, id, proc string) *websocket.Conn {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", e.sock)
	}}}
	c, _, err := websocket.Dial(ctx, "ws://den/v1/sandboxes/"+id+"/processes/"+proc+"/tty", &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatalf("dial tty: %v", err)
	}
	c.SetReadLimit(4 << 20)
	return c
}

// screen collects terminal output until want appears.
type screen struct {
	c    *websocket.Conn
	buf  bytes.Buffer
	exit *api.ExitStatus
}

func (s *screen) waitFor(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	for !strings.Contains(s.buf.String(), want) {
		typ, msg, err := s.c.Read(ctx)
		if err != nil {
			t.Fatalf("waiting for %q: %v; screen so far %q", want, err, s.buf.String())
		}
		if typ == websocket.MessageText {
			var ctl api.TTYControl
			json.Unmarshal(msg, &ctl)
			s.exit = ctl.Exit
			continue
		}
		s.buf.Write(msg)
	}
}

func TestInteractiveTTY(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, api.CreateRequest{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, _ := json.Marshal(api.ExecRequest{Cmd: []string{"/bin/bash", "--norc", "--noprofile", "-i"}, TTY: true, Rows: 24, Cols: 80, Env: []string{"PS1=den$ ", "TERM=xterm"}})
	status, out := e.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/processes", bytes.NewReader(b))
	var p api.ProcessInfo
	if status != 201 || json.Unmarshal(out, &p) != nil {
		t.Fatalf("start tty: %d %s", status, out)
	}
	c := e.dialTTY(t, ctx, sb.ID, p.ID)
	s := &screen{c: c}
	s.waitFor(t, ctx, "den$ ")
	c.Write(ctx, websocket.MessageBinary, []byte("echo hel''lo; tty\n"))
	s.waitFor(t, ctx, "hello\r\n/dev/pts/")
	// Resize is seen by the program.
	ctl, _ := json.Marshal(api.TTYControl{Resize: &api.WindowSize{Rows: 40, Cols: 100}})
	c.Write(ctx, websocket.MessageText, ctl)
	time.Sleep(100 * time.Millisecond)
	c.Write(ctx, websocket.MessageBinary, []byte("stty size\n"))
	s.waitFor(t, ctx, "40 100")
	// Ctrl-C interrupts the foreground job, not the shell; job control works.
	c.Write(ctx, websocket.MessageBinary, []byte("sleep 100\n"))
	time.Sleep(300 * time.Millisecond)
	c.Write(ctx, websocket.MessageBinary, []byte{3})
	c.Write(ctx, websocket.MessageBinary, []byte("echo after-$?\n"))
	s.waitFor(t, ctx, "after-130")
	c.Write(ctx, websocket.MessageBinary, []byte("sleep 50 &\njobs\n"))
	s.waitFor(t, ctx, "Running")
	// Garbage control messages are ignored.
	c.Write(ctx, websocket.MessageText, []byte("{not json"))
	c.Write(ctx, websocket.MessageText, []byte(`{"resize":{"rows":0,"cols":0}}`))
	// Detach and reattach: the screen history is replayed, the shell lives on.
	c.Close(websocket.StatusNormalClosure, "")
	c = e.dialTTY(t, ctx, sb.ID, p.ID)
	s = &screen{c: c}
	s.waitFor(t, ctx, "after-130")
	c.Write(ctx, websocket.MessageBinary, []byte("exit 3\n"))
	for s.exit == nil {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("no exit message: %v", err)
		}
		if typ == websocket.MessageText {
			var ctl api.TTYControl
			json.Unmarshal(msg, &ctl)
			s.exit = ctl.Exit
		}
	}
	if s.exit.ExitCode != 3 {
		t.Fatalf("exit status %+v", s.exit)
	}
	// A message over the limit ends that connection only.
	_, out = e.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/processes", bytes.NewReader(b))
	json.Unmarshal(out, &p)
	c = e.dialTTY(t, ctx, sb.ID, p.ID)
	c.Write(ctx, websocket.MessageBinary, make([]byte, api.MaxTTYMessage+10))
	if _, _, err := c.Read(ctx); err == nil {
		for i := 0; i < 100; i++ {
			if _, _, err = c.Read(ctx); err != nil {
				break
			}
		}
	}
	if r := e.sh(t, sb.ID, "echo still-fine"); string(r.Stdout) != "still-fine\n" {
		t.Fatalf("after a flood: %q", r.Stdout)
	}
	// Not a tty process, unknown process: clear errors, no upgrade.
	status, _ = e.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/processes/p999/tty", nil)
	if status != 404 {
		t.Fatalf("tty of unknown process: %d", status)
	}
}

// The terminal route takes a process's name as the other process routes
// do, and a paused sandbox's process list (kept while it sleeps) answers
// to names too.
func TestProcessNameTTYAndAsleep(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, api.CreateRequest{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, _ := json.Marshal(api.ExecRequest{Cmd: []string{"/bin/sh"}, TTY: true, Rows: 24, Cols: 80, Env: []string{"PS1=den$ "}, Name: "term"})
	status, out := e.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/processes", bytes.NewReader(b))
	var p api.ProcessInfo
	if status != 201 || json.Unmarshal(out, &p) != nil {
		t.Fatalf("start tty: %d %s", status, out)
	}
	if _, err := e.c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var got api.ProcessInfo
	if status, out := e.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/processes/term", nil); status != 200 || json.Unmarshal(out, &got) != nil || got.ID != p.ID {
		t.Fatalf("GET processes/term while paused: %d %s, want %s", status, out, p.ID)
	}
	if status, out := e.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/processes/nosuch", nil); status != 404 || !strings.Contains(string(out), "--name") {
		t.Fatalf("GET processes/nosuch while paused: %d %s", status, out)
	}
	if sb2, err := e.c.Get(ctx, sb.ID); err != nil || sb2.State != api.StatePaused {
		t.Fatalf("the lookups woke the sandbox: %+v %v", sb2, err)
	}
	if _, err := e.c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	c := e.dialTTY(t, ctx, sb.ID, "term")
	s := &screen{c: c}
	c.Write(ctx, websocket.MessageBinary, []byte("echo by-$((40+2))\n"))
	s.waitFor(t, ctx, "by-42")
	c.Close(websocket.StatusNormalClosure, "")
}
