package egress

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// Each producer of a denial reason maps to its rule: a reworded reason
// that no longer matches the table fails here.
func TestRule(t *testing.T) {
	s := New(Config{Deny: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")}})
	defer s.Close()
	allow := Policy{Mode: ModeAllow, Allow: []string{"ok.example.com"}, Deny: []string{"bad.example.com"}}
	_, nameNot := allow.AllowName("other.example.com")
	_, denied := allow.AllowName("bad.example.com")
	_, invalid := allow.AllowName("a..b")
	_, none := Policy{Mode: ModeNone}.AllowName("x.example.com")
	_, private := s.judgeAddr(allow, netip.MustParseAddr("10.0.0.1"), false)
	_, cidr := s.judgeAddr(allow, netip.MustParseAddr("203.0.114.1"), false)
	_, host := s.judgeAddr(allow, netip.MustParseAddr("10.99.0.1"), false)
	_, loop := s.judgeAddr(allow, netip.MustParseAddr("127.0.0.1"), false)
	_, _, badTarget := splitTargetReason("user@x:1")
	lim := newLimiter(1, 0)
	lim.acquire("a", 0)
	_, connLimit := lim.acquire("a", 0)
	for _, c := range []struct{ reason, rule string }{
		{nameNot, RuleNameNotAllowed},
		{denied, RuleNameDenied},
		{invalid, RuleInvalidName},
		{"invalid host \"x\": bad", RuleInvalidName},
		{none, RuleModeNone},
		{private, RuleAddrNotPublic},
		{"no name: " + private, RuleAddrNotPublic},
		{"no name (address \"10.0.0.1\" in SNI/Host): " + private, RuleAddrNotPublic},
		{cidr, RuleAddrNotAllowed},
		{"no name: " + cidr, RuleAddrNotAllowed},
		{host, RuleAddrHost},
		{loop, RuleAddrHost},
		{"destination 10.1.1.1:80 is the host (the proxy itself, the bridge or a host address)", RuleAddrHost},
		{"address 10.1.0.2 belongs to sandbox abc", RuleAddrSandbox},
		{"resolves to a private address (" + private + ")", RuleNameNotPublic},
		{"resolve x.example.com: no such host", RuleNameUnresolved},
		{"no address for x.example.com", RuleNameUnresolved},
		{byteLimitReason(100), RuleByteLimit},
		{connLimit, RuleConnLimit},
		{"rate limit", RuleRateLimit},
		{badTarget, RuleBadTarget},
		{"unknown source 10.0.0.9", RuleUnknownSource},
		{"malformed request: EOF", RuleBadRequest},
		{"query type TXT refused", RuleQueryRefused},
		{"cannot intercept TLS for Authorization: no CA", RuleInterceptFailed},
		{"client closed before sending a request", RuleClientClosed},
		{"original destination: none", RuleNoDestination},
		{"upstream: dial tcp: refused", RuleUpstream},
		{"something den never says", RuleDenied},
	} {
		if got := Rule(c.reason); got != c.rule {
			t.Errorf("Rule(%q) = %q; want %q", c.reason, got, c.rule)
		}
	}
}

// splitTargetReason is the proxies' reason for a bad target.
func splitTargetReason(target string) (string, int, string) {
	h, p, err := splitTarget(target, 0)
	if err != nil {
		return h, p, "bad CONNECT target " + quoteShort(target) + ": " + err.Error()
	}
	return h, p, ""
}

// The net log's JSON uses the API's snake_case keys.
func TestEventJSON(t *testing.T) {
	b, err := json.Marshal(Event{Time: time.Unix(0, 0).UTC(), Sandbox: "s", Kind: KindConnect, BytesOut: 1, BytesIn: 2,
		SrcPort: 3, ProcessUnknown: "gone", Verdict: VerdictDeny, Rule: RuleNameNotAllowed, QType: "A"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"bytes_out":1`, `"bytes_in":2`, `"src_port":3`, `"process_unknown":"gone"`, `"verdict":"deny"`,
		`"rule":"name not in allow list"`, `"qtype":"A"`, `"sandbox":"s"`, `"kind":"connect"`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("event JSON %s lacks %s", b, k)
		}
	}
	if strings.Contains(string(b), "sync") {
		t.Errorf("event JSON %s has the Sync marker", b)
	}
}

// Sync returns once every event emitted before it has reached Log.
func TestSync(t *testing.T) {
	release := make(chan struct{})
	var got []string
	s := New(Config{Log: func(e Event) {
		<-release
		got = append(got, e.Name)
	}})
	released := false
	defer func() {
		if !released {
			close(release) // let Close flush the queue
		}
		s.Close()
	}()
	s.emit(Event{Name: "a"})
	s.emit(Event{Name: "b"})
	done := make(chan struct{})
	go func() {
		s.Sync(time.Minute)
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("Sync returned before the events reached Log")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	released = true
	<-done
	if len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("Log saw %v when Sync returned; want [a b]", got)
	}
}
