package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/api"
)

// previewAnswer is everything a preview answer shows but its date.
func previewAnswer(t *testing.T, hc *http.Client, url, host string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if host != "" {
		req.Host = host
	}
	return answerOf(t, hc, req)
}

// answerOf is previewAnswer for a request made by hand.
func answerOf(t *testing.T, hc *http.Client, req *http.Request) string {
	t.Helper()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s (Host %s): %v", req.URL, req.Host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	resp.Header.Del("Date")
	var hs []string
	for k, v := range resp.Header {
		hs = append(hs, k+": "+strings.Join(v, ","))
	}
	slices.Sort(hs)
	return fmt.Sprintf("%d\n%s\n\n%s", resp.StatusCode, strings.Join(hs, "\n"), b)
}

// Without a valid token a preview URL answers the same whatever it names:
// an unknown name, a sandbox's name or id prefix, a known sandbox's
// private port, another token's sandbox, an unshared port, a wrong token,
// through /preview/ and through PORT-ID.DOMAIN host names alike. With the
// port's token the preview works.
func TestPreviewUniformDenial(t *testing.T) {
	te := newTokenEnv(t)
	ctx := context.Background()
	_, alice := te.newToken(t, api.TokenRequest{Name: "alice"})
	_, bob := te.newToken(t, api.TokenRequest{Name: "bob"})
	sb, err := alice.Create(ctx, api.CreateRequest{Name: "alicebox"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := bob.Create(ctx, api.CreateRequest{Name: "bobbox"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: `exec python3 -c '
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = b"hello from the preview"
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
'`}); err != nil {
		t.Fatal(err)
	}
	p, err := alice.SharePort(ctx, sb.ID, 8000, false)
	if err != nil {
		t.Fatal(err)
	}
	q, err := bob.SharePort(ctx, other.ID, 8000, false)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + strings.TrimPrefix(te.addr, "tcp://")
	hs := httptest.NewServer(te.srv.PreviewHost(te.srv.Authenticate(te.srv, testAdminToken), "preview.test"))
	defer hs.Close()
	hc := &http.Client{Timeout: time.Minute}

	// With the token the preview works (the server may still be starting).
	var ok string
	for range 100 {
		if ok = previewAnswer(t, hc, base+p.Path+"?den_token="+p.Token, ""); strings.HasSuffix(ok, "hello from the preview") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.HasPrefix(ok, "200\n") || !strings.HasSuffix(ok, "hello from the preview") {
		t.Fatalf("preview with its token: %s", ok)
	}
	if got := previewAnswer(t, hc, hs.URL+"/?den_token="+p.Token, fmt.Sprintf("8000-%s.preview.test", sb.ID)); !strings.HasSuffix(got, "hello from the preview") {
		t.Fatalf("preview host with its token: %s", got)
	}

	paths := map[string]string{
		"unknown name":          "/preview/nosuchbox/8000/",
		"unknown id":            "/preview/0123456789abcdef0123456789abcdef/8000/",
		"a sandbox's name":      "/preview/alicebox/8000/",
		"an id prefix":          "/preview/" + sb.ID[:4] + "/8000/",
		"a known private port":  p.Path,
		"another token's box":   q.Path,
		"an unshared port":      "/preview/" + sb.ID + "/9000/",
		"a wrong token":         p.Path + "?den_token=" + q.Token,
		"a name with its token": "/preview/alicebox/8000/?den_token=" + p.Token,
		"a bad port":            "/preview/" + sb.ID + "/http/",
		"the admin's API token": p.Path + "?den_token=" + testAdminToken,
	}
	hosts := map[string]string{
		"host: unknown":            "8000-nosuchbox.preview.test",
		"host: a name":             "8000-alicebox.preview.test",
		"host: a 12-digit prefix":  "8000-" + sb.ID[:12] + ".preview.test",
		"host: no token":           "8000-" + sb.ID + ".preview.test",
		"host: unshared port":      "9000-" + sb.ID + ".preview.test",
		"host: garbage":            "x.preview.test",
		"host: trailing dot":       "8000-" + sb.ID + ".preview.test.",
		"host: bad port":           "8000-" + sb.ID + ".preview.test:http",
		"host: port written +8000": "+8000-" + sb.ID + ".preview.test",
	}
	var want, wantFrom string
	check := func(what, got string) {
		if want == "" {
			want, wantFrom = got, what
			if !strings.HasPrefix(got, "404\n") || strings.Contains(got, sb.ID[:12]) {
				t.Errorf("%s: %s", what, got)
			}
			return
		}
		if got != want {
			t.Errorf("%s answers\n%s\nbut %s answers\n%s", what, got, wantFrom, want)
		}
	}
	for what, path := range paths {
		check(what, previewAnswer(t, hc, base+path, ""))
	}
	for what, host := range hosts {
		check(what, previewAnswer(t, hc, hs.URL+"/", host))
	}
	t.Logf("every refusal: %q", want)
}
