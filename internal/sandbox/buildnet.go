package sandbox

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strings"

	"github.com/den-dev/den/api"
)

// checkBuildNetwork checks a build's network: a mode (none when unset),
// allow names and CIDRs only with allow, nothing else of a sandbox's
// policy; then as a new sandbox's policy is checked (checkNetwork).
func (m *Manager) checkBuildNetwork(ctx context.Context, p *api.NetworkPolicy) error {
	if p.Mode == "" {
		p.Mode = api.NetNone
	}
	switch p.Mode {
	case api.NetNone, api.NetAllow, api.NetOpen:
	default:
		return api.FieldError("network", "%q is not a network mode: want %s, %s or %s", p.Mode, api.NetNone, api.NetAllow, api.NetOpen)
	}
	lists := len(p.Allow) > 0 || len(p.AllowCIDR) > 0
	switch {
	case p.Mode == api.NetNone && lists:
		return api.FieldError("network", "allow and allow-cidr need network=allow: a build without network reaches nothing")
	case p.Mode == api.NetAllow && !lists:
		return api.FieldError("network", "network=allow needs at least one allow name or allow-cidr range (network=open allows every public address)")
	case p.Mode == api.NetOpen && len(p.Allow) > 0:
		return api.FieldError("allow", "allow names do not go with network=open, which allows every public domain")
	case len(p.Deny) > 0 || len(p.SecretHeaders) > 0 || p.ConnRate != 0 || p.MaxEgress != 0 || p.Bandwidth != 0:
		return api.FieldError("network", "a build's network takes a mode, allow names and allow-cidr ranges only")
	}
	return m.checkNetwork(ctx, ScopeFrom(ctx).owner(), *p)
}

// stepTail keeps the last bytes a RUN step printed, to recognise a
// failed name lookup in them.
type stepTail struct {
	buf []byte
}

const maxStepTail = 16 << 10

func (t *stepTail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > maxStepTail {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-maxStepTail:]...)
	}
	return len(p), nil
}

// lookupFailures are what common tools print when a name does not
// resolve: curl, busybox and GNU wget, apt, glibc's resolver (Python,
// git...), musl, Go, Node; and a connect that found no network. A group,
// where there is one, is the name.
var lookupFailures = []*regexp.Regexp{
	regexp.MustCompile(`Could not resolve host: ([^\s'"]+)`),
	regexp.MustCompile(`bad address '([^']+)'`),
	regexp.MustCompile(`Temporary failure resolving '([^']+)'`),
	regexp.MustCompile(`Could not resolve '([^']+)'`),
	regexp.MustCompile(`unable to resolve host address '([^']+)'`),
	regexp.MustCompile(`can't resolve '([^']+)'`),
	regexp.MustCompile(`getaddrinfo E(?:NOTFOUND|AI_AGAIN) ([^\s'"]+)`),
	regexp.MustCompile(`lookup ([^\s'"]+)(?: on \S+)?: (?:no such host|server misbehaving|.*connection refused)`),
	regexp.MustCompile(`Temporary failure in name resolution`),
	regexp.MustCompile(`Name or service not known`),
	regexp.MustCompile(`no servers could be reached`),
	regexp.MustCompile(`nslookup: can't connect to remote host`),
	regexp.MustCompile(`Network is unreachable`),
	regexp.MustCompile(`Unable to locate package`),
}

// lookupFailed reports whether out shows a failed name lookup, and the
// names it names (at most a few, in order).
func lookupFailed(out string) (bool, []string) {
	failed := false
	var names []string
	seen := map[string]bool{}
	for _, re := range lookupFailures {
		for _, m := range re.FindAllStringSubmatch(out, -1) {
			failed = true
			if len(m) < 2 {
				continue
			}
			n := strings.TrimSuffix(strings.Trim(m[1], "'\"`.,:;()[]"), ".")
			if n == "" || seen[n] || len(names) == 5 {
				continue
			}
			seen[n] = true
			names = append(names, n)
		}
	}
	return failed, names
}

// buildNetworkHint is what a failed RUN step's error adds about the
// network: with none, when its output shows a failed name lookup, that
// the build has no network and how to grant it; with a policy, the
// connections den refused and how to allow them. "" when neither.
func buildNetworkHint(mode, output string, denied []api.DeniedConn) string {
	if mode == "" || mode == api.NetNone {
		failed, names := lookupFailed(output)
		if !failed {
			return ""
		}
		grant := "--allow NAME"
		tried := ""
		if len(names) > 0 {
			grant = "--allow " + strings.Join(names, " --allow ")
			tried = " (it looked up " + strings.Join(names, ", ") + ")"
		}
		return fmt.Sprintf("the build has no network%s: RUN steps run without it unless asked; grant it with den image build --network allow %s (or --network open), ?network=allow&allow=NAME in the API", tried, grant)
	}
	if len(denied) == 0 {
		return ""
	}
	var refused, flags []string
	seen := map[string]bool{}
	for _, d := range denied {
		what := d.Host
		if d.Proto == "dns" {
			what += " (a DNS lookup)"
		}
		refused = append(refused, what+": "+d.Rule)
		flag := "--allow " + d.Host
		if _, err := netip.ParseAddr(d.Host); err == nil {
			flag = "--allow-cidr " + d.Host
		}
		if !seen[flag] {
			seen[flag] = true
			flags = append(flags, flag)
		}
	}
	return fmt.Sprintf("the build's network (%s) refused %s; if the step needs them, add %s to den image build", mode, strings.Join(refused, "; "), strings.Join(flags, " "))
}
