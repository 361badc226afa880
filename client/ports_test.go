package client

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/coder/websocket"

	"github.com/den-dev/den/api"
)

// tcpFake is a daemon with the raw TCP route for port 7 of sandbox web: it
// echoes every binary message, and closes the connection normally after
// the message "bye". Port 9 has nothing listening.
type tcpFake struct {
	host string
	mu   sync.Mutex
	auth []string
	max  int // the largest message received
}

func newTCPFake(t *testing.T, unix bool) *tcpFake {
	f := &tcpFake{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}/ports/{port}/tcp", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.auth = append(f.auth, r.Header.Get("Authorization"))
		f.mu.Unlock()
		switch {
		case r.PathValue("id") != "web":
			jsonAnswer(404, api.ErrorDoc{Error: &api.Error{Kind: api.KindNotFound, Message: "no sandbox \"" + r.PathValue("id") + "\""}})(w, r)
			return
		case r.PathValue("port") != "7":
			jsonAnswer(409, api.ErrorDoc{Error: &api.Error{Kind: api.KindConflict, Message: "nothing answers on port " + r.PathValue("port")}})(w, r)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(api.MaxTTYMessage) // as the daemon does
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if typ != websocket.MessageBinary {
				t.Errorf("a %v message on a raw TCP connection", typ)
			}
			f.mu.Lock()
			f.max = max(f.max, len(msg))
			f.mu.Unlock()
			if string(msg) == "bye" {
				c.Close(websocket.StatusNormalClosure, "closed")
				return
			}
			if err := c.Write(r.Context(), websocket.MessageBinary, msg); err != nil {
				return
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

func TestDialPort(t *testing.T) {
	for _, transport := range []string{"tcp", "unix"} {
		t.Run(transport, func(t *testing.T) {
			t.Setenv("DEN_TOKEN", "")
			t.Setenv("DEN_DATA", t.TempDir())
			f := newTCPFake(t, transport == "unix")
			c := &Client{Host: f.host, Token: "s3cret"}
			conn, err := c.DialPort(ctx, "web", 7)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			if got := readUntil(t, conn, "hello"); got != "hello" {
				t.Errorf("read %q", got)
			}
			// A write larger than a message the daemon accepts goes in
			// several.
			big := bytes.Repeat([]byte("0123456789abcdef"), (api.MaxTTYMessage*5/2)/16)
			go conn.Write(big)
			got := make([]byte, len(big))
			if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, big) {
				t.Fatalf("echo of %d bytes: %v (equal: %v)", len(big), err, bytes.Equal(got, big))
			}
			f.mu.Lock()
			if f.max > api.MaxTTYMessage {
				t.Errorf("a message of %d bytes, over the limit %d", f.max, api.MaxTTYMessage)
			}
			if f.auth[0] != "Bearer s3cret" {
				t.Errorf("Authorization %q", f.auth[0])
			}
			f.mu.Unlock()
			// The server's end closing is io.EOF.
			conn.Write([]byte("bye"))
			if n, err := conn.Read(make([]byte, 10)); n != 0 || err != io.EOF {
				t.Errorf("after the server closed: %d, %v; want io.EOF", n, err)
			}
		})
	}
}

func TestDialPortErrors(t *testing.T) {
	f := newTCPFake(t, true)
	c := New(f.host)
	if _, err := c.DialPort(ctx, "web", 9); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "nothing answers on port 9") {
		t.Errorf("nothing listening: %v", err)
	}
	if _, err := c.DialPort(ctx, "nope", 7); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("no sandbox: %v", err)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := c.DialPort(ctx, "web", p); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("port %d: %v", p, err)
		}
		if _, err := c.SharePort(ctx, "web", p, false); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("share port %d: %v", p, err)
		}
		if err := c.UnsharePort(ctx, "web", p); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("unshare port %d: %v", p, err)
		}
	}
	if _, err := c.DialPort(ctx, "", 7); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("no id: %v", err)
	}
	var ce *ConnError
	if _, err := New("unix:///nonexistent/den.sock").DialPort(ctx, "web", 7); !errors.As(err, &ce) {
		t.Errorf("no daemon: %v", err)
	}
}

func TestPreviewURLs(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef"
	private := &api.Preview{Port: 8000, Token: "a+b", Path: "/preview/" + id + "/8000/", Host: "8000-" + id + ".localhost"}
	public := &api.Preview{Port: 3000, Public: true, Path: "/preview/" + id + "/3000/"}
	domain := &api.Preview{Port: 5173, Token: "t", Path: "/preview/" + id + "/5173/", Host: "5173-" + id + ".dev.example.com"}
	// Daemons on unix sockets, answering GET /v1/info with their listeners.
	sockWith := func(listeners ...string) string {
		srv := httptest.NewUnstartedServer(jsonAnswer(200, api.Info{Listeners: listeners}))
		sock := onUnixSocket(t, srv)
		srv.Start()
		t.Cleanup(srv.Close)
		return sock
	}
	loopback := sockWith("unix:///run/den/den.sock", "tcp://127.0.0.1:7420")
	all := sockWith("tcp://0.0.0.0:7421")
	only := sockWith("unix:///run/den/den.sock")
	for _, tc := range []struct {
		host       string
		p          *api.Preview
		hostURL    string
		path, sock string
	}{
		{"tcp://127.0.0.1:7420", private, "http://8000-" + id + ".localhost:7420/?den_token=a%2Bb", "http://127.0.0.1:7420/preview/" + id + "/8000/?den_token=a%2Bb", ""},
		{"tcp://127.0.0.1:7420", public, "", "http://127.0.0.1:7420/preview/" + id + "/3000/", ""},
		// A remote daemon's localhost is not this machine's: no host URL.
		{"https://den.example.com/", private, "", "https://den.example.com/preview/" + id + "/8000/?den_token=a%2Bb", ""},
		{"https://den.example.com/", domain, "https://5173-" + id + ".dev.example.com/?den_token=t", "https://den.example.com/preview/" + id + "/5173/?den_token=t", ""},
		// Over the unix socket: the daemon's TCP listener, for browsers.
		{"unix://" + loopback, private, "http://8000-" + id + ".localhost:7420/?den_token=a%2Bb", "http://127.0.0.1:7420/preview/" + id + "/8000/?den_token=a%2Bb", ""},
		{loopback, public, "", "http://127.0.0.1:7420/preview/" + id + "/3000/", ""},
		{"unix://" + all, private, "http://8000-" + id + ".localhost:7421/?den_token=a%2Bb", "http://127.0.0.1:7421/preview/" + id + "/8000/?den_token=a%2Bb", ""},
		// No TCP listener: only through the socket.
		{"unix://" + only, private, "", "/preview/" + id + "/8000/?den_token=a%2Bb", only},
	} {
		l, err := New(tc.host).PreviewURLs(context.Background(), tc.p)
		if err != nil || l.HostURL != tc.hostURL || l.PathURL != tc.path || l.Socket != tc.sock {
			t.Errorf("%s, port %d: %+v %v, want %q %q %q", tc.host, tc.p.Port, l, err, tc.hostURL, tc.path, tc.sock)
		}
		if want := cmp.Or(tc.hostURL, tc.path); l.URL() != want {
			t.Errorf("%s, port %d: URL() %q, want %q", tc.host, tc.p.Port, l.URL(), want)
		}
	}
	if _, err := New("unix:///nonexistent/den.sock").PreviewURLs(context.Background(), private); err == nil {
		t.Error("no daemon to ask for its listeners: no error")
	}
}
