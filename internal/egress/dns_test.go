package egress

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func (h *harness) query(t *testing.T, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	addr := h.dnsUDP.LocalAddr().String()
	if network == "tcp" {
		addr = h.dnsTCP.Addr().String()
	}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("query %s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
	}
	return r
}

func answers(r *dns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		switch v := rr.(type) {
		case *dns.A:
			out = append(out, v.A.String())
		case *dns.AAAA:
			out = append(out, v.AAAA.String())
		}
	}
	return out
}

func TestDNS(t *testing.T) {
	h := newHarness(t, Policy{
		Mode:  ModeAllow,
		Allow: []string{"api.example.com", "*.example.org", "private.example.com", "mixed.example.com", "gone.example.com", "v4only.example.com"},
	}, func(c *Config) { c.Public = nil })
	h.res.set("api.example.com", addrs("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"))
	h.res.set("www.example.org", addrs("1.1.1.1", "1.0.0.1"))
	h.res.set("private.example.com", addrs("10.0.0.5", "fd00::5", "169.254.169.254"))
	h.res.set("mixed.example.com", addrs("192.168.1.1", "8.8.8.8", "::ffff:127.0.0.1", "::1", "2001:4860:4860::8888"))
	h.res.set("v4only.example.com", addrs("8.8.4.4"))
	h.res.set("evil.com", addrs("6.6.6.6"))

	for _, network := range []string{"udp", "tcp"} {
		r := h.query(t, network, "api.example.com", dns.TypeA)
		if r.Rcode != dns.RcodeSuccess || strings.Join(answers(r), ",") != "93.184.215.14" {
			t.Fatalf("%s A api.example.com = %s", network, r)
		}
		for _, rr := range r.Answer {
			if rr.Header().Ttl > 30 || rr.Header().Name != "api.example.com." {
				t.Errorf("answer %v: TTL over 30 s or wrong name", rr)
			}
		}
	}
	r := h.query(t, "udp", "API.Example.COM", dns.TypeAAAA)
	if got := answers(r); r.Rcode != dns.RcodeSuccess || len(got) != 1 || got[0] != "2606:2800:21f:cb07:6820:80da:af6b:8b2c" {
		t.Fatalf("AAAA = %s", r)
	}
	r = h.query(t, "udp", "www.example.org", dns.TypeA)
	if len(answers(r)) != 2 {
		t.Fatalf("wildcard A = %s", r)
	}
	// Types other than A/AAAA are refused, even for allowed names.
	for _, qt := range []uint16{dns.TypeTXT, dns.TypeMX, dns.TypeANY, dns.TypeCNAME, dns.TypeNS, dns.TypeSRV, dns.TypeHTTPS, dns.TypeNULL} {
		if r := h.query(t, "udp", "api.example.com", qt); r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
			t.Errorf("%s query answered: %s", dns.TypeToString[qt], r)
		}
	}
	if r := h.query(t, "udp", "14.215.184.93.in-addr.arpa", dns.TypePTR); r.Rcode != dns.RcodeRefused {
		t.Errorf("PTR answered: %s", r)
	}
	// Names not allowed are refused without an upstream lookup.
	for _, n := range []string{"evil.com", "example.org", "evilexample.org", "api.example.com.evil.com", "localhost", "metadata.google.internal"} {
		if r := h.query(t, "udp", n, dns.TypeA); r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
			t.Errorf("disallowed %s answered: %s", n, r)
		}
	}
	if h.res.callCount("evil.com") != 0 {
		t.Error("a disallowed name was looked up upstream")
	}
	// Private answers are filtered; a name with only private ones gets an
	// empty NOERROR and a deny event.
	r = h.query(t, "udp", "private.example.com", dns.TypeA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Fatalf("private-only name: %s", r)
	}
	h.log.wait(t, "deny for private.example.com", func(e Event) bool {
		return e.Kind == KindDNS && e.Name == "private.example.com" && e.Verdict == VerdictDeny &&
			strings.Contains(e.Reason, "resolves to a private address")
	})
	r = h.query(t, "udp", "mixed.example.com", dns.TypeA)
	if got := strings.Join(answers(r), ","); got != "8.8.8.8" {
		t.Fatalf("mixed A = %q; want only the public address", got)
	}
	r = h.query(t, "udp", "mixed.example.com", dns.TypeAAAA)
	if got := strings.Join(answers(r), ","); got != "2001:4860:4860::8888" {
		t.Fatalf("mixed AAAA = %q; want only the public address", got)
	}
	if r := h.query(t, "udp", "v4only.example.com", dns.TypeAAAA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Fatalf("AAAA of a v4-only name: %s", r)
	}
	if r := h.query(t, "udp", "gone.example.com", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Fatalf("unknown allowed name: %s", r)
	}
	// Tunnelling: long labels under a name not allowed are refused.
	label := strings.Repeat("a", 63)
	tunnel := label + "." + label + "." + label + ".t.evil.com"
	for _, qt := range []uint16{dns.TypeA, dns.TypeTXT} {
		if r := h.query(t, "udp", tunnel, qt); r.Rcode != dns.RcodeRefused {
			t.Errorf("tunnel query answered: %s", r)
		}
	}
	h.log.wait(t, "tunnel query logged", func(e Event) bool {
		return e.Kind == KindDNS && strings.HasPrefix(e.Name, label) && e.Verdict == VerdictDeny && e.QType == "TXT"
	})
	// Every query is logged with its sandbox, type and source port.
	e := h.log.wait(t, "A api.example.com", func(e Event) bool {
		return e.Kind == KindDNS && e.Name == "api.example.com" && e.QType == "A" && e.Verdict == VerdictAllow
	})
	if e.Sandbox != sandboxID || e.Addr != "93.184.215.14" || e.SrcPort == 0 || e.Time.IsZero() {
		t.Errorf("event %+v", e)
	}
	h.log.wait(t, "MX refused", func(e Event) bool {
		return e.Kind == KindDNS && e.QType == "MX" && e.Verdict == VerdictDeny && strings.Contains(e.Reason, "MX")
	})

	// Mode none refuses everything.
	h.setPolicy(Policy{Mode: ModeNone, Allow: []string{"api.example.com"}})
	if r := h.query(t, "udp", "api.example.com", dns.TypeA); r.Rcode != dns.RcodeRefused {
		t.Errorf("mode none answered: %s", r)
	}
	// Open mode answers any name not denied, still filtering addresses.
	h.setPolicy(Policy{Mode: ModeOpen, Deny: []string{"evil.com"}})
	if r := h.query(t, "udp", "www.example.org", dns.TypeA); len(r.Answer) != 2 {
		t.Errorf("open mode: %s", r)
	}
	if r := h.query(t, "udp", "evil.com", dns.TypeA); r.Rcode != dns.RcodeRefused {
		t.Errorf("denied name in open mode answered: %s", r)
	}
	if r := h.query(t, "udp", "private.example.com", dns.TypeA); len(r.Answer) != 0 {
		t.Errorf("open mode leaked private answers: %s", r)
	}
}

func TestDNSLimits(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeAllow, Allow: []string{"*.example.com"}}, func(c *Config) { c.MaxNameLen = 100 })
	long := strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + ".example.com"
	h.res.set(long, addrs("8.8.8.8"))
	h.res.set("ok.example.com", addrs("8.8.8.8"))
	if r := h.query(t, "udp", long, dns.TypeA); r.Rcode != dns.RcodeRefused {
		t.Fatalf("long name under an allowed wildcard answered: %s", r)
	}
	h.log.wait(t, "long name refused", func(e Event) bool {
		return e.Kind == KindDNS && strings.Contains(e.Reason, "longer than 100")
	})
	if r := h.query(t, "udp", "ok.example.com", dns.TypeA); len(r.Answer) != 1 {
		t.Fatalf("short name: %s", r)
	}
	// Odd classes, escaped bytes in labels and multi-question messages.
	m := new(dns.Msg)
	m.SetQuestion("ok.example.com.", dns.TypeA)
	m.Question[0].Qclass = dns.ClassCHAOS
	c := &dns.Client{Timeout: 5 * time.Second}
	if r, _, err := c.Exchange(m, h.dnsUDP.LocalAddr().String()); err != nil || r.Rcode != dns.RcodeRefused {
		t.Fatalf("CHAOS: %v %v", r, err)
	}
	m.SetQuestion("ok\\000.example.com.", dns.TypeA)
	if r, _, err := c.Exchange(m, h.dnsUDP.LocalAddr().String()); err != nil || r.Rcode != dns.RcodeRefused {
		t.Fatalf("NUL in a label: %v %v", r, err)
	}
	m.SetQuestion("x\\.ok.example.com.", dns.TypeA)
	if r, _, err := c.Exchange(m, h.dnsUDP.LocalAddr().String()); err != nil || r.Rcode != dns.RcodeRefused {
		t.Fatalf("dot in a label: %v %v", r, err)
	}
	// Garbage never crashes the server.
	u, err := net.Dial("udp", h.dnsUDP.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	for _, b := range [][]byte{{}, {1, 2, 3}, make([]byte, 12), []byte(strings.Repeat("\xff", 600))} {
		u.Write(b)
	}
	if r := h.query(t, "udp", "ok.example.com", dns.TypeA); len(r.Answer) != 1 {
		t.Fatalf("after garbage: %s", r)
	}
}

func TestDNSUnknownSource(t *testing.T) {
	h := newHarness(t, Policy{Mode: ModeOpen}, func(c *Config) {
		c.Sandbox = func(netip.Addr) (string, Policy, bool) { return "", Policy{}, false }
	})
	h.res.set("api.example.com", addrs("8.8.8.8"))
	if r := h.query(t, "udp", "api.example.com", dns.TypeA); r.Rcode != dns.RcodeRefused {
		t.Fatalf("unknown source answered: %s", r)
	}
	h.log.wait(t, "unknown source", func(e Event) bool {
		return e.Kind == KindDNS && e.Verdict == VerdictDeny && strings.Contains(e.Reason, "unknown source")
	})
}
