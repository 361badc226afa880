package server_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/server"
)

// devServer is a dev server as Vite and its kind are, for a sandbox: its
// page loads its script from a root-relative URL (BASE/app.js), the
// script writes into the DOM and opens a WebSocket to a root-relative path
// (BASE/ws), which echoes. Given a BASE (argv 1), it serves under it only
// and redirects / there (as vite --base does); /headers shows the proxy
// headers it got, /go?to=URL redirects to URL. The page's load event waits (done.gif) until the
// script has written the echo (ack), so a browser's --dump-dom shows it.
const devServer = `
import base64, hashlib, http.server, json, sys, threading, urllib.parse
BASE, PORT = sys.argv[1], int(sys.argv[2])
ack = threading.Event()
PAGE = ('<html><body><div id="out">none</div><div id="ws">no echo</div>'
        '<script src="BASE/app.js"></script><img src="BASE/done.gif"></body></html>').replace("BASE", BASE)
APP = ('''document.getElementById("out").textContent = "script ran";
var ws = new WebSocket("ws://" + location.host + "BASE/ws");
ws.onopen = function() { ws.send("hello") };
ws.onmessage = function(m) { document.getElementById("ws").textContent = m.data; fetch("BASE/ack") };
ws.onerror = function() { document.getElementById("ws").textContent = "ws error"; fetch("BASE/ack") };
''').replace("BASE", BASE)
class H(http.server.BaseHTTPRequestHandler):
    def reply(self, code, body=b"", ctype="text/html", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype); self.send_header("Content-Length", str(len(body)))
        for k, v in extra: self.send_header(k, v)
        self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        path = self.path.split("?")[0]
        if BASE:
            if path in ("/", "/index.html"):
                return self.reply(302, extra=[("Location", BASE + "/")])
            if not path.startswith(BASE + "/"):
                return self.reply(404, b"not under " + BASE.encode())
            path = path[len(BASE):]
        if path == "/":
            ack.clear(); return self.reply(200, PAGE.encode())
        if path == "/app.js":
            return self.reply(200, APP.encode(), "text/javascript")
        if path == "/ack":
            ack.set(); return self.reply(204)
        if path == "/done.gif":
            ack.wait(60); return self.reply(204)
        if path == "/go":
            return self.reply(302, extra=[("Location", urllib.parse.unquote(self.path.split("to=", 1)[1]))])
        if path == "/headers":
            h = {k: self.headers.get_all(k) for k in ("Host", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
                 "X-Forwarded-Prefix", "X-Forwarded-Port", "Forwarded", "X-Real-Ip", "Cookie")}
            h["path"] = self.path
            return self.reply(200, json.dumps(h).encode(), "application/json")
        if path == "/ws":
            key = self.headers["Sec-WebSocket-Key"]
            accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
            self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            self.wfile.flush()
            while True:
                b1, b2 = self.rfile.read(2)
                n = b2 & 0x7f
                if n == 126: n = int.from_bytes(self.rfile.read(2), "big")
                mask = self.rfile.read(4) if b2 & 0x80 else bytes(4)
                data = bytes(c ^ mask[i % 4] for i, c in enumerate(self.rfile.read(n)))
                if b1 & 0x0f == 8: return
                msg = b"echo: " + data
                self.wfile.write(bytes([0x81, len(msg)]) + msg); self.wfile.flush()
        self.reply(404, b"no " + path.encode())
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
`

// previewEnv is a daemon as den serve --listen unix://... --listen
// tcp://127.0.0.1:0 runs it without --preview-domain: host-name previews
// on localhost, its listeners in GET /v1/info; c talks to it on the unix
// socket.
type previewEnv struct {
	*env
	c       *client.Client
	tcpBase string // http://127.0.0.1:PORT
	port    string // the TCP listener's port
}

func newPreviewEnv(t *testing.T) *previewEnv {
	e := newEnvWith(t, 0, func(e *env) { e.previewDomain = "localhost" })
	srv := server.New(e.m, e.db, slog.New(slog.NewTextHandler(io.Discard, nil)), "test", e.rt.CgroupVersion())
	sock := filepath.Join(e.data, "den2.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.SetInfo(api.Info{Listeners: []string{"unix://" + sock, "tcp://" + tl.Addr().String()}, PreviewDomain: "localhost"})
	for ln, h := range map[net.Listener]http.Handler{ul: server.AsAdmin(srv), tl: srv.Authenticate(srv, testAdminToken)} {
		hs := &http.Server{Handler: srv.PreviewHost(h, "", "localhost")}
		go hs.Serve(ln)
		t.Cleanup(func() { hs.Close() })
	}
	_, port, _ := net.SplitHostPort(tl.Addr().String())
	return &previewEnv{env: e, c: client.New("unix://" + sock), tcpBase: "http://" + tl.Addr().String(), port: port}
}

// startDevServer runs devServer in sandbox id on port, under base, and
// waits until it listens.
func (e *previewEnv) startDevServer(t *testing.T, id string, port, base string) {
	t.Helper()
	e.startProc(t, id, "cat > /tmp/dev"+port+".py <<'EOF'\n"+devServer+"\nEOF\nexec python3 /tmp/dev"+port+".py '"+base+"' "+port)
	for range 100 {
		r := e.sh(t, id, "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", "+port+"), 1)' 2>/dev/null && echo up")
		if string(r.Stdout) == "up\n" {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the dev server on port %s does not listen", port)
}

// share shares port of sandbox id, private, and returns its URLs as the
// client over the unix socket makes them.
func (e *previewEnv) share(t *testing.T, id string, port int) (*api.Preview, client.PreviewLinks) {
	t.Helper()
	p, err := e.c.SharePort(context.Background(), id, port, false)
	if err != nil {
		t.Fatal(err)
	}
	l, err := e.c.PreviewURLs(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return p, l
}

// dumpDOM opens url in headless Chromium (Debian's chromium package,
// scripts/deps.sh) and returns the DOM once the page has loaded.
func dumpDOM(t *testing.T, url string) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("no chromium on this host (scripts/deps.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--no-proxy-server",
		"--user-data-dir="+t.TempDir(), "--dump-dom", url)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom %s: %v\n%s", url, err, stderr.String())
	}
	return string(out)
}

// The URL den prints for a dev server opens in a browser: its
// root-relative script runs and its WebSocket to a root-relative path
// echoes, on a private preview whose token came once in the URL (then in
// the host's cookie). A server started with the path preview's base
// works at the path URL. Sharing again keeps the token; rotate replaces it.
func TestPreviewDevServer(t *testing.T) {
	e := newPreviewEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	e.startDevServer(t, sb.ID, "8000", "")
	p, l := e.share(t, sb.ID, 8000)
	wantHost := "http://8000-" + sb.ID + ".localhost:" + e.port + "/?den_token=" + p.Token
	if l.HostURL != wantHost || l.PathURL != e.tcpBase+p.Path+"?den_token="+p.Token || l.URL() != wantHost {
		t.Fatalf("over the unix socket, the preview URLs are %+v, want the host form %s first, on the TCP listener", l, wantHost)
	}
	const ran, echoed = `<div id="out">script ran</div>`, `<div id="ws">echo: hello</div>`
	// The path form cannot run a page with root-relative URLs: its script
	// is asked of the daemon's root. (This is what the host form fixes.)
	if dom := dumpDOM(t, l.PathURL); strings.Contains(dom, ran) || !strings.Contains(dom, `<div id="out">none</div>`) {
		t.Fatalf("the path URL ran the root-relative script?\n%s", dom)
	}
	if dom := dumpDOM(t, l.HostURL); !strings.Contains(dom, ran) || !strings.Contains(dom, echoed) {
		t.Fatalf("the host URL %s in a browser:\n%s", l.HostURL, dom)
	}

	// vite --base /preview/ID/PORT/: at the path URL, no redirect loop.
	base := strings.TrimSuffix(p.Path, "/8000/") + "/8001"
	e.startDevServer(t, sb.ID, "8001", base)
	_, ql := e.share(t, sb.ID, 8001)
	if dom := dumpDOM(t, ql.PathURL); !strings.Contains(dom, ran) || !strings.Contains(dom, echoed) {
		t.Fatalf("a server with base %s at the path URL %s in a browser:\n%s", base, ql.PathURL, dom)
	}

	// Sharing again keeps the token; rotate makes a new one, and the old
	// one stops working.
	again, err := e.c.SharePort(ctx, sb.ID, 8000, false)
	if err != nil || again.Token != p.Token {
		t.Fatalf("shared again: %+v %v, want the token %s kept", again, err, p.Token)
	}
	rotated, err := e.c.SharePortWith(ctx, sb.ID, api.PortRequest{Port: 8000, Rotate: true})
	if err != nil || rotated.Token == "" || rotated.Token == p.Token {
		t.Fatalf("rotated: %+v %v", rotated, err)
	}
	hc := &http.Client{Timeout: time.Minute}
	if got := previewAnswer(t, hc, e.tcpBase+p.Path+"headers?den_token="+rotated.Token, ""); !strings.HasPrefix(got, "200\n") {
		t.Fatalf("the rotated token: %s", got)
	}
	if got := previewAnswer(t, hc, e.tcpBase+p.Path+"headers?den_token="+p.Token, ""); !strings.HasPrefix(got, "404\n") {
		t.Fatalf("the token before rotation: %s", got)
	}
}

// Bad input to host-name and path previews: an unknown sandbox or port,
// another sandbox's token, a Host with a bad port or a trailing dot get
// the uniform refusal; proxy headers a client sends are replaced by den's.
func TestPreviewBadInput(t *testing.T) {
	e := newPreviewEnv(t)
	sb := e.create(t, api.CreateRequest{})
	other := e.create(t, api.CreateRequest{})
	e.startDevServer(t, sb.ID, "8000", "")
	p, _ := e.share(t, sb.ID, 8000)
	q, _ := e.share(t, other.ID, 8000)
	hc := &http.Client{Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	host := "8000-" + sb.ID + ".localhost"
	refusal := previewAnswer(t, hc, e.tcpBase+"/preview/nosuchbox/8000/", "")
	if !strings.HasPrefix(refusal, "404\n") {
		t.Fatalf("the refusal: %s", refusal)
	}
	// Controls: the host, with a port too, and the path, with the token.
	for _, h := range []string{host, host + ":" + e.port, strings.ToUpper(host)} {
		if got := previewAnswer(t, hc, e.tcpBase+"/headers?den_token="+p.Token, h); !strings.HasPrefix(got, "200\n") || !strings.Contains(got, `"path": "/headers"`) {
			t.Fatalf("Host %s with the token: %s", h, got)
		}
	}
	for what, h := range map[string]string{
		"unknown sandbox":           "8000-0123456789abcdef0123456789abcdef.localhost",
		"unknown port":              "9000-" + sb.ID + ".localhost",
		"trailing dot":              host + ".",
		"trailing dot and port":     host + ".:" + e.port,
		"a port not a number":       host + ":http",
		"a port out of range":       host + ":99999",
		"a port with a sign":        host + ":+" + e.port,
		"no port after the colon":   host + ":",
		"the port written 08000":    "08000-" + sb.ID + ".localhost",
		"a sub-domain of a preview": "x." + host,
		"the id's 12-digit prefix":  "8000-" + sb.ID[:12] + ".localhost",
	} {
		if got := previewAnswer(t, hc, e.tcpBase+"/headers?den_token="+p.Token, h); got != refusal {
			t.Errorf("Host %q (%s): %s\nwant the refusal %s", h, what, got, refusal)
		}
	}
	// *.localhost is not den's alone: other names there reach the API.
	r0, _ := http.NewRequest("GET", e.tcpBase+"/v1/info", nil)
	r0.Host = "den.localhost:" + e.port
	r0.Header.Set("Authorization", "Bearer "+testAdminToken)
	if got := answerOf(t, hc, r0); !strings.HasPrefix(got, "200\n") || !strings.Contains(got, `"listeners"`) {
		t.Errorf("the API at den.localhost: %s", got)
	}
	// Another sandbox's token, in the URL, the header or the cookie.
	for what, req := range map[string]func() *http.Request{
		"query": func() *http.Request {
			r, _ := http.NewRequest("GET", e.tcpBase+"/headers?den_token="+q.Token, nil)
			return r
		},
		"header": func() *http.Request {
			r, _ := http.NewRequest("GET", e.tcpBase+"/headers", nil)
			r.Header.Set("X-Den-Token", q.Token)
			return r
		},
		"cookie": func() *http.Request {
			r, _ := http.NewRequest("GET", e.tcpBase+"/headers", nil)
			r.AddCookie(&http.Cookie{Name: "den_preview_8000", Value: q.Token})
			return r
		},
	} {
		r := req()
		r.Host = host
		if got := answerOf(t, hc, r); got != refusal {
			t.Errorf("another sandbox's token in the %s: %s", what, got)
		}
		r = req()
		r.URL.Path = p.Path + "headers"
		if got := answerOf(t, hc, r); got != refusal {
			t.Errorf("another sandbox's token in the %s, path preview: %s", what, got)
		}
	}
	// The token's cookie, set on the first visit, is host-only and works
	// alone; the server inside never sees it.
	r, _ := http.NewRequest("GET", e.tcpBase+"/?den_token="+p.Token, nil)
	r.Host = host
	resp, err := hc.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	set := resp.Header.Get("Set-Cookie")
	if want := "den_preview_8000=" + p.Token + "; Path=/; HttpOnly; SameSite=Lax"; set != want {
		t.Fatalf("the preview's cookie: %q, want %q (host-only: no Domain)", set, want)
	}

	// Spoofed proxy headers: den's replace the client's, on both forms.
	spoof := map[string]string{"X-Forwarded-For": "6.6.6.6", "X-Forwarded-Host": "evil.test", "X-Forwarded-Proto": "https",
		"X-Forwarded-Prefix": "/evil", "X-Forwarded-Port": "443", "Forwarded": "for=6.6.6.6;host=evil.test", "X-Real-Ip": "6.6.6.6"}
	for _, tc := range []struct {
		url, host, prefix string
	}{
		{e.tcpBase + "/headers", host + ":" + e.port, ""},
		{e.tcpBase + p.Path + "headers", "127.0.0.1:" + e.port, strings.TrimSuffix(p.Path, "/")},
	} {
		r, _ := http.NewRequest("GET", tc.url, nil)
		r.Host = tc.host
		for k, v := range spoof {
			r.Header.Set(k, v)
		}
		r.AddCookie(&http.Cookie{Name: "den_preview_8000", Value: p.Token})
		r.AddCookie(&http.Cookie{Name: "app", Value: "1"})
		resp, err := hc.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", tc.url, resp.StatusCode, err)
		}
		want := map[string]any{"Host": []any{tc.host}, "X-Forwarded-For": []any{"127.0.0.1"}, "X-Forwarded-Host": []any{tc.host},
			"X-Forwarded-Proto": []any{"http"}, "X-Forwarded-Prefix": nil, "X-Forwarded-Port": nil, "Forwarded": nil,
			"X-Real-Ip": nil, "Cookie": []any{"app=1"}, "path": "/headers"}
		if tc.prefix != "" {
			want["X-Forwarded-Prefix"] = []any{tc.prefix}
		}
		gotJSON, _ := json.Marshal(got)
		wantJSON, _ := json.Marshal(want)
		if string(gotJSON) != string(wantJSON) {
			t.Errorf("Host %s, the server inside got\n%s\nwant\n%s", tc.host, gotJSON, wantJSON)
		}
	}

	// A redirect to the path asked for with another query is no sign
	// that the server serves under the prefix: the path preview still
	// strips it.
	to := p.Path + "go"
	if got := previewAnswer(t, hc, e.tcpBase+p.Path+"go?den_token="+p.Token+"&to="+to, ""); !strings.HasPrefix(got, "302\n") || !strings.Contains(got, "Location: "+to+"\n") {
		t.Fatalf("the redirect: %s", got)
	}
	if got := previewAnswer(t, hc, e.tcpBase+p.Path+"headers?den_token="+p.Token, ""); !strings.Contains(got, `"path": "/headers"`) {
		t.Fatalf("after a redirect to the same path with another query, the prefix is no longer stripped: %s", got)
	}
}
