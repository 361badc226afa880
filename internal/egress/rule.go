package egress

import "strings"

// Rules: the short, stable names of why den's egress refused something.
// A refusal's HTTP status line reads "den egress: <rule>" (the body has the
// whole reason), a denied Event carries its rule in Event.Rule, and den exec
// groups the denials of a command by it.
const (
	RuleUnknownSource   = "unknown source"
	RuleModeNone        = "egress mode none"
	RuleNameDenied      = "name denied by rule"
	RuleNameNotAllowed  = "name not in allow list"
	RuleInvalidName     = "invalid name"
	RuleNameNotPublic   = "name resolves to no public address"
	RuleNameUnresolved  = "name does not resolve"
	RuleAddrHost        = "address is the host"
	RuleAddrSandbox     = "address is another sandbox"
	RuleAddrNotPublic   = "address not public"
	RuleAddrNotAllowed  = "address not in allow-cidr"
	RuleBadTarget       = "bad target"
	RuleBadRequest      = "bad proxy request"
	RuleMisdirected     = "request for another host"
	RuleQueryRefused    = "query refused"
	RuleByteLimit       = "egress byte limit"
	RuleConnLimit       = "connection limit"
	RuleRateLimit       = "rate limit"
	RuleInterceptFailed = "TLS interception failed"
	RuleClientClosed    = "client closed early"
	RuleNoDestination   = "original destination unknown"
	RuleUpstream        = "upstream error"
	RuleUpgrade         = "upgrade not proxied"
	RuleDenied          = "denied"
)

// ruleTable maps the start of a reason (or, for the address rules, which
// may follow a prefix like "no name: ", a part of it) to its rule, first
// match winning. The reasons are den's own (policy.go, egress.go,
// limits.go, the proxies); TestRule pins each producer to its rule.
var ruleTable = []struct {
	text     string
	rule     string
	anywhere bool
}{
	{text: "unknown source", rule: RuleUnknownSource},
	{text: "egress mode none", rule: RuleModeNone},
	{text: "bad egress mode", rule: RuleModeNone},
	{text: "denied by rule ", rule: RuleNameDenied},
	{text: "name not in allow list", rule: RuleNameNotAllowed},
	{text: "invalid name", rule: RuleInvalidName},
	{text: "invalid host", rule: RuleInvalidName},
	{text: "name longer than", rule: RuleInvalidName},
	{text: "resolves to a private address", rule: RuleNameNotPublic},
	{text: "resolve ", rule: RuleNameUnresolved},
	{text: "no address for ", rule: RuleNameUnresolved},
	{text: "egress byte limit reached", rule: RuleByteLimit},
	{text: "too many connections", rule: RuleConnLimit},
	{text: "rate limit", rule: RuleRateLimit},
	{text: "bad CONNECT target", rule: RuleBadTarget},
	{text: "bad request target", rule: RuleBadTarget},
	{text: "empty host", rule: RuleBadTarget},
	{text: "malformed request", rule: RuleBadRequest},
	{text: "not a proxy request", rule: RuleBadRequest},
	{text: "scheme ", rule: RuleBadRequest},
	{text: "request for host ", rule: RuleMisdirected},
	{text: "not a single standard query", rule: RuleQueryRefused},
	{text: "query class ", rule: RuleQueryRefused},
	{text: "query type ", rule: RuleQueryRefused},
	{text: "cannot intercept TLS", rule: RuleInterceptFailed},
	{text: "client closed before", rule: RuleClientClosed},
	{text: "upstream switched protocols", rule: RuleUpgrade},
	{text: "protocol upgrades are not proxied", rule: RuleUpgrade},
	{text: "upstream: ", rule: RuleUpstream},
	{text: "original destination", rule: RuleNoDestination},
	// Address verdicts, possibly behind "no name (…): " or "destination".
	{anywhere: true, text: "is the host", rule: RuleAddrHost},
	{anywhere: true, text: "belongs to the host", rule: RuleAddrHost},
	{anywhere: true, text: ", on the host", rule: RuleAddrHost},
	{anywhere: true, text: "belongs to sandbox ", rule: RuleAddrSandbox},
	{anywhere: true, text: "blocked address ", rule: RuleAddrNotPublic},
	{anywhere: true, text: " not in allow-cidr", rule: RuleAddrNotAllowed},
	{anywhere: true, text: "egress mode none", rule: RuleModeNone},
	{anywhere: true, text: "invalid address", rule: RuleAddrNotPublic},
}

// Rule is the short, stable name (one of the Rule constants) of a denial's
// reason, as den's egress words it; RuleDenied for a reason it does not
// know.
func Rule(reason string) string {
	for _, r := range ruleTable {
		if !r.anywhere && strings.HasPrefix(reason, r.text) {
			return r.rule
		}
	}
	for _, r := range ruleTable {
		if r.anywhere && strings.Contains(reason, r.text) {
			return r.rule
		}
	}
	return RuleDenied
}
