package egress

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// sink counts what it receives; when a client half-closes, it answers
// with the connection's count.
type sink struct {
	addr     netip.AddrPort
	total    atomic.Int64
	accepted atomic.Int64
}

func startSink(t testing.TB, ip string) *sink {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	k := &sink{addr: addrPortOf(ln.Addr())}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			k.accepted.Add(1)
			go func() {
				defer c.Close()
				var n int64
				buf := make([]byte, 4096)
				for {
					m, err := c.Read(buf)
					n += int64(m)
					k.total.Add(int64(m))
					if err != nil {
						break
					}
				}
				fmt.Fprintf(c, "n=%d", n)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return k
}

// sendTo sends data through the transparent proxy to dst, half-closing
// after it when closeWrite, and returns what came back.
func sendTo(h *harness, dst netip.AddrPort, data string, closeWrite bool) string {
	c, err := h.dialTransparent(dst)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, data)
	if closeWrite {
		c.(*net.TCPConn).CloseWrite()
	}
	b, _ := readAllTimeout(c, 5*time.Second)
	return string(b)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPolicyConnRate(t *testing.T) {
	echo := startEcho(t, "127.0.0.2", "")
	cidr := []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}
	try := func(h *harness) (ok, limited int) {
		for range 3 {
			c, _ := h.dialTransparent(echo.addr)
			io.WriteString(c, "z")
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
				ok++
			} else {
				limited++
			}
			c.Close()
		}
		return ok, limited
	}
	// The sandbox's own rate, without a server-wide one.
	h := newHarness(t, Policy{Mode: ModeAllow, AllowCIDR: cidr, ConnRate: 1}, nil)
	if ok, limited := try(h); ok != 1 || limited != 2 {
		t.Fatalf("policy rate 1/s: %d allowed, %d limited; want 1, 2", ok, limited)
	}
	h.log.wait(t, "rate limit", func(e Event) bool { return e.Reason == "rate limit" && e.Verdict == VerdictDeny })
	// It overrides the server's.
	h2 := newHarness(t, Policy{Mode: ModeAllow, AllowCIDR: cidr, ConnRate: 100}, func(c *Config) { c.ConnRate = 1 })
	if ok, limited := try(h2); ok != 3 || limited != 0 {
		t.Fatalf("policy rate 100/s over config 1/s: %d allowed, %d limited; want 3, 0", ok, limited)
	}
	// A policy change applies to the next connection.
	h2.setPolicy(Policy{Mode: ModeAllow, AllowCIDR: cidr})
	time.Sleep(1100 * time.Millisecond)
	if ok, limited := try(h2); ok != 1 || limited != 2 {
		t.Fatalf("back to config rate 1/s: %d allowed, %d limited; want 1, 2", ok, limited)
	}
	// The explicit proxy too: the second request on a connection is limited.
	h3 := newHarness(t, Policy{Mode: ModeOpen, ConnRate: 1}, nil)
	a := startHTTP(t, "127.0.0.3", "A", false)
	h3.res.set("web.example.com", []netip.Addr{a.addr.Addr()})
	c, _ := net.Dial("tcp", h3.eproxy.Addr().String())
	defer c.Close()
	br := bufio.NewReader(c)
	var codes []int
	for range 2 {
		fmt.Fprintf(c, "GET http://web.example.com:%d/ HTTP/1.1\r\nHost: web.example.com\r\n\r\n", a.addr.Port())
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		io.ReadAll(resp.Body)
		codes = append(codes, resp.StatusCode)
	}
	if fmt.Sprint(codes) != "[200 429]" {
		t.Fatalf("explicit proxy, policy rate 1/s: codes %v; want [200 429]", codes)
	}
}

func TestMaxEgressBytes(t *testing.T) {
	k := startSink(t, "127.0.0.2")
	pol := Policy{Mode: ModeAllow, AllowCIDR: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}, MaxEgressBytes: 100}
	h := newHarness(t, pol, nil)
	const limitReason = "egress byte limit reached (100 bytes)"

	// Under the limit: relayed and counted.
	if got := sendTo(h, k.addr, strings.Repeat("a", 60), true); got != "n=60" {
		t.Fatalf("first connection: %q", got)
	}
	h.log.wait(t, "first connection", func(e Event) bool { return e.Verdict == VerdictAllow && e.BytesOut == 60 })
	if n := h.srv.EgressBytes(sandboxID); n != 60 {
		t.Fatalf("EgressBytes = %d; want 60", n)
	}
	// Reaching it mid-stream: the connection is cut at exactly the limit.
	sendTo(h, k.addr, strings.Repeat("b", 60), false)
	e := h.log.wait(t, "cut at the limit", func(e Event) bool {
		return e.Verdict == VerdictAllow && strings.Contains(e.Reason, limitReason)
	})
	if e.BytesOut != 40 {
		t.Errorf("cut connection sent %d bytes; want 40", e.BytesOut)
	}
	waitFor(t, "the sink to count 100 bytes", func() bool { return k.total.Load() == 100 })
	if n := h.srv.EgressBytes(sandboxID); n != 100 {
		t.Fatalf("EgressBytes = %d; want 100", n)
	}
	// Past it: new connections are denied, in both proxies.
	before := k.accepted.Load()
	if got := sendTo(h, k.addr, "c", true); got != "" {
		t.Fatalf("connection past the limit answered %q", got)
	}
	h.log.wait(t, "denied past the limit", func(e Event) bool { return e.Verdict == VerdictDeny && e.Reason == limitReason })
	r, body := h.rawRequest(t, fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n", k.addr))
	if r.Status != "429 den egress: "+RuleByteLimit || !strings.Contains(body, limitReason) {
		t.Fatalf("CONNECT past the limit: %q %q", r.Status, body)
	}
	if k.accepted.Load() != before {
		t.Fatal("a connection past the limit reached the upstream")
	}

	// The daemon seeds the counter; traffic adds to it.
	h.srv.SetEgressBytes(sandboxID, 90)
	if n := h.srv.EgressBytes(sandboxID); n != 90 {
		t.Fatalf("EgressBytes after SetEgressBytes(90) = %d", n)
	}
	sendTo(h, k.addr, strings.Repeat("d", 60), false)
	h.log.wait(t, "cut after seeding", func(e Event) bool {
		return e.Verdict == VerdictAllow && e.BytesOut == 10 && strings.Contains(e.Reason, limitReason)
	})
	if n := h.srv.EgressBytes(sandboxID); n != 100 {
		t.Fatalf("EgressBytes = %d; want 100", n)
	}
	h.srv.SetEgressBytes(sandboxID, 0)
	if got := sendTo(h, k.addr, "eeeee", true); got != "n=5" {
		t.Fatalf("after a reset: %q", got)
	}
	waitFor(t, "EgressBytes 5", func() bool { return h.srv.EgressBytes(sandboxID) == 5 })
	// Exactly the limit, then EOF: not cut.
	h.srv.SetEgressBytes(sandboxID, 0)
	if got := sendTo(h, k.addr, strings.Repeat("f", 100), true); got != "n=100" {
		t.Fatalf("exactly the limit: %q", got)
	}

	// The explicit proxy's forwarded requests count and are cut too.
	a := startHTTP(t, "127.0.0.3", "A", false)
	h.res.set("web.example.com", []netip.Addr{a.addr.Addr()})
	h.setPolicy(Policy{Mode: ModeOpen, MaxEgressBytes: 300})
	h.srv.SetEgressBytes(sandboxID, 0)
	req := fmt.Sprintf("POST http://web.example.com:%d/ HTTP/1.1\r\nHost: web.example.com\r\nContent-Length: 10\r\n\r\n0123456789", a.addr.Port())
	if r, body := h.rawRequest(t, req); r.StatusCode != 200 || !strings.Contains(body, "body=10") {
		t.Fatalf("small POST: %d %q", r.StatusCode, body)
	}
	used := h.srv.EgressBytes(sandboxID)
	if used < 10 || used > 300 {
		t.Fatalf("EgressBytes after a small POST = %d", used)
	}
	req = fmt.Sprintf("POST http://web.example.com:%d/ HTTP/1.1\r\nHost: web.example.com\r\nContent-Length: 1000\r\n\r\n%s", a.addr.Port(), strings.Repeat("x", 1000))
	if r, body := h.rawRequest(t, req); r.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "egress byte limit reached (300 bytes)") {
		t.Fatalf("POST past the limit: %d %q", r.StatusCode, body)
	}
	if n := h.srv.EgressBytes(sandboxID); n != 300 {
		t.Fatalf("EgressBytes = %d; want 300", n)
	}

	// Without a limit, bytes are counted when the connection ends.
	h2 := newHarness(t, Policy{Mode: ModeAllow, AllowCIDR: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}}, nil)
	h2.srv.SetEgressBytes(sandboxID, 5000)
	if got := sendTo(h2, k.addr, strings.Repeat("g", 1000), true); got != "n=1000" {
		t.Fatalf("unlimited: %q", got)
	}
	h2.log.wait(t, "unlimited", func(e Event) bool { return e.BytesOut == 1000 })
	if n := h2.srv.EgressBytes(sandboxID); n != 6000 {
		t.Fatalf("EgressBytes = %d; want 6000", n)
	}
	if n := h2.srv.EgressBytes("other"); n != 0 {
		t.Fatalf("EgressBytes of an unknown sandbox = %d", n)
	}
	h2.srv.SetEgressBytes(sandboxID, 0)
	h2.srv.bytesMu.Lock()
	left := len(h2.srv.bytes)
	h2.srv.bytesMu.Unlock()
	if left != 0 {
		t.Fatalf("%d byte counters left after SetEgressBytes(0)", left)
	}
}

func TestValidateLimitsAndSecrets(t *testing.T) {
	const secret = "Bearer sk-very-secret-value"
	good := Policy{Mode: ModeAllow, ConnRate: 2.5, MaxEgressBytes: 1 << 30, Secrets: []SecretHeader{
		{Host: "api.example.com", Header: "Authorization", Value: secret},
		{Host: "api.example.com.", Header: "x-api-key", Value: "k\tv"},
		{Host: "other.example.com", Header: "Authorization", Value: secret},
	}}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate(good) = %v", err)
	}
	for _, c := range []struct {
		p    Policy
		want string
	}{
		{Policy{Mode: ModeOpen, ConnRate: -1}, "connection rate"},
		{Policy{Mode: ModeOpen, ConnRate: math.NaN()}, "connection rate"},
		{Policy{Mode: ModeOpen, ConnRate: math.Inf(1)}, "connection rate"},
		{Policy{Mode: ModeOpen, MaxEgressBytes: -1}, "max egress bytes"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "*.example.com", Header: "Authorization", Value: secret}}}, "wildcard"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.*.com", Header: "Authorization", Value: secret}}}, "only a leading"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "", Header: "Authorization", Value: secret}}}, "empty name"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "10.0.0.1", Header: "Authorization", Value: secret}}}, "all digits"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.com:443", Header: "Authorization", Value: secret}}}, "invalid character"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.com", Header: "", Value: secret}}}, "empty header name"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.com", Header: "X Key", Value: secret}}}, "invalid character"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.com", Header: "X-Key:", Value: secret}}}, "invalid character"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.com", Header: "host", Value: secret}}}, "cannot be a secret header"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.com", Header: "Content-Length", Value: secret}}}, "cannot be a secret header"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.com", Header: "TRANSFER-ENCODING", Value: secret}}}, "cannot be a secret header"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.com", Header: "Connection", Value: secret}}}, "cannot be a secret header"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.com", Header: "Upgrade", Value: secret}}}, "cannot be a secret header"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.com", Header: "Authorization", Value: ""}}}, "empty value"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.com", Header: "Authorization", Value: secret + "\r\nX-Evil: 1"}}}, "control character"},
		{Policy{Mode: ModeOpen, Secrets: []SecretHeader{{Host: "a.com", Header: "Authorization", Value: secret}, {Host: "A.com.", Header: "authorization", Value: "x"}}}, "given twice"},
	} {
		err := c.p.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%v) = %v; want …%s…", c.p, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "sk-very-secret") {
			t.Errorf("Validate's error discloses the secret: %v", err)
		}
	}
	// Printing a policy hides the values.
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		if out := fmt.Sprintf(f, good); strings.Contains(out, "sk-very-secret") || strings.Contains(out, "k\tv") {
			t.Errorf("fmt %s of a policy discloses a secret: %s", f, out)
		}
	}
}
