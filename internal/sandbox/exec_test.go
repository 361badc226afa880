package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/store"
)

// scriptedBox is a running box whose agent answers every exec with the
// stream in *script, byte for byte.
type scriptedBox struct {
	ag   *agent.Client
	done chan struct{}
}

func (b scriptedBox) Agent() *agent.Client         { return b.ag }
func (scriptedBox) Pid() int                       { return os.Getpid() }
func (scriptedBox) Stop(context.Context) error     { return nil }
func (b scriptedBox) Done() <-chan struct{}        { return b.done }
func (scriptedBox) OOMKills() uint64               { return 0 }
func (scriptedBox) SetLimits(isolate.Limits) error { return nil }

// scriptedAgent serves exec on a unix socket with the stream in *script.
func scriptedAgent(t *testing.T, script *[]byte) *agent.Client {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+agent.PathExec, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", api.StreamContentType)
		w.Write(*script)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	ag := agent.UnixClient(sock)
	t.Cleanup(ag.Close)
	return ag
}

// bootlessManager is a manager with its data in dir whose runtime starts
// nothing: a test puts the boxes it needs in place itself.
func bootlessManager(tb testing.TB, dir string) *Manager {
	db, err := store.Open(filepath.Join(dir, "den.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	imgs, err := image.NewStore(filepath.Join(dir, "images"))
	if err != nil {
		tb.Fatal(err)
	}
	m, err := New(context.Background(), Config{DataDir: dir, Runtime: noRuntime{}, Store: db, Images: imgs, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(m.Close)
	return m
}

// One stream decoder serves the manager (reading an agent's exec stream)
// and the Go SDK (reading the daemon's): the same bytes through both give
// the same output and exit status, the same error frame, and the same
// refusal of a broken or malformed stream. (Before they shared it, the
// manager passed a started frame whose JSON did not decode on to its
// caller and the SDK skipped it, and they named a bad exit frame
// differently.)
func TestExecStreamBothReaders(t *testing.T) {
	ctx := context.Background()
	m := bootlessManager(t, t.TempDir())
	var script []byte
	id := strings.Repeat("ab", 32)
	rec := &record{Sandbox: api.Sandbox{ID: id, Name: "scripted", Image: HostImage, State: api.StateRunning, CreatedAt: time.Now().UTC()}}
	if err := m.put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.boxes[id] = scriptedBox{ag: scriptedAgent(t, &script), done: make(chan struct{})}
	m.mu.Unlock()

	// The daemon's side for the SDK: the same bytes as its exec stream.
	daemon := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", api.StreamContentType)
		w.Write(script)
	}))
	t.Cleanup(daemon.Close)
	sdk := &client.Client{Host: daemon.URL, Token: "t"}

	frames := func(fs ...[]byte) []byte { return bytes.Join(fs, nil) }
	frame := func(typ byte, payload string) []byte {
		var b bytes.Buffer
		api.WriteFrame(&b, typ, []byte(payload))
		return b.Bytes()
	}
	started := frame(api.FrameStarted, `{"id":"p1","pid":7}`)
	exit := frame(api.FrameExit, `{"exit_code":3,"reason":"exited"}`)
	for _, c := range []struct {
		name    string
		stream  []byte
		stdout  string
		code    int
		kind    string // of an error frame's error
		message string // in the error, when the stream is refused
	}{
		{name: "exit", stream: frames(started, frame(api.FrameStdout, "hello\n"), frame(api.FrameStderr, "oops"), frame(api.FrameDropped, `{"bytes":10}`), exit), stdout: "hello\n", code: 3},
		{name: "error frame", stream: frames(started, frame(api.FrameError, `{"kind":"conflict","message":"sandbox stopped"}`)), kind: api.KindConflict, message: "sandbox stopped"},
		{name: "error frame without a kind", stream: frame(api.FrameError, `{"message":"lost"}`), kind: api.KindInternal, message: "lost"},
		{name: "bad started frame", stream: frames(frame(api.FrameStarted, `{"id":`), exit), message: "bad started frame"},
		{name: "bad dropped frame", stream: frames(started, frame(api.FrameDropped, `"ten"`), exit), message: "bad dropped-output frame"},
		{name: "bad exit frame", stream: frames(started, frame(api.FrameExit, `{"exit_code":"3"}`)), message: "bad exit frame"},
		{name: "bad error frame", stream: frames(started, frame(api.FrameError, `not json`)), message: "bad error frame"},
		{name: "unknown frame", stream: frames(started, frame(9, "?"), exit), message: "unknown frame type 9"},
		{name: "cut off", stream: frames(started, exit[:len(exit)-2]), message: "output stream ended without an exit status"},
		{name: "no exit frame", stream: frames(started, frame(api.FrameStdout, "x")), message: "output stream ended without an exit status"},
	} {
		t.Run(c.name, func(t *testing.T) {
			script = c.stream
			var mout bytes.Buffer
			mst, merr := m.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}}, func(typ byte, p []byte) error {
				if typ == api.FrameStdout {
					mout.Write(p)
				}
				return nil
			})
			var sout, serr bytes.Buffer
			sst, serrv := sdk.ExecStream(ctx, id, api.ExecRequest{Cmd: []string{"true"}}, &sout, &serr)
			for _, r := range []struct {
				who string
				st  *api.ExitStatus
				err error
				out string
			}{{"manager", mst, merr, mout.String()}, {"sdk", sst, serrv, sout.String()}} {
				if c.message == "" {
					if r.err != nil || r.st == nil || r.st.ExitCode != c.code || r.out != c.stdout {
						t.Errorf("%s: status %+v, stdout %q, error %v; want exit %d with %q", r.who, r.st, r.out, r.err, c.code, c.stdout)
					}
					continue
				}
				if r.err == nil || !strings.Contains(r.err.Error(), c.message) {
					t.Errorf("%s: status %+v, error %v; want an error saying %q", r.who, r.st, r.err, c.message)
					continue
				}
				var ae *api.Error
				if isFrame := errors.As(r.err, &ae); isFrame != (c.kind != "") || isFrame && ae.Kind != c.kind {
					t.Errorf("%s: error %v (api error: %v), want an error frame's of kind %q", r.who, r.err, isFrame, c.kind)
				}
			}
			if c.message == "" && !strings.Contains(serr.String(), "oops\n[den: 10 bytes of output dropped") {
				t.Errorf("sdk stderr %q: want the dropped-output marker on a line of its own", serr.String())
			}
		})
	}
}
