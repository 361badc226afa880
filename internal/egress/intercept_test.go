package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

const testSecret = "Bearer sk-den-test-3f9a1c"

// newTestCA makes a sandbox CA and a pool trusting only it.
func newTestCA(t testing.TB) (*tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(42),
		Subject:               pkix.Name{CommonName: "den sandbox CA (test)"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// secretUpstream is an HTTPS server (httptest) standing in for the host
// with the secret; it echoes the Authorization header it received.
type secretUpstream struct {
	srv      *httptest.Server
	addr     netip.AddrPort
	pool     *x509.CertPool
	conns    atomic.Int64 // TCP connections
	requests atomic.Int64
	first    chan string   // /stream-up: the first body bytes, as they arrive
	release  chan struct{} // /stream-down: send the second part
}

func startSecretUpstream(t testing.TB, ip string) *secretUpstream {
	t.Helper()
	u := &secretUpstream{first: make(chan string, 1), release: make(chan struct{}, 1)}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		auth := r.Header.Get("Authorization")
		w.Header().Set("X-Echo-Authorization", "you sent "+auth)
		switch r.URL.Path {
		case "/stream-up":
			buf := make([]byte, 5)
			if _, err := io.ReadFull(r.Body, buf); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			u.first <- string(buf)
			rest, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "auth=%s body=%s%s te=%v", auth, buf, rest, r.TransferEncoding)
		case "/stream-down":
			io.WriteString(w, "part1;")
			w.(http.Flusher).Flush()
			select {
			case <-u.release:
			case <-time.After(5 * time.Second):
			}
			io.WriteString(w, "part2")
		default:
			body, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "auth=%s n=%d host=%s uri=%s body=%d", auth, len(r.Header.Values("Authorization")), r.Host, r.RequestURI, len(body))
		}
	}))
	u.srv.Listener.Close()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	u.srv.Listener = ln
	u.srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateNew {
			u.conns.Add(1)
		}
	}
	u.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	u.srv.StartTLS()
	t.Cleanup(u.srv.Close)
	u.addr = addrPortOf(ln.Addr())
	u.pool = x509.NewCertPool()
	u.pool.AddCert(u.srv.Certificate())
	return u
}

// secretHarness: a harness whose policy gives example.com (served by u)
// the secret Authorization header, with the sandbox CA and attribution.
func secretHarness(t *testing.T, u *secretUpstream, ca *tls.Certificate, mod func(*Config)) *harness {
	t.Helper()
	pol := Policy{Mode: ModeAllow, Allow: []string{"example.com", "plain.example.com"},
		Secrets: []SecretHeader{{Host: "Example.COM.", Header: "authorization", Value: testSecret}}}
	h := newHarness(t, pol, func(c *Config) {
		c.CA = func(sb string) (*tls.Certificate, error) {
			if sb != sandboxID {
				return nil, errors.New("no such sandbox")
			}
			return ca, nil
		}
		c.UpstreamTLS = &tls.Config{RootCAs: u.pool}
		c.Attribute = func(sb, _ string, src netip.AddrPort) (string, string) {
			return fmt.Sprintf("pid 4242 (curl) %s port %d", sb, src.Port()), ""
		}
		if mod != nil {
			mod(c)
		}
	})
	h.res.set("example.com", []netip.Addr{u.addr.Addr()})
	return h
}

// namedClient is an HTTP client in the sandbox: it resolves names with the
// harness's resolver and its connections are redirected to the
// transparent proxy. dials counts its connections.
func (h *harness) namedClient(tlsConf *tls.Config, dials *atomic.Int64) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			as, err := h.res.Resolve(ctx, host)
			if err != nil {
				return nil, err
			}
			ap, _ := netip.ParseAddrPort(net.JoinHostPort(as[0].String(), port))
			if dials != nil {
				dials.Add(1)
			}
			return h.dialTransparent(ap)
		},
		TLSClientConfig: tlsConf,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// bodyOf returns a function reading a response's body (or failing t).
func bodyOf(t *testing.T) func(*http.Response, error) string {
	return func(resp *http.Response, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
}

// captureLog sends the standard logger's output to a buffer for the test.
func captureLog(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	old, flags := log.Writer(), log.Flags()
	log.SetOutput(&buf)
	t.Cleanup(func() { log.SetOutput(old); log.SetFlags(flags) })
	return &buf
}

// noSecretAnywhere fails if the secret is in any event or the log.
func noSecretAnywhere(t *testing.T, h *harness, logBuf *bytes.Buffer) {
	t.Helper()
	for _, e := range h.log.all() {
		if s := fmt.Sprintf("%+v", e); strings.Contains(s, "sk-den-test") {
			t.Errorf("an event discloses the secret: %s", s)
		}
	}
	if strings.Contains(logBuf.String(), "sk-den-test") {
		t.Errorf("the log discloses the secret: %s", logBuf)
	}
}

func TestSecretInjectTransparent(t *testing.T) {
	logBuf := captureLog(t)
	u := startSecretUpstream(t, "127.0.0.2")
	ca, caPool := newTestCA(t)
	h := secretHarness(t, u, ca, nil)
	var dials atomic.Int64
	cl := h.namedClient(&tls.Config{RootCAs: caPool}, &dials)
	base := fmt.Sprintf("https://example.com:%d", u.addr.Port())

	// The sandbox's own Authorization is replaced by the secret.
	req, _ := http.NewRequest("GET", base+"/echo?x=1", nil)
	req.Header.Set("Authorization", "Bearer sandbox-own")
	resp, err := cl.Do(req)
	body := bodyOf(t)(resp, err)
	want := fmt.Sprintf("auth=%s n=1 host=example.com:%d uri=/echo?x=1 body=0", testSecret, u.addr.Port())
	if body != want {
		t.Fatalf("intercepted GET: %q; want %q", body, want)
	}
	// The echo in a response header is masked.
	if got := resp.Header.Get("X-Echo-Authorization"); got != "you sent [den: secret]" {
		t.Errorf("echoed header reached the sandbox as %q", got)
	}
	// The certificate: exactly the name, from the sandbox's CA, P-256, 24 h.
	leaf := resp.TLS.PeerCertificates[0]
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if fmt.Sprint(leaf.DNSNames) != "[example.com]" || leaf.Issuer.CommonName != "den sandbox CA (test)" ||
		!ok || pub.Curve != elliptic.P256() || leaf.NotAfter.Sub(leaf.NotBefore) != 24*time.Hour || leaf.IsCA {
		t.Errorf("leaf certificate: names %v issuer %q key %T validity %v", leaf.DNSNames, leaf.Issuer.CommonName, leaf.PublicKey,
			leaf.NotAfter.Sub(leaf.NotBefore))
	}

	// Keep-alive: a second request on the same connections.
	body = bodyOf(t)(cl.Get(base + "/again"))
	if !strings.HasPrefix(body, "auth="+testSecret+" n=1") {
		t.Fatalf("second request: %q", body)
	}
	if d, c := dials.Load(), u.conns.Load(); d != 1 || c != 1 {
		t.Errorf("two requests took %d sandbox and %d upstream connections; want 1 and 1", d, c)
	}

	// A chunked POST streams: the upstream sees the first bytes before the
	// sandbox sends the rest.
	pr, pw := io.Pipe()
	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest("POST", base+"/stream-up", pr)
		resp, err := cl.Do(req)
		if err != nil {
			done <- result{"", err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{string(b), err}
	}()
	io.WriteString(pw, "hello")
	select {
	case got := <-u.first:
		if got != "hello" {
			t.Fatalf("upstream got %q first", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first part of a chunked body did not reach the upstream before the rest was sent")
	}
	io.WriteString(pw, " world")
	pw.Close()
	r := <-done
	if r.err != nil || r.body != "auth="+testSecret+" body=hello world te=[chunked]" {
		t.Fatalf("chunked POST: %q, %v", r.body, r.err)
	}

	// The response streams too.
	resp, err = cl.Get(base + "/stream-down")
	if err != nil {
		t.Fatal(err)
	}
	part := make([]byte, len("part1;"))
	if _, err := io.ReadFull(resp.Body, part); err != nil || string(part) != "part1;" {
		t.Fatalf("first part of a streamed response: %q, %v", part, err)
	}
	u.release <- struct{}{}
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(rest) != "part2" {
		t.Fatalf("rest of a streamed response: %q", rest)
	}
	if d := dials.Load(); d != 1 {
		t.Errorf("%d sandbox connections; want 1 (keep-alive)", d)
	}

	cl.CloseIdleConnections()
	e := h.log.wait(t, "intercepted connection", func(e Event) bool {
		return e.Kind == KindConnect && e.Name == "example.com" && e.Verdict == VerdictAllow
	})
	if !strings.Contains(e.Reason, "secret header Authorization injected into 4 requests") || e.Addr != "127.0.0.2" ||
		e.Port != int(u.addr.Port()) || e.BytesOut < 300 || e.BytesIn < 300 || e.Sandbox != sandboxID {
		t.Errorf("event %+v", e)
	}
	if want := fmt.Sprintf("pid 4242 (curl) %s port %d", sandboxID, e.SrcPort); e.Process != want {
		t.Errorf("Process %q; want %q", e.Process, want)
	}
	if n := h.srv.EgressBytes(sandboxID); n != e.BytesOut {
		t.Errorf("EgressBytes %d; event BytesOut %d", n, e.BytesOut)
	}

	// ALPN: only http/1.1 is offered.
	if c, err := h.dialTransparent(u.addr); err == nil {
		tc := tls.Client(c, &tls.Config{RootCAs: caPool, ServerName: "example.com", NextProtos: []string{"h2", "http/1.1"}})
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil || tc.ConnectionState().NegotiatedProtocol != "http/1.1" {
			t.Errorf("ALPN %q, %v; want http/1.1", tc.ConnectionState().NegotiatedProtocol, err)
		}
		tc.Close()
	}

	// The certificate is cached per sandbox and name.
	c1, _ := h.srv.leafCert(sandboxID, "example.com")
	c2, _ := h.srv.leafCert(sandboxID, "example.com")
	if c1 != c2 || !bytes.Equal(c1.Certificate[0], leaf.Raw) {
		t.Error("the leaf certificate is not cached")
	}
	noSecretAnywhere(t, h, logBuf)
}

func TestSecretInjectConnect(t *testing.T) {
	logBuf := captureLog(t)
	u := startSecretUpstream(t, "127.0.0.2")
	ca, caPool := newTestCA(t)
	h := secretHarness(t, u, ca, nil)
	cl := h.proxyClient(&tls.Config{RootCAs: caPool})
	url := fmt.Sprintf("https://example.com:%d/via-connect", u.addr.Port())
	for range 2 {
		req, _ := http.NewRequest("POST", url, strings.NewReader("0123456789"))
		req.Header.Set("Authorization", "Basic c2FuZGJveDpvd24=")
		body := bodyOf(t)(cl.Do(req))
		want := fmt.Sprintf("auth=%s n=1 host=example.com:%d uri=/via-connect body=10", testSecret, u.addr.Port())
		if body != want {
			t.Fatalf("CONNECT, intercepted: %q; want %q", body, want)
		}
	}
	cl.CloseIdleConnections()
	e := h.log.wait(t, "intercepted CONNECT", func(e Event) bool {
		return e.Name == "example.com" && e.Verdict == VerdictAllow && strings.Contains(e.Reason, "secret header Authorization injected")
	})
	if !strings.Contains(e.Reason, "into 2 requests") || !strings.HasPrefix(e.Process, "pid 4242 (curl)") {
		t.Errorf("event %+v", e)
	}
	noSecretAnywhere(t, h, logBuf)
}

// Plain HTTP to the secret's host: relayed unchanged, without the secret.
func TestSecretPlainHTTPNotInjected(t *testing.T) {
	logBuf := captureLog(t)
	u := startSecretUpstream(t, "127.0.0.2")
	ca, _ := newTestCA(t)
	h := secretHarness(t, u, ca, nil)
	plain := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "auth=%q", r.Header.Get("Authorization"))
	}))
	plain.Listener.Close()
	ln, err := net.Listen("tcp", "127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	plain.Listener = ln
	plain.Start()
	defer plain.Close()
	pa := addrPortOf(ln.Addr())
	h.res.set("example.com", []netip.Addr{pa.Addr()})

	// Transparent.
	c, _ := h.dialTransparent(pa)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: example.com\r\nAuthorization: Bearer sandbox-own\r\nConnection: close\r\n\r\n")
	got, _ := readAllTimeout(c, 5*time.Second)
	c.Close()
	if !strings.Contains(string(got), `auth="Bearer sandbox-own"`) {
		t.Fatalf("plain HTTP through the transparent proxy: %q", got)
	}
	h.log.wait(t, "plain HTTP not injected", func(e Event) bool {
		return e.Name == "example.com" && e.Verdict == VerdictAllow &&
			strings.Contains(e.Reason, "secret header Authorization not injected (plain HTTP")
	})
	// Explicit proxy.
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://example.com:%d/", pa.Port()), nil)
	body := bodyOf(t)(h.proxyClient(nil).Do(req))
	if body != `auth=""` {
		t.Fatalf("plain HTTP through the explicit proxy: %q", body)
	}
	h.log.wait(t, "forward not injected", func(e Event) bool {
		return e.Name == "example.com" && e.Port == int(pa.Port()) && e.BytesIn > 0 && strings.Contains(e.Reason, "not injected (plain HTTP")
	})
	noSecretAnywhere(t, h, logBuf)
}

// A name without secrets is not intercepted: the sandbox sees the
// upstream's own certificate.
func TestSecretOtherNameNotIntercepted(t *testing.T) {
	u := startSecretUpstream(t, "127.0.0.2")
	ca, _ := newTestCA(t)
	h := secretHarness(t, u, ca, nil)
	a := startHTTP(t, "127.0.0.4", "A", true)
	h.res.set("plain.example.com", []netip.Addr{a.addr.Addr()})
	cert, pool := testCert(t)
	cl := h.namedClient(&tls.Config{RootCAs: pool}, nil)
	resp, err := cl.Get(fmt.Sprintf("https://plain.example.com:%d/", a.addr.Port()))
	body := bodyOf(t)(resp, err)
	cl.CloseIdleConnections()
	if !strings.HasPrefix(body, "A host=plain.example.com") {
		t.Fatalf("not intercepted: %q", body)
	}
	if !bytes.Equal(resp.TLS.PeerCertificates[0].Raw, cert.Certificate[0]) {
		t.Fatal("the sandbox did not see the upstream's own certificate")
	}
	e := h.log.wait(t, "not intercepted", func(e Event) bool { return e.Name == "plain.example.com" && e.Verdict == VerdictAllow })
	if strings.Contains(e.Reason, "secret") {
		t.Errorf("event %+v", e)
	}
}

// Inside an intercepted connection, requests for another host, upgrades
// and CONNECT are refused before reaching the upstream; a bad upstream
// certificate gets a 502; no CA means no interception.
func TestSecretRefusals(t *testing.T) {
	logBuf := captureLog(t)
	u := startSecretUpstream(t, "127.0.0.2")
	ca, caPool := newTestCA(t)
	h := secretHarness(t, u, ca, nil)

	send := func(h *harness, req string) (*http.Response, string, error) {
		c, err := h.dialTransparent(u.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		tc := tls.Client(c, &tls.Config{RootCAs: caPool, ServerName: "example.com"})
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			return nil, "", err
		}
		io.WriteString(tc, req)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			return nil, "", err
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b), nil
	}
	for _, c := range []struct {
		req  string
		code int
		want string
	}{
		{"GET / HTTP/1.1\r\nHost: evil.example.com\r\n\r\n", 421, "on a connection for example.com"},
		{"GET https://evil.example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", 421, "on a connection for example.com"},
		{"GET / HTTP/1.1\r\nHost: example.com@evil.com\r\n\r\n", 421, ""},
		{"GET / HTTP/1.1\r\nHost: example.com\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", 501, "upgrades"},
		{"CONNECT evil.com:443 HTTP/1.1\r\nHost: evil.com:443\r\n\r\n", 405, "CONNECT"},
		{"TRACE / HTTP/1.1\r\nHost: example.com\r\n\r\n", 405, "TRACE"},
		{"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", 400, "scheme"},
		{"garbage\r\n\r\n", 400, "malformed"},
	} {
		resp, body, err := send(h, c.req)
		if err != nil || resp.StatusCode != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%.50q: %v %q %v; want %d …%s…", c.req, resp, body, err, c.code, c.want)
		}
	}
	if n := u.requests.Load(); n != 0 {
		t.Fatalf("%d refused requests reached the upstream", n)
	}
	// An origin-form request with the right host goes through.
	if resp, body, err := send(h, "GET /ok HTTP/1.1\r\nHost: EXAMPLE.com.\r\nConnection: close\r\n\r\n"); err != nil ||
		resp.StatusCode != 200 || !strings.HasPrefix(body, "auth="+testSecret) {
		t.Fatalf("good request: %v %q %v", resp, body, err)
	}

	// An upstream whose certificate does not verify: 502, no secret sent.
	h2 := secretHarness(t, u, ca, func(c *Config) { c.UpstreamTLS = nil })
	before := u.requests.Load()
	resp, body, err := send(h2, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")
	if err != nil || resp.StatusCode != 502 || !strings.Contains(body, "certificate") {
		t.Fatalf("unverified upstream: %v %q %v", resp, body, err)
	}
	if u.requests.Load() != before {
		t.Fatal("a request reached an unverified upstream")
	}
	h2.log.wait(t, "unverified upstream", func(e Event) bool {
		return e.Name == "example.com" && strings.Contains(e.Reason, "upstream: TLS with example.com")
	})

	// No CA: the connection is denied, not relayed without interception.
	h3 := secretHarness(t, u, ca, func(c *Config) { c.CA = nil })
	if _, _, err := send(h3, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"); err == nil {
		t.Fatal("TLS to a secret host without a CA went through")
	}
	h3.log.wait(t, "no CA", func(e Event) bool {
		return e.Verdict == VerdictDeny && strings.Contains(e.Reason, "cannot intercept TLS for secret header Authorization")
	})
	// A sandbox that does not trust its CA fails the handshake; the event says so.
	c, _ := h.dialTransparent(u.addr)
	tc := tls.Client(c, &tls.Config{ServerName: "example.com", RootCAs: u.pool})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err == nil {
		t.Fatal("the sandbox's CA was not needed")
	}
	c.Close()
	h.log.wait(t, "handshake failed", func(e Event) bool { return strings.Contains(e.Reason, "handshake with the sandbox failed") })
	for _, hh := range []*harness{h, h2, h3} {
		noSecretAnywhere(t, hh, logBuf)
	}
}

// The byte limit applies to intercepted requests, live.
func TestSecretByteLimit(t *testing.T) {
	u := startSecretUpstream(t, "127.0.0.2")
	ca, caPool := newTestCA(t)
	h := secretHarness(t, u, ca, nil)
	pol := *h.pol.Load()
	pol.MaxEgressBytes = 2000
	h.setPolicy(pol)
	cl := h.namedClient(&tls.Config{RootCAs: caPool}, nil)
	base := fmt.Sprintf("https://example.com:%d", u.addr.Port())
	if body := bodyOf(t)(cl.Get(base + "/small")); !strings.HasPrefix(body, "auth="+testSecret) {
		t.Fatalf("small request: %q", body)
	}
	resp, err := cl.Post(base+"/big", "text/plain", strings.NewReader(strings.Repeat("x", 5000)))
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), "egress byte limit reached (2000 bytes)") {
			t.Fatalf("request past the limit: %d %q", resp.StatusCode, b)
		}
	}
	h.log.wait(t, "limit", func(e Event) bool {
		return e.Name == "example.com" && strings.Contains(e.Reason, "egress byte limit reached (2000 bytes)")
	})
	if n := h.srv.EgressBytes(sandboxID); n != 2000 {
		t.Fatalf("EgressBytes = %d; want 2000", n)
	}
}

func TestAttribute(t *testing.T) {
	var calls atomic.Int64
	var networks sync.Map
	h := newHarness(t, Policy{Mode: ModeAllow, Allow: []string{"api.example.com"}}, func(c *Config) {
		c.Attribute = func(sb, network string, src netip.AddrPort) (string, string) {
			calls.Add(1)
			if src.Addr() != sandboxSrc || sb != sandboxID {
				return "wrong arguments", ""
			}
			networks.Store(src.Port(), network)
			return fmt.Sprintf("pid 7 (python3) port %d", src.Port()), ""
		}
	})
	a := startHTTP(t, "127.0.0.2", "A", false)
	h.res.set("api.example.com", []netip.Addr{a.addr.Addr()})
	c, _ := h.dialTransparent(a.addr)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n")
	readAllTimeout(c, 5*time.Second)
	c.Close()
	attributed := func(e Event, network string) {
		t.Helper()
		if want := fmt.Sprintf("pid 7 (python3) port %d", e.SrcPort); e.Process != want || e.ProcessUnknown != "" {
			t.Errorf("%s Process %q (unknown %q); want %q", e.Kind, e.Process, e.ProcessUnknown, want)
		}
		if n, _ := networks.Load(uint16(e.SrcPort)); n != network {
			t.Errorf("%s attributed as %v; want %s", e.Kind, n, network)
		}
	}
	attributed(h.log.wait(t, "connect", func(e Event) bool { return e.Kind == KindConnect && e.Verdict == VerdictAllow }), "tcp")
	h.query(t, "udp", "api.example.com", 1)
	attributed(h.log.wait(t, "dns", func(e Event) bool { return e.Kind == KindDNS }), "udp")
	h.query(t, "tcp", "denied.example.com", 1)
	attributed(h.log.wait(t, "dns over tcp", func(e Event) bool { return e.Name == "denied.example.com" }), "tcp")
	h.rawRequest(t, "CONNECT evil.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n")
	e := h.log.wait(t, "explicit deny", func(e Event) bool { return e.Name == "evil.example.com" })
	if !strings.HasPrefix(e.Process, "pid 7 (python3)") {
		t.Errorf("explicit proxy Process %q", e.Process)
	}
	// Unknown sources are not attributed, and their events say why.
	before := calls.Load()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}}
	if c, err := d.Dial("tcp", h.eproxy.Addr().String()); err == nil {
		io.WriteString(c, "CONNECT x.example.com:443 HTTP/1.1\r\n\r\n")
		readAllTimeout(c, 5*time.Second)
		c.Close()
	}
	if calls.Load() != before {
		t.Error("Attribute called for an unknown source")
	}
	e = h.log.wait(t, "unknown source", func(e Event) bool { return strings.HasPrefix(e.Reason, "unknown source") })
	if e.Process != "" || e.ProcessUnknown != noSession {
		t.Errorf("unknown source: Process %q, ProcessUnknown %q", e.Process, e.ProcessUnknown)
	}

	// An Attribute that never answers holds nothing for long: the event
	// goes without it, saying so.
	block := make(chan struct{})
	defer close(block)
	h2 := newHarness(t, Policy{Mode: ModeAllow}, func(c *Config) {
		c.Attribute = func(string, string, netip.AddrPort) (string, string) { <-block; return "late", "" }
	})
	resp, _ := h2.rawRequest(t, "CONNECT evil.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != 403 {
		t.Fatalf("deny: %d", resp.StatusCode)
	}
	e = h2.log.wait(t, "deny without attribution", func(e Event) bool { return e.Name == "evil.example.com" })
	if e.Process != "" || !strings.Contains(e.ProcessUnknown, "took longer than") {
		t.Errorf("blocked attribution: Process %q, ProcessUnknown %q", e.Process, e.ProcessUnknown)
	}
}

// A refusal or an answer waits for the attribution: a client that gets
// its answer at once and closes its socket (as every resolver does) must
// not leave the event without its process. The fake Attribute looks a
// while, as a loaded host does, and finds the process only while the
// client still waits.
func TestAttributeBeforeAnswer(t *testing.T) {
	var answered atomic.Bool
	h := newHarness(t, Policy{Mode: ModeAllow, Allow: []string{"api.example.com"}}, func(c *Config) {
		c.Attribute = func(string, string, netip.AddrPort) (string, string) {
			time.Sleep(150 * time.Millisecond)
			if answered.Load() {
				return "", "the socket was closed before den looked"
			}
			return "pid 7 (getent)", ""
		}
	})
	for _, q := range []struct {
		network, name string
		qtype         uint16
	}{{"udp", "denied.example.com", dns.TypeA}, {"udp", "api.example.com", dns.TypeTXT}, {"tcp", "denied2.example.com", dns.TypeAAAA}} {
		answered.Store(false)
		r := h.query(t, q.network, q.name, q.qtype)
		answered.Store(true)
		if r.Rcode != dns.RcodeRefused {
			t.Fatalf("%s %s: rcode %d; want REFUSED", q.network, q.name, r.Rcode)
		}
		e := h.log.wait(t, q.name, func(e Event) bool {
			return e.Kind == KindDNS && e.Name == q.name && e.QType == dns.TypeToString[q.qtype]
		})
		if e.Process != "pid 7 (getent)" {
			t.Errorf("%s query for %s: Process %q, ProcessUnknown %q", q.network, q.name, e.Process, e.ProcessUnknown)
		}
	}
	// A denied connection, closed at once, likewise.
	answered.Store(false)
	resp, _ := h.rawRequest(t, "CONNECT evil.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n")
	answered.Store(true)
	if resp.StatusCode != 403 {
		t.Fatalf("deny: %d", resp.StatusCode)
	}
	if e := h.log.wait(t, "explicit deny", func(e Event) bool { return e.Name == "evil.example.com" }); e.Process != "pid 7 (getent)" {
		t.Errorf("denied CONNECT: Process %q, ProcessUnknown %q", e.Process, e.ProcessUnknown)
	}
}

// IdleTimeout and Close end intercepted connections too.
func TestSecretIdleAndClose(t *testing.T) {
	u := startSecretUpstream(t, "127.0.0.2")
	ca, caPool := newTestCA(t)
	h := secretHarness(t, u, ca, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	dial := func() (*tls.Conn, *bufio.Reader) {
		c, err := h.dialTransparent(u.addr)
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(c, &tls.Config{RootCAs: caPool, ServerName: "example.com"})
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		return tc, bufio.NewReader(tc)
	}
	get := func(tc *tls.Conn, br *bufio.Reader) error {
		io.WriteString(tc, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		_, err = io.ReadAll(resp.Body)
		return err
	}
	tc, br := dial()
	defer tc.Close()
	// Requests keep it open past the idle timeout…
	for range 4 {
		if err := get(tc, br); err != nil {
			t.Fatalf("active intercepted connection: %v", err)
		}
		time.Sleep(150 * time.Millisecond)
	}
	// …silence closes it.
	start := time.Now()
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("idle intercepted connection: read a byte")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("idle intercepted connection closed after %v", d)
	}
	h.log.wait(t, "idle end", func(e Event) bool { return strings.Contains(e.Reason, "injected into 4 requests") })

	// Close ends one in progress.
	tc2, br2 := dial()
	defer tc2.Close()
	if err := get(tc2, br2); err != nil {
		t.Fatal(err)
	}
	h.srv.Close()
	if _, err := br2.ReadByte(); err == nil {
		t.Fatal("after Close: read a byte")
	}
}
