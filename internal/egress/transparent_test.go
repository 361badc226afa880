package egress

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func get(t *testing.T, h *harness, tlsConf *tls.Config, url string) (string, error) {
	t.Helper()
	resp, err := h.transparentClient(tlsConf).Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestTransparentTLS(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeAllow, Allow: []string{"api.example.com"}}, nil)
	a := startHTTP(t, "127.0.0.2", "A", true)
	h.res.set("api.example.com", []netip.Addr{a.addr.Addr()})
	_, pool := testCert(t)
	conf := &tls.Config{RootCAs: pool, ServerName: "api.example.com"}

	// The client "connects to" 127.0.0.2 and is redirected.
	url := fmt.Sprintf("https://%s/hello", a.addr)
	body, err := get(t, h, conf, url)
	if err != nil || !strings.HasPrefix(body, "A ") || !strings.Contains(body, "uri=/hello") {
		t.Fatalf("GET through the transparent proxy = %q, %v", body, err)
	}
	e := h.log.wait(t, "TLS connect allowed", func(e Event) bool {
		return e.Kind == KindConnect && e.Name == "api.example.com" && e.Verdict == VerdictAllow
	})
	if e.Sandbox != sandboxID || e.Addr != "127.0.0.2" || e.Port != int(a.addr.Port()) || e.BytesOut < 200 || e.BytesIn < 200 ||
		e.SrcPort == 0 || e.Duration <= 0 {
		t.Errorf("event %+v", e)
	}

	// A name not allowed: the connection is closed before any upstream dial.
	before := a.accepted.Load()
	conf2 := &tls.Config{RootCAs: pool, ServerName: "evil.example.com"}
	if body, err := get(t, h, conf2, url); err == nil {
		t.Fatalf("evil SNI got through: %q", body)
	}
	h.log.wait(t, "SNI denied", func(e Event) bool {
		return e.Kind == KindConnect && e.Name == "evil.example.com" && e.Verdict == VerdictDeny &&
			strings.Contains(e.Reason, "not in allow list")
	})
	if a.accepted.Load() != before {
		t.Error("a denied connection reached the upstream")
	}
}

func TestTransparentHTTPHost(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeAllow, Allow: []string{"*.example.com"}, Deny: []string{"no.example.com"}}, nil)
	a := startHTTP(t, "127.0.0.2", "A", false)
	h.res.set("web.example.com", []netip.Addr{a.addr.Addr()})
	h.res.set("no.example.com", []netip.Addr{a.addr.Addr()})

	send := func(host string) (string, error) {
		c, err := h.dialTransparent(a.addr)
		if err != nil {
			return "", err
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /p HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
		b, err := readAllTimeout(c, 5*time.Second)
		return string(b), err
	}
	body, err := send(fmt.Sprintf("web.example.com:%d", a.addr.Port()))
	if err != nil || !strings.Contains(body, "200 OK") || !strings.Contains(body, "A host=web.example.com") {
		t.Fatalf("HTTP through the transparent proxy = %q, %v", body, err)
	}
	h.log.wait(t, "HTTP allowed", func(e Event) bool {
		return e.Name == "web.example.com" && e.Verdict == VerdictAllow && e.BytesIn > 0
	})
	// Refused Hosts, each answered with den's 403 naming the rule and
	// logged with its reason (the control: a's answer above).
	for _, c := range []struct{ host, why, rule string }{
		{"no.example.com", "denied by rule no.example.com", RuleNameDenied},
		{"example.com", "name not in allow list", RuleNameNotAllowed},
		{"web.example.com@evil.com", "no name (http: invalid character in host)", RuleAddrNotAllowed},
		{"web.example.com%00x", "no name (http: invalid character in host)", RuleAddrNotAllowed},
	} {
		from := len(h.log.all())
		body, _ := send(c.host)
		assertRefusal(t, "Host "+c.host, body, 403, c.rule, c.why)
		h.log.waitFrom(t, from, "Host "+c.host+" denied", func(e Event) bool {
			return e.Verdict == VerdictDeny && strings.Contains(e.Reason, c.why) && e.Rule == c.rule
		})
	}
	// The Host the client gives, not the address it dialed, decides; an
	// absolute URI that disagrees with the Host header is refused.
	c, _ := h.dialTransparent(a.addr)
	fmt.Fprintf(c, "GET http://evil.com/ HTTP/1.1\r\nHost: web.example.com\r\n\r\n")
	b, _ := readAllTimeout(c, 5*time.Second)
	assertRefusal(t, "conflicting hosts", string(b), 403, RuleAddrNotAllowed, "Host header differs from the request target")
	c.Close()
	h.log.wait(t, "conflicting hosts denied", func(e Event) bool {
		return e.Verdict == VerdictDeny && strings.Contains(e.Reason, "Host header differs from the request target")
	})
}

// assertRefusal checks that raw is den's refusal (and nothing of an
// upstream's answer): the status line names rule, the body has why.
func assertRefusal(t *testing.T, what, raw string, code int, rule, why string) {
	t.Helper()
	head, body, _ := strings.Cut(raw, "\r\n\r\n")
	status, _, _ := strings.Cut(head, "\r\n")
	if want := fmt.Sprintf("HTTP/1.1 %d den egress: %s", code, rule); status != want {
		t.Errorf("%s: status line %q, want %q (whole answer %q)", what, status, want, raw)
	}
	if !strings.HasPrefix(body, "den egress: ") || !strings.Contains(body, why) || strings.Contains(body, "host=") {
		t.Errorf("%s: body %q, want den's refusal naming %q", what, body, why)
	}
}

// DNS rebinding: the name resolved to one address for the sandbox and to
// another when the proxy checks it. The proxy dials what it checked.
func TestTransparentRebinding(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeAllow, Allow: []string{"rebind.example.com", "meta.example.com"}}, nil)
	// A and B listen on the same port on two addresses.
	b := startHTTP(t, "127.0.0.3", "B", false)
	a := startHTTPAt(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), b.addr.Port()), "A", false)
	h.res.set("rebind.example.com", []netip.Addr{a.addr.Addr()}, []netip.Addr{b.addr.Addr()})
	first, _ := h.res.Resolve(t.Context(), "rebind.example.com") // the sandbox's lookup: A
	c, _ := h.dialTransparent(netip.AddrPortFrom(first[0], a.addr.Port()))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: rebind.example.com\r\nConnection: close\r\n\r\n")
	got, _ := readAllTimeout(c, 5*time.Second)
	c.Close()
	if !strings.Contains(string(got), "B host=rebind.example.com") {
		t.Fatalf("rebinding: got %q; want the checked address (B)", got)
	}
	if a.accepted.Load() != 0 {
		t.Fatal("the proxy dialed the address the sandbox chose, not the one it checked")
	}
	h.log.wait(t, "dial to the checked address", func(e Event) bool {
		return e.Name == "rebind.example.com" && e.Verdict == VerdictAllow && e.Addr == "127.0.0.3" &&
			strings.Contains(e.Reason, "instead of 127.0.0.2")
	})

	// Rebinding to the metadata service: public for the sandbox's lookup,
	// 169.254.169.254 for the proxy's → denied.
	h.res.set("meta.example.com", []netip.Addr{a.addr.Addr()}, addrs("169.254.169.254"))
	h.res.Resolve(t.Context(), "meta.example.com")
	c, _ = h.dialTransparent(a.addr)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: meta.example.com\r\n\r\n")
	got, _ = readAllTimeout(c, 5*time.Second)
	assertRefusal(t, "metadata rebinding", string(got), 403, RuleNameNotPublic, "cloud metadata")
	c.Close()
	h.log.wait(t, "rebinding to metadata denied", func(e Event) bool {
		return e.Name == "meta.example.com" && e.Verdict == VerdictDeny && strings.Contains(e.Reason, "private address") &&
			strings.Contains(e.Reason, "metadata")
	})
}

// Spoofed SNI: the client names an allowed host but was going elsewhere.
// The proxy dials the allowed host's address, never the original one.
func TestTransparentSpoofedSNI(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeAllow, Allow: []string{"api.example.com"}}, nil)
	a := startHTTP(t, "127.0.0.2", "A", true)
	evil := startEcho(t, "127.0.0.3", "")
	h.res.set("api.example.com", []netip.Addr{a.addr.Addr()})
	_, pool := testCert(t)
	// Original destination: the evil server, on A's port... and on its own.
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(evil.addr.Addr(), a.addr.Port()), evil.addr} {
		c, err := h.dialTransparent(dst)
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "api.example.com"})
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		err = tc.Handshake()
		tc.Close()
		if dst.Port() == a.addr.Port() && err != nil {
			t.Errorf("handshake via spoofed destination %s: %v (want A's server)", dst, err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if n := evil.accepted.Load(); n != 0 {
		t.Fatalf("the spoofed destination got %d connections", n)
	}
	h.log.wait(t, "dialed the checked address", func(e Event) bool {
		return e.Name == "api.example.com" && e.Addr == "127.0.0.2" && e.Verdict == VerdictAllow
	})
}

// Raw TCP (no name) needs a CIDR rule, or open mode and a public address.
func TestTransparentRawTCP(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeAllow, Allow: []string{"*.example.com"}}, nil)
	echo := startEcho(t, "127.0.0.2", "")
	banner := startEcho(t, "127.0.0.4", "SSH-2.0-test\r\n")

	try := func(dst netip.AddrPort, send string, wantBack string) bool {
		t.Helper()
		c, err := h.dialTransparent(dst)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if send != "" {
			io.WriteString(c, send)
		}
		buf := make([]byte, len(wantBack))
		_, err = io.ReadFull(c, buf)
		return err == nil && string(buf) == wantBack
	}
	if try(echo.addr, "hello", "hello") {
		t.Fatal("raw TCP allowed without a CIDR rule")
	}
	h.log.wait(t, "raw denied", func(e Event) bool {
		return e.Verdict == VerdictDeny && e.Name == "" && strings.Contains(e.Reason, "not in allow-cidr")
	})
	if echo.accepted.Load() != 0 {
		t.Fatal("a denied raw connection reached the upstream")
	}
	h.setPolicy(Policy{Mode: ModeAllow, AllowCIDR: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32"), netip.MustParsePrefix("127.0.0.4/32")}})
	if !try(echo.addr, "hello", "hello") {
		t.Fatal("raw TCP denied despite a CIDR rule")
	}
	e := h.log.wait(t, "raw allowed", func(e Event) bool {
		return e.Verdict == VerdictAllow && e.Addr == "127.0.0.2" && strings.Contains(e.Reason, "cidr")
	})
	if e.BytesOut != 5 || e.BytesIn != 5 {
		t.Errorf("byte counts %d/%d; want 5/5", e.BytesOut, e.BytesIn)
	}
	// A protocol where the server speaks first works after ServerFirstWait.
	if !try(banner.addr, "", "SSH-2.0-test\r\n") {
		t.Fatal("server-speaks-first protocol failed")
	}
	// TLS without SNI to a CIDR address: raw rules.
	if !try(echo.addr, "\x16\x03\x01\x00\x04\x02\x00\x00\x00", "\x16\x03\x01\x00\x04\x02\x00\x00\x00") {
		t.Error("malformed TLS to an allowed CIDR address refused")
	}
	// An IP literal in Host is no name: raw rules apply to where it goes.
	other := startEcho(t, "127.0.0.5", "")
	literal := "GET / HTTP/1.1\r\nHost: 127.0.0.2\r\n\r\n"
	cidrs := h.pol.Load().AllowCIDR
	h.setPolicy(Policy{Mode: ModeAllow, AllowCIDR: append(append([]netip.Prefix{}, cidrs...), netip.MustParsePrefix("127.0.0.5/32"))})
	if !try(other.addr, literal, "GET") { // the control
		t.Fatal("IP literal Host to a CIDR address refused")
	}
	h.setPolicy(Policy{Mode: ModeAllow, AllowCIDR: cidrs})
	if try(other.addr, literal, "GET") {
		t.Fatal("IP literal Host got through to a non-CIDR address")
	}
	h.log.wait(t, "IP literal Host denied", func(e Event) bool {
		return e.Verdict == VerdictDeny && e.Addr == "127.0.0.5" && strings.Contains(e.Reason, "address 127.0.0.5 not in allow-cidr")
	})
	// Open mode: a public address is allowed raw, a blocked one is not.
	h.setPolicy(Policy{Mode: ModeOpen})
	if !try(echo.addr, "x", "x") {
		t.Fatal("open mode refused a public address")
	}
	h2 := newHarness(t, Policy{Mode: ModeOpen}, func(c *Config) { c.Public = nil })
	c, _ := h2.dialTransparent(echo.addr)
	io.WriteString(c, "x")
	if b, _ := readAllTimeout(c, 5*time.Second); len(b) != 0 {
		t.Fatal("open mode reached loopback")
	}
	c.Close()
	h2.log.wait(t, "loopback blocked", func(e Event) bool {
		return e.Verdict == VerdictDeny && strings.Contains(e.Reason, "loopback")
	})
}

func TestTransparentDenials(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeOpen}, nil)
	echo := startEcho(t, "127.0.0.2", "")
	// The controls: the host reaches a listener on a host address (the
	// proxies answer every other test), and open mode reaches the echo.
	host := startEcho(t, sandboxSrc.String(), "host\n")
	if c, err := net.DialTimeout("tcp", host.addr.String(), 5*time.Second); err != nil {
		t.Fatalf("control: the host cannot reach its own listener: %v", err)
	} else {
		c.Close()
	}
	if c, err := h.dialTransparent(echo.addr); err != nil {
		t.Fatal(err)
	} else {
		io.WriteString(c, "x")
		b, _ := readAllTimeout(c, 2*time.Second)
		c.Close()
		if !strings.HasPrefix(string(b), "x") {
			t.Fatalf("control: open mode did not reach the echo: %q", b)
		}
	}
	echoed, hosted := echo.accepted.Load(), host.accepted.Load()
	cases := []struct {
		name  string
		local string
		dst   netip.AddrPort
		why   string
	}{
		{"the proxy itself", "", addrPortOf(h.tproxy.Addr()), "is the host"},
		{"the explicit proxy", "", addrPortOf(h.eproxy.Addr()), "is the host"},
		{"a host address", "", host.addr, "is the host"},
		{"unknown source", "127.0.0.9", echo.addr, "unknown source"},
	}
	for _, c := range cases {
		conn, err := h.dialTransparentFrom(c.local, c.dst)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, "x")
		if b, _ := readAllTimeout(conn, 5*time.Second); len(b) != 0 {
			t.Errorf("%s: answered %q", c.name, b)
		}
		conn.Close()
		h.log.wait(t, c.name, func(e Event) bool {
			return e.Verdict == VerdictDeny && e.Port == int(c.dst.Port()) && strings.Contains(e.Reason, c.why)
		})
	}
	h.setPolicy(Policy{Mode: ModeNone, AllowCIDR: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	conn, _ := h.dialTransparent(echo.addr)
	io.WriteString(conn, "x")
	if b, _ := readAllTimeout(conn, 5*time.Second); len(b) != 0 {
		t.Error("mode none let a connection through")
	}
	conn.Close()
	h.log.wait(t, "mode none", func(e Event) bool { return e.Reason == "egress mode none" })
	if echo.accepted.Load() != echoed || host.accepted.Load() != hosted {
		t.Error("a denied connection reached the upstream")
	}
	// Config.Deny beats AllowCIDR.
	h3 := newHarness(t, Policy{Mode: ModeAllow, AllowCIDR: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
		func(c *Config) { c.Deny = []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")} })
	conn, _ = h3.dialTransparent(echo.addr)
	io.WriteString(conn, "x")
	if b, _ := readAllTimeout(conn, 5*time.Second); len(b) != 0 {
		t.Error("Config.Deny ignored")
	}
	conn.Close()
	h3.log.wait(t, "Config.Deny", func(e Event) bool {
		return e.Verdict == VerdictDeny && e.Addr == echo.addr.Addr().String() && strings.Contains(e.Reason, "is the host")
	})
	if echo.accepted.Load() != echoed {
		t.Error("a connection Config.Deny refuses reached the upstream")
	}
}

func TestTransparentLimits(t *testing.T) {
	cidr := Policy{Mode: ModeAllow, AllowCIDR: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}}
	h := newHarness(t, cidr, func(c *Config) { c.MaxConnsPerSandbox = 2 })
	echo := startEcho(t, "127.0.0.2", "")
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for range 2 {
		c, _ := h.dialTransparent(echo.addr)
		io.WriteString(c, "x")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	c, _ := h.dialTransparent(echo.addr)
	io.WriteString(c, "x")
	if b, _ := readAllTimeout(c, 5*time.Second); len(b) != 0 {
		t.Fatal("third connection allowed with a limit of 2")
	}
	c.Close()
	h.log.wait(t, "too many", func(e Event) bool { return strings.Contains(e.Reason, "too many connections") })
	// Closing one frees a slot.
	open[0].Close()
	open = open[1:]
	time.Sleep(100 * time.Millisecond)
	c, _ = h.dialTransparent(echo.addr)
	io.WriteString(c, "y")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatalf("after a slot was freed: %v", err)
	}
	c.Close()

	h2 := newHarness(t, cidr, func(c *Config) { c.ConnRate = 1 })
	ok, limited := 0, 0
	for range 3 {
		c, _ := h2.dialTransparent(echo.addr)
		io.WriteString(c, "z")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
			ok++
		} else {
			limited++
		}
		c.Close()
	}
	if ok != 1 || limited != 2 {
		t.Fatalf("rate 1/s: %d allowed, %d limited; want 1, 2", ok, limited)
	}
	h2.log.wait(t, "rate limit", func(e Event) bool { return e.Reason == "rate limit" && e.Verdict == VerdictDeny })
}

// Byte counts on a larger transfer, both ways.
func TestTransparentBytes(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeAllow, AllowCIDR: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}}, nil)
	echo := startEcho(t, "127.0.0.2", "")
	c, err := h.dialTransparent(echo.addr)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3<<20 + 17
	go func() {
		c.Write(make([]byte, n))
		c.(*net.TCPConn).CloseWrite()
	}()
	got, err := readAllTimeout(c, 10*time.Second)
	c.Close()
	if err != nil || len(got) != n {
		t.Fatalf("echoed %d bytes, %v; want %d", len(got), err, n)
	}
	e := h.log.wait(t, "bytes", func(e Event) bool { return e.Verdict == VerdictAllow && e.Addr == "127.0.0.2" })
	if e.BytesOut != n || e.BytesIn != n {
		t.Fatalf("event bytes out %d in %d; want %d", e.BytesOut, e.BytesIn, n)
	}
}

// The default OriginalDst, on a connection nothing redirected: either
// conntrack reports the local address or there is no entry.
func TestDefaultOriginalDst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ap, err := originalDst(s)
	if err != nil {
		t.Logf("no conntrack entry: %v", err)
		return
	}
	if ap != addrPortOf(s.LocalAddr()) {
		t.Fatalf("original destination %v of an unredirected connection to %v", ap, s.LocalAddr())
	}
}

func TestIdleTimeoutAndClose(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeAllow, AllowCIDR: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}},
		func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	echo := startEcho(t, "127.0.0.2", "")
	c, _ := h.dialTransparent(echo.addr)
	defer c.Close()
	// Traffic keeps it open past the idle timeout…
	for range 6 {
		io.WriteString(c, "x")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatalf("active connection closed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// …silence closes it.
	start := time.Now()
	if b, err := readAllTimeout(c, 5*time.Second); len(b) != 0 || err != nil {
		t.Fatalf("idle connection: %q, %v", b, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("idle connection closed after %v", d)
	}
	e := h.log.wait(t, "idle end", func(e Event) bool { return e.Verdict == VerdictAllow && e.BytesOut == 6 })
	if e.BytesIn != 6 {
		t.Errorf("event %+v", e)
	}

	// Close ends connections in progress; Serve after Close fails.
	c2, _ := h.dialTransparent(echo.addr)
	defer c2.Close()
	io.WriteString(c2, "y")
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.ReadFull(c2, make([]byte, 1))
	h.srv.Close()
	if b, _ := readAllTimeout(c2, 5*time.Second); len(b) != 0 {
		t.Fatalf("after Close: %q", b)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	if err := h.srv.ServeTransparent(ln); err != ErrServerClosed {
		t.Fatalf("ServeTransparent after Close = %v", err)
	}
}
