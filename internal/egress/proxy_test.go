package egress

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
)

func (h *harness) proxyClient(tlsConf *tls.Config) *http.Client {
	u, _ := url.Parse("http://" + h.eproxy.Addr().String())
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy:           http.ProxyURL(u),
		TLSClientConfig: tlsConf,
	}}
}

func TestProxyConnect(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeAllow, Allow: []string{"api.example.com"}}, nil)
	a := startHTTP(t, "127.0.0.2", "A", true)
	h.res.set("api.example.com", []netip.Addr{a.addr.Addr()})
	h.res.set("evil.example.com", []netip.Addr{a.addr.Addr()})
	_, pool := testCert(t)
	cl := h.proxyClient(&tls.Config{RootCAs: pool})

	resp, err := cl.Get(fmt.Sprintf("https://api.example.com:%d/x", a.addr.Port()))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(string(body), "A host=api.example.com") {
		t.Fatalf("CONNECT: %q", body)
	}
	cl.CloseIdleConnections()
	e := h.log.wait(t, "CONNECT allowed", func(e Event) bool {
		return e.Name == "api.example.com" && e.Verdict == VerdictAllow
	})
	if e.Addr != "127.0.0.2" || e.Port != int(a.addr.Port()) || e.BytesIn < 100 || e.BytesOut < 100 || e.Sandbox != sandboxID {
		t.Errorf("event %+v", e)
	}

	// Denied names get a 403 naming the reason.
	resp2, body2 := h.rawRequest(t, "CONNECT evil.example.com:443 HTTP/1.1\r\nHost: evil.example.com:443\r\n\r\n")
	if resp2.StatusCode != 403 || !strings.Contains(body2, "not in allow list") {
		t.Fatalf("denied CONNECT: %d %q", resp2.StatusCode, body2)
	}
	if _, err := cl.Get(fmt.Sprintf("https://evil.example.com:%d/", a.addr.Port())); err == nil {
		t.Fatal("Go's client got through to a denied name")
	}
	for _, target := range []string{
		"user@api.example.com:443", "api.example.com%2f@evil.com:443", "api.example.com%00:443",
		"api.example.com", "api.example.com:0", "api.example.com:99999", ":443", "[::1:443",
	} {
		r, b := h.rawRequest(t, "CONNECT "+target+" HTTP/1.1\r\nHost: x\r\n\r\n")
		if r.StatusCode != 403 && r.StatusCode != 400 {
			t.Errorf("CONNECT %s: %d %q", target, r.StatusCode, b)
		}
	}
}

// IP literals in every form are judged as the address they are.
func TestProxyIPLiterals(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeOpen}, func(c *Config) { c.Public = nil })
	for _, host := range []string{
		"127.0.0.1", "2130706433", "0x7f000001", "0x7f.1", "017700000001", "0177.0.0.1", "127.1", "127.0.1",
		"[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[::1]", "[::]", "0", "0x0", "10.1", "0xa9fea9fe", "2852039166",
		"169.254.43518", "0251.0376.0251.0376", "[fd00:ec2::254]", "[64:ff9b::a9fe:a9fe]", "[2002:a9fe:a9fe::]",
		"127.0.0.1.", "[fe80::1%25lo]", "100.100.100.200", "192.168.1.1", "0xc0a80101",
	} {
		r, body := h.rawRequest(t, "CONNECT "+host+":80 HTTP/1.1\r\nHost: "+host+":80\r\n\r\n")
		if r.StatusCode != 403 || !(strings.Contains(body, "blocked") || strings.Contains(body, "host") || strings.Contains(body, "'%'")) {
			t.Errorf("CONNECT %s: %d %q", host, r.StatusCode, body)
		}
		r, body = h.rawRequest(t, "GET http://"+host+"/ HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		if r.StatusCode != 403 && r.StatusCode != 400 {
			t.Errorf("GET http://%s/: %d %q", host, r.StatusCode, body)
		}
	}
	e := h.log.wait(t, "literal denied", func(e Event) bool {
		return e.Name == "0x7f.1" && e.Verdict == VerdictDeny
	})
	if e.Addr != "127.0.0.1" || !strings.Contains(e.Reason, "loopback") {
		t.Errorf("event %+v", e)
	}
}

func TestProxyForward(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeAllow, Allow: []string{"web.example.com"}}, nil)
	a := startHTTP(t, "127.0.0.2", "A", false)
	h.res.set("web.example.com", []netip.Addr{a.addr.Addr()})
	cl := h.proxyClient(nil)
	u := fmt.Sprintf("http://web.example.com:%d/path?q=1", a.addr.Port())
	for range 2 { // the second reuses the kept-alive proxy connection
		req, _ := http.NewRequest("POST", u, strings.NewReader("0123456789"))
		req.Header.Set("Connection", "X-Hop")
		req.Header.Set("X-Hop", "secret")
		req.Header.Set("Proxy-Connection", "keep-alive")
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := fmt.Sprintf(`A host=web.example.com:%d uri=/path?q=1 proxy-connection="" x-hop="" body=10`, a.addr.Port())
		if resp.StatusCode != 200 || string(body) != want {
			t.Fatalf("forwarded GET: %d %q; want %q", resp.StatusCode, body, want)
		}
	}
	if n := a.accepted.Load(); n != 2 {
		t.Errorf("upstream connections %d; want 2 (one per request)", n)
	}
	e := h.log.wait(t, "forward event", func(e Event) bool {
		return e.Name == "web.example.com" && e.Verdict == VerdictAllow && e.BytesIn > 0
	})
	if e.BytesOut < 10 || e.Addr != "127.0.0.2" {
		t.Errorf("event %+v", e)
	}
	// Denied, odd and malformed requests.
	for _, c := range []struct {
		req  string
		code int
		want string
	}{
		{"GET http://evil.com/ HTTP/1.1\r\nHost: evil.com\r\n\r\n", 403, "not in allow list"},
		{"GET http://user:pw@web.example.com/ HTTP/1.1\r\nHost: web.example.com\r\n\r\n", 403, "userinfo"},
		{"GET http://web.example.com@evil.com/ HTTP/1.1\r\nHost: evil.com\r\n\r\n", 403, "userinfo"},
		{"GET / HTTP/1.1\r\nHost: web.example.com\r\n\r\n", 400, "not a proxy request"},
		{"GET https://web.example.com/ HTTP/1.1\r\nHost: web.example.com\r\n\r\n", 400, "use CONNECT"},
		{"GET ftp://web.example.com/ HTTP/1.1\r\nHost: web.example.com\r\n\r\n", 400, "not proxied"},
		{"garbage\r\n\r\n", 400, "malformed"},
		{"GET http://web.example.com/ HTTP/1.1\r\n" + strings.Repeat("X-Big: "+strings.Repeat("y", 1000)+"\r\n", 80) + "\r\n", 400, "malformed"},
	} {
		r, body := h.rawRequest(t, c.req)
		if r.StatusCode != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%.60q: %d %q; want %d …%s…", c.req, r.StatusCode, body, c.code, c.want)
		}
	}
}

func TestProxyUnknownSourceAndLimits(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeOpen}, func(c *Config) { c.ConnRate = 1 })
	a := startHTTP(t, "127.0.0.2", "A", false)
	h.res.set("web.example.com", []netip.Addr{a.addr.Addr()})
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}}
	c, err := d.Dial("tcp", h.eproxy.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT web.example.com:%d HTTP/1.1\r\n\r\n", a.addr.Port())
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	c.Close()
	if err != nil || resp.StatusCode != 403 {
		t.Fatalf("unknown source: %v %v", resp, err)
	}
	// Rate 1/s: the first request passes, the next ones on the same
	// connection are limited.
	c, _ = net.Dial("tcp", h.eproxy.Addr().String())
	defer c.Close()
	br := bufio.NewReader(c)
	codes := []int{}
	for range 3 {
		fmt.Fprintf(c, "GET http://web.example.com:%d/ HTTP/1.1\r\nHost: web.example.com\r\n\r\n", a.addr.Port())
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		io.ReadAll(resp.Body)
		codes = append(codes, resp.StatusCode)
	}
	if len(codes) != 2 || codes[0] != 200 || codes[1] != 429 {
		t.Fatalf("codes %v; want [200 429]", codes)
	}
	h.log.wait(t, "rate limit", func(e Event) bool { return e.Reason == "rate limit" })
}

// A refusal's status line names the rule, for clients that show only the
// status line (Go's CONNECT error, curl's "CONNECT tunnel failed"); the
// body keeps the whole reason. Go's own HTTP client reads them here.
func TestRefusalStatusLine(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeAllow, Allow: []string{"api.example.com"}}, nil)
	a := startHTTP(t, "127.0.0.2", "A", false)
	h.res.set("api.example.com", []netip.Addr{a.addr.Addr()})
	h.res.set("evil.example.com", []netip.Addr{a.addr.Addr()})
	cl := h.proxyClient(nil)
	get := func(u string) (*http.Response, string, error) {
		resp, err := cl.Get(u)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b), nil
	}
	// The control: an allowed name goes through.
	resp, body, err := get(fmt.Sprintf("http://api.example.com:%d/x", a.addr.Port()))
	if err != nil || resp.StatusCode != 200 || !strings.Contains(body, "A host=api.example.com") {
		t.Fatalf("allowed request: %v %v %q", resp, err, body)
	}
	for _, c := range []struct{ url, status, why string }{
		{fmt.Sprintf("http://evil.example.com:%d/x", a.addr.Port()), "403 den egress: name not in allow list", "den egress: name not in allow list"},
		{"http://10.0.0.1/", "403 den egress: address not public", "blocked address 10.0.0.1: private"},
		{"http://[::1]:80/", "403 den egress: address is the host", "::1"},
	} {
		resp, body, err := get(c.url)
		if err != nil {
			t.Fatalf("GET %s: %v", c.url, err)
		}
		if resp.Status != c.status || !strings.Contains(body, c.why) || resp.Header.Get("X-Den-Egress") != "deny" {
			t.Errorf("GET %s: %q %q; want %q and a body with %q", c.url, resp.Status, body, c.status, c.why)
		}
	}
	// CONNECT: Go's transport makes the status line its error.
	_, _, err = get(fmt.Sprintf("https://evil.example.com:%d/", a.addr.Port()))
	if err == nil || !strings.Contains(err.Error(), "den egress: name not in allow list") {
		t.Fatalf("denied CONNECT: err %v; want it to name the rule", err)
	}
	e := h.log.wait(t, "CONNECT denied", func(e Event) bool {
		return e.Name == "evil.example.com" && e.Verdict == VerdictDeny && e.Port == int(a.addr.Port())
	})
	if e.Rule != RuleNameNotAllowed {
		t.Errorf("event rule %q; want %q", e.Rule, RuleNameNotAllowed)
	}
}
