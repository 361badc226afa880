package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clientHello captures the first TLS record crypto/tls sends for sni.
func clientHello(t testing.TB, sni string) []byte {
	t.Helper()
	c1, c2 := net.Pipe()
	defer c2.Close()
	go func() {
		tls.Client(c1, &tls.Config{ServerName: sni, InsecureSkipVerify: true}).Handshake()
		c1.Close()
	}()
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(c2, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(c2, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// fragment re-frames a single-record ClientHello into records of at most
// n handshake bytes each.
func fragment(rec []byte, n int) []byte {
	hs := rec[5:]
	var out []byte
	for len(hs) > 0 {
		k := min(n, len(hs))
		out = append(out, 0x16, rec[1], rec[2], byte(k>>8), byte(k))
		out = append(out, hs[:k]...)
		hs = hs[k:]
	}
	return out
}

func TestSNI(t *testing.T) {
	for _, name := range []string{"api.example.com", "a.b", strings.Repeat("x", 63) + ".example.org"} {
		ch := clientHello(t, name)
		kind, got, err := sniff(ch)
		if kind != sniffTLS || err != nil || got != name {
			t.Fatalf("sniff(ClientHello %s) = %v, %q, %v", name, kind, got, err)
		}
		// Every prefix needs more, never a wrong answer.
		for i := 0; i < len(ch); i++ {
			if _, got, err := sniff(ch[:i]); err != errNeedMore || got != "" {
				t.Fatalf("sniff(prefix %d) = %q, %v; want need more", i, got, err)
			}
		}
		// Fragmented across records.
		for _, n := range []int{1, 3, 50, 200} {
			f := fragment(ch, n)
			if _, got, err := sniff(f); err != nil || got != name {
				t.Fatalf("sniff(fragments of %d) = %q, %v", n, got, err)
			}
			if _, _, err := sniff(f[:len(f)-1]); err != errNeedMore {
				t.Fatalf("sniff(fragments of %d minus a byte) = %v; want need more", n, err)
			}
		}
	}
	// No SNI: crypto/tls sends none for an IP.
	ch := clientHello(t, "")
	if _, got, err := sniff(ch); err != nil || got != "" {
		t.Fatalf("sniff(ClientHello without SNI) = %q, %v", got, err)
	}
	// Garbage.
	for _, b := range [][]byte{
		{0x16, 3, 1, 0, 0},
		{0x16, 3, 1, 0xff, 0xff},
		{0x16, 2, 1, 0, 4, 1, 0, 0, 0},
		{0x16, 3, 1, 0, 4, 2, 0, 0, 0},
		{0x16, 3, 1, 0, 5, 1, 0, 0, 1, 0},
		append([]byte{0x16, 3, 1, 0, 8, 1, 0, 0, 4}, 1, 2, 3, 4),
	} {
		if _, got, err := sniff(b); err == nil || err == errNeedMore && len(b) > 9 || got != "" {
			t.Errorf("sniff(%x) = %q, %v; want an error", b, got, err)
		}
	}
}

func TestHTTPHost(t *testing.T) {
	cases := []struct {
		in, host string
		err      bool
	}{
		{"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n", "api.example.com", false},
		{"GET / HTTP/1.1\r\nhost:api.example.com:8080\r\nX: y\r\n\r\n", "api.example.com", false},
		{"POST /x HTTP/1.0\r\nUser-Agent: a\r\nHOST: \t a.b \t\r\n\r\nbody", "a.b", false},
		{"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", "[::1]", false},
		{"GET / HTTP/1.0\r\n\r\n", "", false},
		{"GET http://a.example.com/x HTTP/1.1\r\nHost: a.example.com\r\n\r\n", "a.example.com", false},
		{"GET http://a.example.com:81/x HTTP/1.1\r\n\r\n", "a.example.com", false},
		{"GET http://evil.com/ HTTP/1.1\r\nHost: a.example.com\r\n\r\n", "", true},
		{"GET http://u@evil.com/ HTTP/1.1\r\nHost: evil.com\r\n\r\n", "", true},
		{"GET / HTTP/1.1\r\nHost: a.example.com\r\nHost: evil.com\r\n\r\n", "", true},
		{"GET / HTTP/1.1\r\nHost : evil.com\r\n\r\n", "", true},
		{"GET / HTTP/1.1\r\nX: y\r\n Host: evil.com\r\n\r\n", "", true},
		{"GET / HTTP/1.1\r\nHost: evil.com%00.a.example.com\r\n\r\n", "", true},
		{"GET / HTTP/1.1\r\nHost: a@evil.com\r\n\r\n", "", true},
		{"GET / HTTP/1.1\r\nHost: a.com:99999\r\n\r\n", "", true},
		{"GET / HTTP/1.1\r\nHost: a.com:\r\n\r\n", "", true},
		{"GET /  HTTP/1.1\r\nHost: a.com\r\n\r\n", "", true},
		{"GET / HTTP/2.0\r\nHost: a.com\r\n\r\n", "", true},
		{"GET / HTTP/1.1\r\nHost: a.com\r\n", "", true}, // incomplete: need more
	}
	for _, c := range cases {
		kind, host, err := sniff([]byte(c.in))
		if kind != sniffHTTP || host != c.host || (err != nil) != c.err {
			t.Errorf("sniff(%q) = %v, %q, %v; want %q, error %v", c.in, kind, host, err, c.host, c.err)
		}
	}
	if _, _, err := sniff([]byte("GET / HTTP/1.1\r\nHost: a.com\r\n")); err != errNeedMore {
		t.Errorf("incomplete head: %v", err)
	}
	if _, _, err := sniff([]byte("GET / HTTP/1.1\r\n" + strings.Repeat("X: y\r\n", maxPeek/6+1))); err == nil || err == errNeedMore {
		t.Errorf("huge head: %v", err)
	}
	for _, s := range []string{"SSH-2.0-OpenSSH_9.6\r\n", "\x00\x00\x00\x08\x04\xd2\x16\x2f", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "GETX"} {
		if kind, host, err := sniff([]byte(s)); kind != sniffNone || host != "" || err != nil {
			t.Errorf("sniff(%q) = %v, %q, %v; want an opaque protocol", s, kind, host, err)
		}
	}
}

func FuzzSNI(f *testing.F) {
	for _, n := range []string{"api.example.com", "", "x"} {
		ch := clientHello(f, n)
		f.Add(ch)
		f.Add(fragment(ch, 7))
		f.Add(ch[:len(ch)/2])
	}
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Add([]byte{0x16})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 0 {
			b = append([]byte{0x16}, b[1:]...) // aim at the TLS parser
		}
		kind, name, err := sniff(b)
		if kind != sniffTLS && len(b) > 0 {
			t.Fatalf("kind %v", kind)
		}
		if name != "" {
			if err != nil {
				t.Fatalf("name %q with error %v", name, err)
			}
			if !bytes.Contains(b, []byte(name)) && len(b) < 2*maxPeek {
				// A name may span record boundaries; check it in the
				// reassembled handshake instead.
				var hs []byte
				for r := b; len(r) >= 5; {
					n := int(r[3])<<8 | int(r[4])
					if len(r) < 5+n {
						break
					}
					hs = append(hs, r[5:5+n]...)
					r = r[5+n:]
				}
				if !bytes.Contains(hs, []byte(name)) {
					t.Fatalf("name %q not in the input", name)
				}
			}
		}
	})
}

func FuzzHost(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"GET http://a.b:1/ HTTP/1.1\r\nHost: a.b\r\n\r\n",
		"CONNECT a.b:443 HTTP/1.1\r\nHost: a.b:443\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: [::1]:8\r\n\r\n",
		"POST / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, host, err := sniff(b)
		if host == "" {
			return
		}
		if err != nil {
			t.Fatalf("host %q with error %v", host, err)
		}
		if !bytes.Contains(bytes.ToLower(b), bytes.ToLower([]byte(host))) {
			t.Fatalf("host %q not in the input", host)
		}
		if strings.ContainsAny(host, "@%/\\ \t\r\n\x00") {
			t.Fatalf("host %q has a forbidden character", host)
		}
		// Whatever came out is judged safely.
		if _, _, why, ok := fuzzServer.judgeHost(t.Context(), Policy{Mode: ModeOpen}, host); ok {
			if _, err := NormalizeName(host); err != nil {
				if a, isIP := ParseIP(host); !isIP || BlockedReason(a) != "" {
					t.Fatalf("judgeHost(%q) allowed: %s", host, why)
				}
			}
		}
	})
}

// fuzzServer judges hosts for the fuzz tests; it never resolves anything
// for real: every name "resolves" to a documentation address made public.
var fuzzServer = New(Config{
	Resolve: func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil
	},
	Public: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32")},
	Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("fuzz: no dialing")
	},
})

// refInetAton is an independent reading of inet_aton, for FuzzParseIP.
var refPart = regexp.MustCompile(`^(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)$`)

func refInetAton(s string) (netip.Addr, bool) {
	s = strings.TrimSuffix(s, ".")
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var v []uint64
	for _, p := range parts {
		if !refPart.MatchString(p) {
			return netip.Addr{}, false
		}
		var n uint64
		var err error
		switch {
		case len(p) > 1 && (p[1] == 'x' || p[1] == 'X'):
			n, err = strconv.ParseUint(p[2:], 16, 32)
		case p[0] == '0':
			n, err = strconv.ParseUint(p, 8, 32)
		default:
			n, err = strconv.ParseUint(p, 10, 32)
		}
		if err != nil {
			return netip.Addr{}, false
		}
		v = append(v, n)
	}
	last := v[len(v)-1]
	lim := []uint64{0xffffffff, 0xffffff, 0xffff, 0xff}[len(v)-1]
	if last > lim {
		return netip.Addr{}, false
	}
	x := last
	for i, p := range v[:len(v)-1] {
		if p > 0xff {
			return netip.Addr{}, false
		}
		x |= p << (24 - 8*i)
	}
	return netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)}), true
}

func FuzzParseIP(f *testing.F) {
	for _, s := range []string{"2130706433", "0x7f.1", "017700000001", "127.1", "[::ffff:127.0.0.1]", "8.8.8.8",
		"0xa9fea9fe", "::1", "fe80::1%eth0", "1.2.3.4.", "0x", "09", "1.2.3.4.5", "[64:ff9b::7f00:1]", "4294967295"} {
		f.Add(s)
	}
	srv := fuzzServer
	open := Policy{Mode: ModeOpen}
	f.Fuzz(func(t *testing.T, s string) {
		a, ok := ParseIP(s)
		if !strings.ContainsAny(s, ":[") {
			ra, rok := refInetAton(s)
			if ok != rok || a != ra {
				t.Fatalf("ParseIP(%q) = %v, %v; reference %v, %v", s, a, ok, ra, rok)
			}
		}
		if !ok {
			return
		}
		if !a.IsValid() || a.Zone() != "" || a.Is4In6() {
			t.Fatalf("ParseIP(%q) = %v: not normalized", s, a)
		}
		if n, err := netip.ParseAddr(s); err == nil && normAddr(n) != a {
			t.Fatalf("ParseIP(%q) = %v; netip says %v", s, a, n)
		}
		if b, ok := ParseIP(a.String()); !ok || b != a {
			t.Fatalf("ParseIP(%q) round trip: %v → %v, %v", s, a, b, ok)
		}
		// Judged as an address, blocked when it is.
		blocked := BlockedReason(a) != ""
		if ok, _ := open.AllowAddr(a, false); ok == blocked {
			t.Fatalf("ParseIP(%q) = %v: blocked %v but AllowAddr %v", s, a, blocked, ok)
		}
		if _, _, why, ok := srv.judgeHost(t.Context(), open, s); blocked && ok {
			t.Fatalf("judgeHost(%q) allowed blocked %v: %s", s, a, why)
		}
		if ok, _ := open.AllowName(s); ok {
			t.Fatalf("AllowName(%q) allowed an address", s)
		}
	})
}
