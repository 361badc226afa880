package egress

import (
	"net/netip"
	"strings"
	"testing"
)

func TestAllowName(t *testing.T) {
	allow := Policy{
		Mode:  ModeAllow,
		Allow: []string{"api.example.com", "*.example.org", "CamelCase.Example.NET.", "*.github.com"},
		Deny:  []string{"evil.example.org", "*.bad.github.com"},
	}
	open := Policy{Mode: ModeOpen, Deny: []string{"*.tracker.com", "exact.evil.com."}}
	none := Policy{Mode: ModeNone, Allow: []string{"api.example.com"}}
	cases := []struct {
		p    Policy
		name string
		ok   bool
		why  string // substring of the reason
	}{
		{allow, "api.example.com", true, "api.example.com"},
		{allow, "API.Example.COM", true, ""},
		{allow, "api.example.com.", true, ""},
		{allow, "example.com", false, "not in allow list"},
		{allow, "x.api.example.com", false, "not in allow list"},
		{allow, "sub.example.org", true, "*.example.org"},
		{allow, "a.b.c.example.org", true, ""},
		{allow, "example.org", false, "not in allow list"},     // apex not matched by *.example.org
		{allow, "evilexample.org", false, "not in allow list"}, // look-alike
		{allow, "example.org.evil.com", false, "not in allow list"},
		{allow, "xexample.org", false, ""},
		{allow, "camelcase.example.net", true, ""},
		{allow, "evil.example.org", false, "denied by rule evil.example.org"}, // deny wins
		{allow, "EVIL.example.org.", false, "denied"},
		{allow, "x.bad.github.com", false, "denied by rule *.bad.github.com"},
		{allow, "bad.github.com", true, ""}, // deny wildcard doesn't cover its apex
		{allow, "api.example.com%00.evil.com", false, "invalid name"},
		{allow, "api.example.com\x00.evil.com", false, "invalid name"},
		{allow, "evil.com\x00api.example.com", false, "invalid name"},
		{allow, "user@api.example.com", false, "invalid name"},
		{allow, "api.example.com@evil.com", false, "invalid name"},
		{allow, "api.example.com:443", false, "invalid name"},
		{allow, "api.example.com/x", false, "invalid name"},
		{allow, "api example.com", false, "invalid name"},
		{allow, "api..example.com", false, "invalid name"},
		{allow, ".api.example.com", false, "invalid name"},
		{allow, "", false, "invalid name"},
		{allow, ".", false, "invalid name"},
		{allow, "*.example.org", false, "invalid name"},
		{allow, strings.Repeat("a", 64) + ".example.org", false, "label longer"},
		{allow, strings.Repeat("a.", 126) + "example.org", false, "longer than 253"},
		{allow, "127.0.0.1", false, "invalid name"},
		{allow, "2130706433", false, "invalid name"},
		{allow, "0x7f.1", false, "invalid name"},
		{allow, "[::1]", false, "invalid name"},
		{allow, "ex\u00e4mple.org", false, "invalid name"},
		{open, "anything.example", true, "open"},
		{open, "a.tracker.com", false, "denied"},
		{open, "tracker.com", true, ""},
		{open, "EXACT.EVIL.COM", false, "denied"},
		{open, "sub.exact.evil.com", true, ""},
		{open, "10.0.0.1", false, "invalid name"},
		{none, "api.example.com", false, "mode none"},
		{Policy{}, "api.example.com", false, "bad egress mode"},
	}
	for _, c := range cases {
		ok, why := c.p.AllowName(c.name)
		if ok != c.ok || !strings.Contains(why, c.why) {
			t.Errorf("%s AllowName(%q) = %v, %q; want %v, …%q…", c.p.Mode, c.name, ok, why, c.ok, c.why)
		}
	}
}

func TestValidate(t *testing.T) {
	good := []Policy{
		{Mode: ModeNone},
		{Mode: ModeOpen, Deny: []string{"*.evil.com", "x.com."}},
		{Mode: ModeAllow, Allow: []string{"api.example.com", "*.Example.org", "_srv.x-y.io"}, AllowCIDR: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
	}
	for _, p := range good {
		if err := p.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", p, err)
		}
	}
	bad := []struct {
		p    Policy
		want string
	}{
		{Policy{Mode: "closed"}, `bad mode "closed"`},
		{Policy{}, "bad mode"},
		{Policy{Mode: ModeAllow, Allow: []string{"a..b"}}, `allow rule "a..b": empty label`},
		{Policy{Mode: ModeAllow, Allow: []string{""}}, `allow rule "": empty name`},
		{Policy{Mode: ModeAllow, Allow: []string{"*"}}, `allow rule "*"`},
		{Policy{Mode: ModeAllow, Allow: []string{"a.*.com"}}, "only a leading"},
		{Policy{Mode: ModeAllow, Allow: []string{"*.*.com"}}, "only a leading"},
		{Policy{Mode: ModeAllow, Allow: []string{"**.com"}}, "only a leading"},
		{Policy{Mode: ModeAllow, Allow: []string{"a%2e.com"}}, `invalid character '%'`},
		{Policy{Mode: ModeAllow, Allow: []string{"u@a.com"}}, `invalid character '@'`},
		{Policy{Mode: ModeAllow, Allow: []string{"a.com/x"}}, `invalid character '/'`},
		{Policy{Mode: ModeAllow, Allow: []string{"a.com:443"}}, `invalid character ':'`},
		{Policy{Mode: ModeAllow, Allow: []string{"a\x00.com"}}, `invalid character '\x00'`},
		{Policy{Mode: ModeAllow, Allow: []string{"a .com"}}, `invalid character ' '`},
		{Policy{Mode: ModeAllow, Allow: []string{strings.Repeat("a", 64) + ".com"}}, "label longer than 63"},
		{Policy{Mode: ModeAllow, Allow: []string{strings.Repeat("ab.", 85) + "com"}}, "longer than 253"},
		{Policy{Mode: ModeAllow, Allow: []string{"10.0.0.1"}}, "all digits"},
		{Policy{Mode: ModeAllow, Allow: []string{"0x7f000001"}}, "use AllowCIDR"},
		{Policy{Mode: ModeOpen, Deny: []string{"evil..com"}}, `deny rule "evil..com"`},
		{Policy{Mode: ModeAllow, AllowCIDR: []netip.Prefix{{}}}, "allow-cidr"},
	}
	for _, c := range bad {
		err := c.p.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v; want an error with %q", c.p, err, c.want)
		}
	}
}

func TestAllowAddr(t *testing.T) {
	open := Policy{Mode: ModeOpen}
	allow := Policy{Mode: ModeAllow}
	// Every blocked range, in IPv4, IPv6 and the encodings that embed IPv4.
	blocked := []string{
		"0.0.0.0", "0.1.2.3", "10.0.0.1", "10.255.255.255", "100.64.0.1", "100.127.255.254",
		"127.0.0.1", "127.255.255.254", "169.254.0.1", "169.254.169.254", "169.254.170.2",
		"172.16.0.1", "172.31.255.255", "192.0.0.1", "192.0.0.170", "192.0.2.1", "192.88.99.1",
		"192.168.0.1", "192.168.255.255", "198.18.0.1", "198.19.255.255", "198.51.100.1",
		"203.0.113.1", "224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255",
		"168.63.129.16", "100.100.100.200",
		"::", "::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1",
		"64:ff9b::808:808", "64:ff9b::a00:1", "64:ff9b:1::1", "100::1",
		"fc00::1", "fd00::1", "fd00:ec2::254", "fe80::1", "fe80::1%eth0", "fec0::1", "ff02::1", "ff05::2",
		"2001::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001:db8::1", "2001:2::1", "2001:10::1",
		"3fff::1", "5f00::1", "4000::1", "::2",
		"2002:7f00:1::1", "2002:a00:1::", "2002:a9fe:a9fe::1", "2002:c0a8:101::1", "2002::",
	}
	for _, s := range blocked {
		a := netip.MustParseAddr(s)
		if BlockedReason(a) == "" {
			t.Errorf("BlockedReason(%s) = \"\"; want blocked", s)
		}
		for _, p := range []Policy{open, allow} {
			for _, viaName := range []bool{false, true} {
				if ok, why := p.AllowAddr(a, viaName); ok || !strings.Contains(why, "blocked") {
					t.Errorf("%s AllowAddr(%s, %v) = %v, %q; want blocked", p.Mode, s, viaName, ok, why)
				}
			}
		}
	}
	public := []string{"1.1.1.1", "8.8.8.8", "93.184.215.14", "100.63.255.255", "100.128.0.0", "172.15.255.255",
		"172.32.0.0", "192.167.255.255", "198.17.255.255", "198.20.0.0", "223.255.255.255",
		"::ffff:8.8.8.8", "2606:4700:4700::1111", "2a00:1450:4001::1", "2002:808:808::1"}
	for _, s := range public {
		a := netip.MustParseAddr(s)
		if why := BlockedReason(a); why != "" {
			t.Errorf("BlockedReason(%s) = %q; want public", s, why)
		}
		if ok, why := open.AllowAddr(a, false); !ok {
			t.Errorf("open AllowAddr(%s) = %q", s, why)
		}
		if ok, _ := allow.AllowAddr(a, true); !ok {
			t.Errorf("allow AllowAddr(%s, viaName) denied", s)
		}
		if ok, why := allow.AllowAddr(a, false); ok || !strings.Contains(why, "not in allow-cidr") {
			t.Errorf("allow AllowAddr(%s, bare) = %v, %q; want denied", s, ok, why)
		}
	}
	// Specific reasons.
	for s, want := range map[string]string{
		"169.254.169.254":  "metadata",
		"fd00:ec2::254":    "metadata",
		"::ffff:127.0.0.1": "loopback",
		"64:ff9b::7f00:1":  "NAT64",
		"2002:7f00:1::":    "6to4",
		"2001::1":          "Teredo",
		"10.1.2.3":         "private",
		"100.64.1.1":       "carrier-grade NAT",
	} {
		if why := BlockedReason(netip.MustParseAddr(s)); !strings.Contains(why, want) {
			t.Errorf("BlockedReason(%s) = %q; want …%s…", s, why, want)
		}
	}
	// CIDR exceptions: the only way into blocked ranges, in every mode but none.
	cidr := Policy{Mode: ModeAllow, AllowCIDR: []netip.Prefix{
		netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("8.8.8.0/24"),
		netip.MustParsePrefix("::ffff:192.168.7.0/120"), netip.MustParsePrefix("fd12::/16"),
		netip.MustParsePrefix("169.254.169.254/32"),
	}}
	for _, c := range []struct {
		a  string
		ok bool
	}{
		{"10.1.2.3", true}, {"::ffff:10.1.2.3", true}, {"10.2.0.1", false}, {"8.8.8.8", true}, {"8.8.4.4", false},
		{"192.168.7.9", true}, {"::ffff:192.168.7.9", true}, {"192.168.8.1", false},
		{"fd12::1", true}, {"fd13::1", false}, {"169.254.169.254", true}, {"169.254.169.253", false},
	} {
		ok, why := cidr.AllowAddr(netip.MustParseAddr(c.a), false)
		if ok != c.ok {
			t.Errorf("cidr AllowAddr(%s) = %v, %q; want %v", c.a, ok, why, c.ok)
		}
	}
	openCIDR := cidr
	openCIDR.Mode = ModeOpen
	if ok, _ := openCIDR.AllowAddr(netip.MustParseAddr("10.1.0.1"), false); !ok {
		t.Error("open mode ignores AllowCIDR")
	}
	noneCIDR := cidr
	noneCIDR.Mode = ModeNone
	if ok, why := noneCIDR.AllowAddr(netip.MustParseAddr("10.1.0.1"), false); ok || why != "egress mode none" {
		t.Errorf("mode none AllowAddr = %v, %q", ok, why)
	}
	if ok, _ := open.AllowAddr(netip.Addr{}, false); ok {
		t.Error("invalid address allowed")
	}
}

// Literal forms parsed by ParseIP and judged as addresses.
func TestAllowAddrLiteralForms(t *testing.T) {
	open := Policy{Mode: ModeOpen}
	for _, c := range []struct {
		in, want string
	}{
		{"2130706433", "127.0.0.1"},
		{"0x7f000001", "127.0.0.1"},
		{"0X7F000001", "127.0.0.1"},
		{"017700000001", "127.0.0.1"},
		{"0177.0.0.1", "127.0.0.1"},
		{"0177.0.0.01", "127.0.0.1"},
		{"0x7f.1", "127.0.0.1"},
		{"0x7f.0.0.1", "127.0.0.1"},
		{"127.1", "127.0.0.1"},
		{"127.0.1", "127.0.0.1"},
		{"127.000.000.001", "127.0.0.1"},
		{"127.0.0.1.", "127.0.0.1"},
		{"[::ffff:127.0.0.1]", "127.0.0.1"},
		{"::ffff:127.0.0.1", "127.0.0.1"},
		{"[::ffff:7f00:1]", "127.0.0.1"},
		{"[::1]", "::1"},
		{"[fe80::1%25eth0]", "fe80::1"},
		{"0xa9fea9fe", "169.254.169.254"},
		{"2852039166", "169.254.169.254"},
		{"0251.0376.0251.0376", "169.254.169.254"},
		{"169.254.43518", "169.254.169.254"},
		{"0xa9.0xfe.0xa9.0xfe", "169.254.169.254"},
		{"10.1", "10.0.0.1"},
		{"0", "0.0.0.0"},
		{"0x0", "0.0.0.0"},
		{"[64:ff9b::7f00:1]", "64:ff9b::7f00:1"},
		{"[2002:7f00:1::1]", "2002:7f00:1::1"},
	} {
		a, ok := ParseIP(c.in)
		if !ok || a != netip.MustParseAddr(c.want).WithZone("") {
			t.Errorf("ParseIP(%q) = %v, %v; want %s", c.in, a, ok, c.want)
			continue
		}
		if ok, why := open.AllowAddr(a, false); ok {
			t.Errorf("open AllowAddr(ParseIP(%q)) allowed; want blocked", c.in)
		} else if !strings.Contains(why, "blocked") {
			t.Errorf("open AllowAddr(ParseIP(%q)) = %q", c.in, why)
		}
	}
	for _, s := range []string{"8.8.8.8", "134744072", "0x08080808", "010.010.010.010"} {
		a, ok := ParseIP(s)
		if !ok || a != netip.MustParseAddr("8.8.8.8") {
			t.Errorf("ParseIP(%q) = %v, %v; want 8.8.8.8", s, a, ok)
		}
	}
	for _, s := range []string{"", ".", "..", "..1", "1..1", "1.2.3.4.5", "256.1.1.1", "1.256.1.1", "1.2.65536",
		"1.16777216", "4294967296", "0x100000000", "08", "09.1.1.1", "0x", "0xg", "1.2.3.4 ", " 1.2.3.4",
		"1.2.3.4x", "a.b.c.d", "example.com", "::ffff:127.1", "[127.0.0.1]", "[::1", "::1]", "1:2", "-1",
		"+1", "1e3", "0b1", "0o17", "1_000", "１２７.0.0.1"} {
		if a, ok := ParseIP(s); ok {
			t.Errorf("ParseIP(%q) = %v; want not an address", s, a)
		}
	}
}
