package egress

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strings"
)

// Mode is a sandbox's egress mode.
type Mode string

// The egress modes.
const (
	ModeNone  Mode = "none"  // nothing leaves the sandbox; DNS is refused
	ModeAllow Mode = "allow" // only allowed names, and addresses in AllowCIDR
	ModeOpen  Mode = "open"  // every public address and every name not denied
)

// Policy is a sandbox's egress policy.
type Policy struct {
	Mode Mode
	// Allow lists the names reachable in mode allow: exact ("api.example.com")
	// or wildcard ("*.example.com": subdomains only, not the apex). Matching is
	// case-insensitive and ignores a trailing dot.
	Allow []string
	// Deny lists names never reachable, in any mode; same syntax as Allow.
	// Deny wins over Allow.
	Deny []string
	// AllowCIDR lists addresses reachable without a name, and is the only way
	// to reach the blocked ranges (private, loopback, link-local, metadata…).
	AllowCIDR []netip.Prefix
	// ConnRate bounds this sandbox's new connections per second (token
	// bucket, burst max(1, ConnRate)); when > 0 it overrides
	// Config.ConnRate, 0 = Config.ConnRate applies.
	ConnRate float64
	// MaxEgressBytes bounds the bytes (sandbox → upstream, in total) the
	// Server relays for this sandbox over its life (see
	// Server.EgressBytes); 0 = unlimited. Once reached, new connections
	// are denied ("egress byte limit reached (N bytes)") and connections
	// in progress are cut at the limit.
	MaxEgressBytes int64
	// Secrets are headers set on the sandbox's HTTPS requests to a host by
	// intercepting its TLS connections (see SecretHeader), so the secret
	// values never enter the sandbox.
	Secrets []SecretHeader
}

// SecretHeader is a header the proxy sets on every HTTP request a sandbox
// sends over TLS to Host, replacing any copy of it the sandbox sent. The
// proxy terminates the sandbox's TLS connection to Host with a certificate
// from the sandbox's own CA (Config.CA) and forwards each request to Host's
// checked address over verified TLS. Plain-HTTP requests to Host are
// relayed unchanged, without the secret. The proxy also replaces the value
// with "[den: secret]" in the response headers and status line of
// intercepted requests (a best effort: a response body, or an encoded
// form, that echoes the value reaches the sandbox).
//
// String and GoString hide the value, so printing a Policy with fmt does
// not disclose it.
type SecretHeader struct {
	// Host is the exact host name (no wildcard; case-insensitive, a
	// trailing dot ignored) whose requests get the header.
	Host string
	// Header is the header's name, used in canonical form
	// ("authorization" → "Authorization"): token characters only, and
	// not one that frames or routes the message (Host, Content-Length,
	// Transfer-Encoding, Connection and the other hop-by-hop headers).
	Header string
	// Value is the secret.
	Value string
}

// String describes h without its value.
func (h SecretHeader) String() string {
	return "secret header " + h.Header + " for " + h.Host + " (value hidden)"
}

// GoString describes h without its value.
func (h SecretHeader) GoString() string {
	return fmt.Sprintf("egress.SecretHeader{Host:%q, Header:%q, Value:\"[hidden]\"}", h.Host, h.Header)
}

// Validate reports the first bad mode, rule or prefix of p.
func (p Policy) Validate() error {
	switch p.Mode {
	case ModeNone, ModeAllow, ModeOpen:
	default:
		return fmt.Errorf("egress policy: bad mode %q: want %q, %q or %q", string(p.Mode), ModeNone, ModeAllow, ModeOpen)
	}
	for _, r := range p.Allow {
		if err := validateRule(r); err != nil {
			return fmt.Errorf("egress policy: allow rule %q: %w", r, err)
		}
	}
	for _, r := range p.Deny {
		if err := validateRule(r); err != nil {
			return fmt.Errorf("egress policy: deny rule %q: %w", r, err)
		}
	}
	for _, c := range p.AllowCIDR {
		if !c.IsValid() {
			return fmt.Errorf("egress policy: allow-cidr %q: not a valid prefix", c.String())
		}
		if c.Addr().Zone() != "" {
			return fmt.Errorf("egress policy: allow-cidr %q: zones are not allowed", c.String())
		}
	}
	if p.ConnRate < 0 || math.IsNaN(p.ConnRate) || math.IsInf(p.ConnRate, 0) {
		return fmt.Errorf("egress policy: connection rate %v: want a finite number ≥ 0", p.ConnRate)
	}
	if p.MaxEgressBytes < 0 {
		return fmt.Errorf("egress policy: max egress bytes %d: want ≥ 0", p.MaxEgressBytes)
	}
	seen := map[[2]string]bool{}
	for _, h := range p.Secrets {
		// Never put the value in an error.
		if err := validateSecretHost(h.Host); err != nil {
			return fmt.Errorf("egress policy: secret header %q for %q: host: %w", h.Header, h.Host, err)
		}
		if err := validateSecretHeader(h.Header); err != nil {
			return fmt.Errorf("egress policy: secret header %q for %q: %w", h.Header, h.Host, err)
		}
		if h.Value == "" {
			return fmt.Errorf("egress policy: secret header %q for %q: empty value", h.Header, h.Host)
		}
		for i := 0; i < len(h.Value); i++ {
			if c := h.Value[i]; c < 0x20 && c != '\t' || c == 0x7f {
				return fmt.Errorf("egress policy: secret header %q for %q: control character in the value", h.Header, h.Host)
			}
		}
		k := [2]string{strings.ToLower(strings.TrimSuffix(h.Host, ".")), http.CanonicalHeaderKey(h.Header)}
		if seen[k] {
			return fmt.Errorf("egress policy: secret header %q for %q given twice", h.Header, h.Host)
		}
		seen[k] = true
	}
	return nil
}

// validateSecretHost checks a SecretHeader's Host: an exact name.
func validateSecretHost(h string) error {
	if strings.HasPrefix(h, "*") {
		return errors.New("a wildcard: secret headers need an exact name")
	}
	return validateRule(h)
}

// secretForbidden are the headers a SecretHeader may not set: they frame
// or route the message, or are hop-by-hop (and removed in transit).
var secretForbidden = append([]string{"Host", "Content-Length"}, hopHeaders...)

// validateSecretHeader checks a SecretHeader's Header name.
func validateSecretHeader(name string) error {
	if name == "" {
		return errors.New("empty header name")
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			return fmt.Errorf("invalid character %q in the header name", name[i])
		}
	}
	for _, f := range secretForbidden {
		if strings.EqualFold(name, f) {
			return fmt.Errorf("header %s cannot be a secret header", f)
		}
	}
	return nil
}

// isTokenChar reports whether c is a tchar of RFC 9110.
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// secretsFor returns the secret headers for the normalized name, with
// canonical header names.
func (p Policy) secretsFor(name string) []SecretHeader {
	var out []SecretHeader
	for _, h := range p.Secrets {
		if h.Value != "" && strings.EqualFold(strings.TrimSuffix(h.Host, "."), name) {
			h.Header = http.CanonicalHeaderKey(h.Header)
			out = append(out, h)
		}
	}
	return out
}

// validateRule checks the syntax of one Allow or Deny entry.
func validateRule(r string) error {
	name := strings.TrimSuffix(r, ".")
	if strings.HasPrefix(name, "*.") {
		name = name[2:]
	}
	if err := checkName(name); err != nil {
		return err
	}
	if _, ok := ParseIP(name); ok {
		return errors.New("an address, not a name: use AllowCIDR")
	}
	return nil
}

// checkName checks that name (no trailing dot) is a syntactically valid DNS
// host name: labels of 1-63 letters, digits, '-' or '_', at most 253
// characters, and a last label that is not all digits.
func checkName(name string) error {
	if name == "" {
		return errors.New("empty name")
	}
	if len(name) > 253 {
		return fmt.Errorf("name longer than 253 characters (%d)", len(name))
	}
	label := 0
	digits := true
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '.':
			if label == 0 {
				return fmt.Errorf("empty label at position %d", i)
			}
			label = 0
			digits = true
			continue
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-', c == '_':
			digits = false
		case c >= '0' && c <= '9':
		case c == '*':
			return fmt.Errorf("'*' at position %d: only a leading \"*.\" is allowed", i)
		default:
			return fmt.Errorf("invalid character %q at position %d", c, i)
		}
		label++
		if label > 63 {
			return fmt.Errorf("label longer than 63 characters at position %d", i-63)
		}
	}
	if label == 0 {
		return errors.New("empty last label")
	}
	if digits {
		return errors.New("last label is all digits (an address, not a name)")
	}
	return nil
}

// NormalizeName lower-cases name, removes one trailing dot and checks its
// syntax (see Validate). IP literals in any form are not names.
func NormalizeName(name string) (string, error) {
	n := strings.TrimSuffix(name, ".")
	if err := checkName(n); err != nil {
		return "", err
	}
	if _, ok := ParseIP(n); ok {
		return "", errors.New("an IP literal, not a name")
	}
	return strings.ToLower(n), nil
}

// matchRule reports whether the normalized name matches rule.
func matchRule(rule, name string) bool {
	rule = strings.TrimSuffix(rule, ".")
	if strings.HasPrefix(rule, "*.") {
		suffix := rule[1:] // ".example.com"
		return len(name) > len(suffix) && strings.EqualFold(name[len(name)-len(suffix):], suffix)
	}
	return strings.EqualFold(rule, name)
}

// AllowName applies the name part of the policy: mode none denies every
// name, a Deny match denies, mode open allows the rest, and mode allow
// allows only names matching an Allow rule. Malformed names and IP literals
// are denied.
func (p Policy) AllowName(name string) (ok bool, reason string) {
	n, err := NormalizeName(name)
	if err != nil {
		return false, "invalid name: " + err.Error()
	}
	if p.Mode != ModeAllow && p.Mode != ModeOpen {
		return false, modeReason(p.Mode)
	}
	for _, r := range p.Deny {
		if matchRule(r, n) {
			return false, "denied by rule " + r
		}
	}
	if p.Mode == ModeOpen {
		return true, "egress mode open"
	}
	for _, r := range p.Allow {
		if matchRule(r, n) {
			return true, "allowed by rule " + r
		}
	}
	return false, "name not in allow list"
}

// AllowAddr applies the address part of the policy to a, which was reached
// through an allowed name when viaName is true. Mode none denies everything.
// An address in AllowCIDR is allowed; otherwise an address in a blocked range
// (see BlockedReason) is denied. What remains is public: allowed in mode
// open, and in mode allow only when reached through an allowed name.
func (p Policy) AllowAddr(a netip.Addr, viaName bool) (ok bool, reason string) {
	return allowAddr(p, a, viaName, nil)
}

func allowAddr(p Policy, a netip.Addr, viaName bool, public []netip.Prefix) (bool, string) {
	if !a.IsValid() {
		return false, "invalid address"
	}
	a = normAddr(a)
	if p.Mode != ModeAllow && p.Mode != ModeOpen {
		return false, modeReason(p.Mode)
	}
	for _, c := range p.AllowCIDR {
		if prefixContains(c, a) {
			return true, "allowed by cidr " + c.String()
		}
	}
	if why := BlockedReason(a); why != "" && !inPrefixes(public, a) {
		return false, "blocked address " + a.String() + ": " + why
	}
	if p.Mode == ModeOpen {
		return true, "egress mode open"
	}
	if viaName {
		return true, "reached through an allowed name"
	}
	return false, "address " + a.String() + " not in allow-cidr"
}

// modeReason explains why mode m lets nothing out.
func modeReason(m Mode) string {
	if m == ModeNone {
		return "egress mode none"
	}
	return fmt.Sprintf("bad egress mode %q", string(m))
}

// normAddr drops a zone and unmaps IPv4-mapped IPv6 addresses.
func normAddr(a netip.Addr) netip.Addr {
	return a.WithZone("").Unmap()
}

// prefixContains reports whether c contains a (already normalized),
// treating an IPv4-mapped prefix (::ffff:10.0.0.0/104) as its IPv4 form.
func prefixContains(c netip.Prefix, a netip.Addr) bool {
	if !c.IsValid() {
		return false
	}
	pa := c.Addr().WithZone("")
	bits := c.Bits()
	if pa.Is4In6() && bits >= 96 {
		pa, bits = pa.Unmap(), bits-96
	}
	return netip.PrefixFrom(pa, bits).Masked().Contains(a)
}

func inPrefixes(ps []netip.Prefix, a netip.Addr) bool {
	for _, c := range ps {
		if prefixContains(c, a) {
			return true
		}
	}
	return false
}

type blockedRange struct {
	p   netip.Prefix
	why string
}

func br(s, why string) blockedRange { return blockedRange{netip.MustParsePrefix(s), why} }

// Ordered: the more specific first, so the reason names them.
var blocked4 = []blockedRange{
	br("169.254.169.254/32", "cloud metadata service"),
	br("168.63.129.16/32", "cloud metadata service (Azure wireserver)"),
	br("100.100.100.200/32", "cloud metadata service (Alibaba)"),
	br("0.0.0.0/32", "unspecified address"),
	br("255.255.255.255/32", "broadcast"),
	br("0.0.0.0/8", "\"this network\" 0.0.0.0/8"),
	br("10.0.0.0/8", "private 10.0.0.0/8"),
	br("100.64.0.0/10", "carrier-grade NAT 100.64.0.0/10"),
	br("127.0.0.0/8", "loopback 127.0.0.0/8"),
	br("169.254.0.0/16", "link-local 169.254.0.0/16"),
	br("172.16.0.0/12", "private 172.16.0.0/12"),
	br("192.0.0.0/24", "IETF protocol assignments 192.0.0.0/24"),
	br("192.0.2.0/24", "documentation 192.0.2.0/24"),
	br("192.88.99.0/24", "6to4 relay anycast 192.88.99.0/24"),
	br("192.168.0.0/16", "private 192.168.0.0/16"),
	br("198.18.0.0/15", "benchmarking 198.18.0.0/15"),
	br("198.51.100.0/24", "documentation 198.51.100.0/24"),
	br("203.0.113.0/24", "documentation 203.0.113.0/24"),
	br("224.0.0.0/4", "multicast 224.0.0.0/4"),
	br("240.0.0.0/4", "reserved 240.0.0.0/4"),
}

var blocked6 = []blockedRange{
	br("fd00:ec2::254/128", "cloud metadata service"),
	br("::/128", "unspecified address"),
	br("::1/128", "loopback ::1"),
	br("::/96", "IPv4-compatible ::/96"),
	br("64:ff9b::/96", "NAT64 64:ff9b::/96"),
	br("64:ff9b:1::/48", "NAT64 64:ff9b:1::/48"),
	br("100::/64", "discard-only 100::/64"),
	br("fc00::/7", "unique local fc00::/7"),
	br("fe80::/10", "link-local fe80::/10"),
	br("fec0::/10", "site-local fec0::/10"),
	br("ff00::/8", "multicast ff00::/8"),
	br("2001::/32", "Teredo 2001::/32"),
	br("2001:db8::/32", "documentation 2001:db8::/32"),
	br("2001::/23", "IETF protocol assignments 2001::/23"),
	br("3fff::/20", "documentation 3fff::/20"),
	br("5f00::/16", "SRv6 SIDs 5f00::/16"),
}

var (
	globalUnicast = netip.MustParsePrefix("2000::/3")
	sixToFour     = netip.MustParsePrefix("2002::/16")
)

// BlockedReason says why a is in a range no sandbox reaches without an
// AllowCIDR rule (private, loopback, link-local, CGNAT, multicast, reserved,
// documentation, benchmarking, unspecified, broadcast, NAT64, Teredo, unique
// local, non-global IPv6, cloud metadata), or "" when a is public.
// IPv4-mapped addresses are judged as IPv4 and 6to4 addresses by the IPv4
// address they embed.
func BlockedReason(a netip.Addr) string {
	if !a.IsValid() {
		return "invalid address"
	}
	a = normAddr(a)
	if a.Is4() {
		for _, r := range blocked4 {
			if r.p.Contains(a) {
				return r.why
			}
		}
		return ""
	}
	for _, r := range blocked6 {
		if r.p.Contains(a) {
			return r.why
		}
	}
	if !globalUnicast.Contains(a) {
		return "non-global IPv6 (outside 2000::/3)"
	}
	if sixToFour.Contains(a) {
		b := a.As16()
		v4 := netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})
		if why := BlockedReason(v4); why != "" {
			return "6to4 address embedding " + v4.String() + ": " + why
		}
	}
	return ""
}
