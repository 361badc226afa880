package egress

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// FuzzPolicyRule checks the name rules: a rule Validate accepts matches
// exactly what its syntax says (an exact rule its name, a wildcard rule
// the names strictly below its suffix), case-insensitively and ignoring a
// trailing dot; Deny wins over Allow in every mode; mode none allows no
// name; and a name that is allowed is one NormalizeName accepts, which
// normalizes to itself.
func FuzzPolicyRule(f *testing.F) {
	for _, s := range [][2]string{
		{"api.example.com", "api.example.com"}, {"api.example.com", "API.Example.COM."}, {"*.example.com", "a.example.com"},
		{"*.example.com", "example.com"}, {"*.example.com", "a.b.example.com"}, {"*.example.com", "aexample.com"},
		{"example.com.", "example.com"}, {"*.com", "x.com"}, {"*", "x"}, {"*.*.com", "a.b.com"}, {"a..b", "a..b"},
		{"1.2.3.4", "1.2.3.4"}, {"x.1", "x.1"}, {"0x7f.1", "0x7f.1"}, {"a_b.example", "A_B.example"}, {"-a.example", "-a.example"},
		{strings.Repeat("a", 64) + ".com", strings.Repeat("a", 64) + ".com"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, rule, name string) {
		if validateRule(rule) != nil {
			if (Policy{Mode: ModeAllow, Allow: []string{rule}}).Validate() == nil {
				t.Fatalf("Validate accepts the rule %q validateRule refuses", rule)
			}
			return
		}
		allow := Policy{Mode: ModeAllow, Allow: []string{rule}}
		if err := allow.Validate(); err != nil {
			t.Fatalf("rule %q: %v", rule, err)
		}
		ok, why := allow.AllowName(name)
		n, nerr := NormalizeName(name)
		if ok {
			if nerr != nil {
				t.Fatalf("%q allowed by %q (%s) but NormalizeName refuses it: %v", name, rule, why, nerr)
			}
			if again, err := NormalizeName(n); err != nil || again != n || n != strings.ToLower(n) {
				t.Fatalf("NormalizeName(%q) = %q, which normalizes to %q, %v", name, n, again, err)
			}
		}
		want := false
		if nerr == nil {
			r := strings.ToLower(strings.TrimSuffix(rule, "."))
			if suffix, wild := strings.CutPrefix(r, "*"); wild {
				want = strings.HasSuffix(n, suffix) && len(n) > len(suffix)
			} else {
				want = n == r
			}
		}
		if ok != want {
			t.Fatalf("allow %q, name %q: allowed %v (%s), want %v", rule, name, ok, why, want)
		}
		if up, _ := allow.AllowName(strings.ToUpper(name)); up != ok {
			t.Fatalf("allow %q: %q allowed %v but its upper case %v", rule, name, ok, up)
		}
		for _, p := range []Policy{
			{Mode: ModeAllow, Allow: []string{rule}, Deny: []string{rule}},
			{Mode: ModeOpen, Deny: []string{rule}},
		} {
			if ok2, why := p.AllowName(name); ok2 && want {
				t.Fatalf("deny %q in mode %s: %q allowed (%s)", rule, p.Mode, name, why)
			}
		}
		if ok2, _ := (Policy{Mode: ModeOpen}).AllowName(name); ok2 != (nerr == nil) {
			t.Fatalf("mode open: %q allowed %v, NormalizeName: %v", name, ok2, nerr)
		}
		if ok2, _ := (Policy{Mode: ModeNone, Allow: []string{rule}}).AllowName(name); ok2 {
			t.Fatalf("mode none allowed %q", name)
		}
	})
}

// dnsWriter is a dns.ResponseWriter that keeps the replies.
type dnsWriter struct {
	remote  net.Addr
	replies []*dns.Msg
}

func (w *dnsWriter) LocalAddr() net.Addr         { return &net.UDPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 53} }
func (w *dnsWriter) RemoteAddr() net.Addr        { return w.remote }
func (w *dnsWriter) WriteMsg(m *dns.Msg) error   { w.replies = append(w.replies, m.Copy()); return nil }
func (w *dnsWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *dnsWriter) Close() error                { return nil }
func (w *dnsWriter) TsigStatus() error           { return nil }
func (w *dnsWriter) TsigTimersOnly(bool)         {}
func (w *dnsWriter) Hijack()                     {}

// FuzzDNSQuery feeds raw DNS packets, as a sandbox sends them, to the
// egress DNS server's handler and checks its answer: exactly one reply,
// with the query's id; REFUSED for anything but a single A or AAAA query
// of class IN; answers only of the asked type, for the asked name, with a
// TTL of at most 30 s, for a name the policy allows, and only addresses
// the policy allows; over UDP, a reply that fits the client's buffer.
func FuzzDNSQuery(f *testing.F) {
	pol := Policy{Mode: ModeAllow, Allow: []string{"*.example.com", "ok.test"}, Deny: []string{"bad.example.com"}}
	resolved := addrs("93.184.215.14", "10.0.0.5", "169.254.169.254", "2606:2800:21f:cb07:6820:80da:af6b:8b2c", "::ffff:127.0.0.1", "8.8.8.8")
	s := New(Config{
		Sandbox: func(src netip.Addr) (string, Policy, bool) {
			if src != sandboxSrc {
				return "", Policy{}, false
			}
			return sandboxID, pol, true
		},
		Resolve: func(ctx context.Context, name string) ([]netip.Addr, error) {
			if strings.HasPrefix(name, "nx.") {
				return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
			}
			return resolved, nil
		},
		Log: func(Event) {},
	})
	f.Cleanup(func() { s.Close() })
	for _, q := range []struct {
		name string
		typ  uint16
	}{{"www.example.com", dns.TypeA}, {"ok.test", dns.TypeAAAA}, {"bad.example.com", dns.TypeA}, {"evil.com", dns.TypeA},
		{"www.example.com", dns.TypeTXT}, {"nx.example.com", dns.TypeA}, {"14.215.184.93.in-addr.arpa", dns.TypePTR}, {"a\\.b.example.com", dns.TypeA}} {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(q.name), q.typ)
		b, _ := m.Pack()
		f.Add(b, false, true)
		m.SetEdns0(4096, true)
		b, _ = m.Pack()
		f.Add(b, true, true)
	}
	f.Add([]byte{0, 1, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0}, false, false)
	f.Fuzz(func(t *testing.T, packet []byte, tcp, known bool) {
		r := new(dns.Msg)
		if r.Unpack(packet) != nil {
			return // the dns package answers FORMERR before the handler
		}
		src := netip.MustParseAddr("127.0.0.2")
		if known {
			src = sandboxSrc
		}
		w := &dnsWriter{remote: &net.UDPAddr{IP: src.AsSlice(), Port: 5353}}
		if tcp {
			w.remote = &net.TCPAddr{IP: src.AsSlice(), Port: 5353}
		}
		dnsHandler{s}.ServeDNS(w, r)
		if len(w.replies) != 1 {
			t.Fatalf("%d replies to %v", len(w.replies), r)
		}
		m := w.replies[0]
		if m.Id != r.Id || !m.Response {
			t.Fatalf("reply %v to query %v: wrong id or not a response", m, r)
		}
		single := known && !r.Response && r.Opcode == dns.OpcodeQuery && len(r.Question) == 1 &&
			r.Question[0].Qclass == dns.ClassINET && (r.Question[0].Qtype == dns.TypeA || r.Question[0].Qtype == dns.TypeAAAA)
		if !single && m.Rcode != dns.RcodeRefused {
			t.Fatalf("query %v answered %s, not REFUSED", r, dns.RcodeToString[m.Rcode])
		}
		if len(m.Answer) > 0 {
			q := r.Question[0]
			name := strings.TrimSuffix(q.Name, ".")
			if ok, _ := pol.AllowName(name); !ok || m.Rcode != dns.RcodeSuccess {
				t.Fatalf("answers %v for %q, which the policy denies (rcode %s)", m.Answer, name, dns.RcodeToString[m.Rcode])
			}
			for _, rr := range m.Answer {
				h := rr.Header()
				if h.Name != q.Name || h.Rrtype != q.Qtype || h.Class != dns.ClassINET || h.Ttl > answerTTL {
					t.Fatalf("answer %v to %v", rr, q)
				}
				var ip net.IP
				switch v := rr.(type) {
				case *dns.A:
					ip = v.A
				case *dns.AAAA:
					ip = v.AAAA
				}
				a, _ := netip.AddrFromSlice(ip)
				if ok, why := pol.AllowAddr(a.Unmap(), true); !ok {
					t.Fatalf("answer %v: address denied (%s)", rr, why)
				}
			}
		}
		if !tcp {
			b, err := m.Pack()
			if err != nil {
				t.Fatal(err)
			}
			limit := dns.MinMsgSize
			if opt := r.IsEdns0(); opt != nil {
				limit = max(int(opt.UDPSize()), dns.MinMsgSize)
			}
			if len(b) > limit {
				t.Fatalf("UDP reply of %d bytes to a client that takes %d", len(b), limit)
			}
		}
	})
}

// FuzzInterceptReframe feeds raw HTTP requests, as a sandbox sends them on
// an intercepted TLS connection, through what the proxy does to each
// (hop-by-hop headers stripped, the secret header set, re-framed with
// writeRequest) and parses what the upstream would read: a request target
// in origin form (a path, or "*"), exactly one
// request, with the same method, target, host and body, the secret header
// exactly once with its value, and nothing after it (no smuggled second
// request, whatever Content-Length, Transfer-Encoding or Connection headers
// the sandbox sent).
func FuzzInterceptReframe(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"POST /x?y=1 HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 5\r\nAuthorization: mine\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close, Authorization\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n",
		"GET https://api.example.com/abs HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	const secret = "Bearer s3cr3t"
	f.Fuzz(func(t *testing.T, raw []byte) {
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			return // refused as malformed
		}
		// As exchange does: refuse, then re-frame.
		if code, _ := checkIntercepted(req); code != 0 {
			return
		}
		hadCL := len(req.Header["Content-Length"]) > 0
		chunked := len(req.TransferEncoding) > 0
		stripHop(req.Header)
		req.Header.Del("Content-Length")
		req.Header.Del("Authorization")
		req.Header.Set("Authorization", secret)
		uri := req.RequestURI
		if !strings.HasPrefix(uri, "/") && uri != "*" {
			uri = req.URL.RequestURI()
		}
		if !strings.HasPrefix(uri, "/") && uri != "*" {
			t.Fatalf("request target %q would go upstream, not a path (origin form)", uri)
		}
		host := "api.example.com"
		var body bytes.Buffer
		req.Body = io.NopCloser(io.TeeReader(req.Body, &body))
		var out bytes.Buffer
		clientSide, err := writeRequest(bufio.NewWriter(&out), req, uri, host, chunked, hadCL)
		if err != nil {
			if !clientSide {
				t.Fatalf("writeRequest to a buffer: %v", err)
			}
			return // the sandbox's body was malformed: the proxy closes upstream
		}
		br := bufio.NewReader(bytes.NewReader(out.Bytes()))
		up, err := http.ReadRequest(br)
		if err != nil {
			t.Fatalf("upstream cannot parse the re-framed request %q: %v", out.Bytes(), err)
		}
		got, err := io.ReadAll(up.Body)
		if err != nil {
			t.Fatalf("upstream reading the body of %q: %v", out.Bytes(), err)
		}
		if up.Method != req.Method || up.RequestURI != uri || up.Host != host {
			t.Fatalf("upstream read %s %s host %q, the proxy checked %s %s host %q", up.Method, up.RequestURI, up.Host, req.Method, uri, host)
		}
		if v := up.Header.Values("Authorization"); len(v) != 1 || v[0] != secret {
			t.Fatalf("upstream got Authorization %q", v)
		}
		if !bytes.Equal(got, body.Bytes()) {
			t.Fatalf("upstream read body %q, the sandbox sent %q", got, body.Bytes())
		}
		if rest, _ := io.ReadAll(br); len(rest) > 0 {
			t.Fatalf("bytes after the request upstream (smuggling): %q in %q", rest, out.Bytes())
		}
	})
}
