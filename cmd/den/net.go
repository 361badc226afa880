package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/egress"
)

var verbNet = &verb{
	name:     "net",
	summary:  "manage a sandbox's network: set, show, log",
	synopsis: "COMMAND [flags] [ARG...]",
	example: `den net set --allow pypi.org --allow '*.pythonhosted.org' web
		den net set --allow api.example.com --secret-header 'api.example.com=Authorization: Bearer ${TOKEN}' web
		den net show web
		den net log -f web`,
	run:   cmdGroup,
	group: true,
}

var verbNetSet = &verb{
	name:     "net set",
	summary:  "replace a sandbox's egress policy",
	synopsis: "[flags] ID",
	details: `The new policy replaces the current one as a whole (den net show prints
it) and is in force at once, also for a running sandbox. --net none cuts the
sandbox off (loopback only); --net allow lets it reach only the --allow
domains and --allow-cidr ranges; --net open lets it reach any public address.
--deny domains are refused in every mode. --allow or --allow-cidr without
--net means --net allow. Private, loopback and metadata addresses stay
refused unless an --allow-cidr names them. Prints the sandbox's mode and,
when networked, its address.

` + netFlagsDetails,
	example: `den net set --allow github.com --allow '*.githubusercontent.com' web
		den net set --net open --deny example.com --conn-rate 20 --max-egress 1g --bandwidth 2m web
		den net set --allow api.example.com --secret-header 'api.example.com=Authorization: Bearer ${TOKEN}' web
		den net set --net none web`,
	run: cmdNetSet,
}

var verbNetShow = &verb{
	name:     "net show",
	summary:  "print a sandbox's egress policy and address",
	synopsis: "[flags] ID",
	details: `Prints the sandbox's mode, address, allowed and denied domains and ranges,
its limits (connections per second, bytes out over its life, bandwidth) and
its secret headers as HOST=Header: value. A header's value is printed as
stored: the ${NAME} references, not the secrets they name.`,
	example: `den net show web`,
	run:     cmdNetShow,
}

var verbNetLog = &verb{
	name:     "net log",
	summary:  "print a sandbox's DNS queries and connections",
	synopsis: "[flags] ID",
	details: `Prints the sandbox's network events (type net.dns and net.connect), oldest
first: when, what (dns or connect), the name queried or connected to (TLS SNI
or HTTP Host), the address and port (for DNS the answers), allow or deny,
the bytes sent and received, the process that made it (like p12 (curl ...)
for a command den started, pid 7 (wget) for another process; --json has its
whole command line), and why. When den cannot tell the process (it closed
its socket or exited before den looked, or den's lookups are rationed), the
PROCESS column shows ? and the reason says why (process_unknown in --json); a
denial's --json has its short rule too (rule, like "name not in allow list").
With -f den
then waits for new events and prints each as it comes, until Ctrl-C or, with
--limit N, N events; without --since it prints only new events. With --json
the events are printed as a JSON array (with -f, one JSON object a line).`,
	example: `den net log web
		den net log -f web
		den net log --since 10m --json web | jq '.[].data | select(.verdict == "deny")'`,
	run: cmdNetLog,
}

// netOpts are the flags that describe an egress policy (den run, den
// create, den net set).
type netOpts struct {
	mode                   string
	allow, deny, allowCIDR []string
	secretHeaders          []api.SecretHeader
	connRate               float64
	maxEgress, bandwidth   api.Size
	modeFlag               string // the mode flag's name in errors: --net unless set
	fixed                  bool   // the policy cannot be changed later (a build's): allow needs a list
}

func (o *netOpts) define(f *flagSet) {
	f.Var(modeValue{&o.mode}, "net", "", "MODE", "network: none (loopback only, the default), allow (only the --allow domains and --allow-cidr ranges) or open (any public address)")
	f.Var(listValue{&o.allow, checkDomain}, "allow", "", "DOMAIN", "allow a domain: example.com, or *.example.com for its subdomains (repeatable; implies --net allow)")
	f.Var(listValue{&o.deny, checkDomain}, "deny", "", "DOMAIN", "refuse a domain in every mode (repeatable)")
	f.Var(listValue{&o.allowCIDR, checkCIDR}, "allow-cidr", "", "CIDR", "allow an address range like 203.0.113.0/24, or an address, even a private one (repeatable; implies --net allow)")
	f.Var(secretHeaderValue{&o.secretHeaders}, "secret-header", "", "HOST=HEADER:VALUE",
		"have den's proxy, outside the sandbox, set a header on HTTPS requests to HOST, like 'api.example.com=Authorization: Bearer ${TOKEN}'; ${NAME} is the secret NAME of den secret set. Single-quote it so your shell leaves ${NAME} alone (repeatable)")
	f.Var(floatValue{&o.connRate}, "conn-rate", "", "N", "limit new connections to N per second, like 10 or 0.5")
	f.Var(sizeValue{&o.maxEgress}, "max-egress", "", "SIZE", "limit the bytes the sandbox sends out over its life, like 1g (then its connections are refused)")
	f.Var(sizeValue{&o.bandwidth}, "bandwidth", "", "SIZE", "limit bandwidth to SIZE bytes per second each way, like 1m (at least 8k)")
}

// netFlagsDetails describes the limit and secret header flags, for the
// help of den net set, den run and den create.
const netFlagsDetails = `--conn-rate, --max-egress and --bandwidth limit the sandbox's new
connections per second, the bytes it sends out over its life, and its
bytes per second each way. --secret-header 'HOST=Header: value' has den's
proxy set the header on every HTTPS request to HOST (den terminates TLS
for that host with a CA of the sandbox's own, which the sandbox trusts, and
re-encrypts to the real server). The value is a template: ${NAME} is the
secret NAME stored with den secret set, expanded by the daemon, so the
secret never enters the sandbox. Single-quote the flag, or your shell
expands ${NAME} before den sees it.`

// given reports whether any of the flags was given.
func (o *netOpts) given() bool {
	return o.mode != "" || len(o.allow) > 0 || len(o.deny) > 0 || len(o.allowCIDR) > 0 || o.extraFlag() != ""
}

// extraFlag names the first limit or secret header flag given, "" when
// none was.
func (o *netOpts) extraFlag() string {
	switch {
	case len(o.secretHeaders) > 0:
		return "--secret-header"
	case o.connRate > 0:
		return "--conn-rate"
	case o.maxEgress > 0:
		return "--max-egress"
	case o.bandwidth > 0:
		return "--bandwidth"
	}
	return ""
}

// policy returns the policy the flags describe, or nil when none was
// given. Warnings about secret headers go to stderr.
func (o *netOpts) policy(v *verb, stderr io.Writer) (*api.NetworkPolicy, error) {
	if !o.given() {
		return nil, nil
	}
	p := &api.NetworkPolicy{Mode: o.mode, Allow: o.allow, Deny: o.deny, AllowCIDR: o.allowCIDR,
		ConnRate: o.connRate, MaxEgress: o.maxEgress, Bandwidth: o.bandwidth, SecretHeaders: o.secretHeaders}
	lists := len(o.allow) > 0 || len(o.allowCIDR) > 0
	mf := o.modeFlag
	if mf == "" {
		mf = "--net"
	}
	switch {
	case p.Mode == "" && lists:
		p.Mode = api.NetAllow
	case p.Mode == "" && len(o.deny) > 0:
		return nil, usagef(v, "--deny alone leaves the sandbox without network: add %s open or --allow DOMAIN", mf)
	case p.Mode == "":
		return nil, usagef(v, "%s alone leaves the sandbox without network: add %s open or --allow DOMAIN", o.extraFlag(), mf)
	case p.Mode == api.NetNone && lists:
		return nil, usagef(v, "%s does not go with %s none (loopback only)", o.listFlag(), mf)
	case p.Mode == api.NetNone && o.extraFlag() != "":
		return nil, usagef(v, "%s does not go with %s none (loopback only)", o.extraFlag(), mf)
	case p.Mode == api.NetOpen && len(o.allow) > 0:
		return nil, usagef(v, "--allow does not go with %s open, which allows every public domain (--deny refuses some)", mf)
	case p.Mode == api.NetAllow && !lists && o.fixed:
		return nil, usagef(v, "%s allow needs --allow DOMAIN or --allow-cidr CIDR: it allows only those (%s open allows every public address)", mf, mf)
	}
	for _, h := range o.secretHeaders {
		if !secretRef.MatchString(h.Value) {
			fmt.Fprintf(stderr, "den: warning: the --secret-header value for %s has no ${NAME} reference: it is stored as written, and den net show prints it. Store the secret with den secret set NAME and write ${NAME}, in single quotes so the shell does not expand it\n", h.Host)
		}
		if p.Mode == api.NetAllow && len(o.allowCIDR) == 0 && !allowed(o.allow, h.Host) {
			fmt.Fprintf(stderr, "den: warning: --secret-header host %s is not allowed by any --allow, so the sandbox cannot reach it: add --allow %s\n", h.Host, h.Host)
		}
	}
	return p, nil
}

// allowed reports whether an allow rule matches host, as den's proxy
// matches them.
func allowed(rules []string, host string) bool {
	host = strings.TrimSuffix(host, ".")
	for _, r := range rules {
		r = strings.TrimSuffix(r, ".")
		if suffix, ok := strings.CutPrefix(r, "*"); ok && strings.HasPrefix(suffix, ".") {
			if len(host) > len(suffix) && strings.EqualFold(host[len(host)-len(suffix):], suffix) {
				return true
			}
		} else if strings.EqualFold(r, host) {
			return true
		}
	}
	return false
}

// listFlag names the first allow list flag given.
func (o *netOpts) listFlag() string {
	if len(o.allow) > 0 {
		return "--allow"
	}
	return "--allow-cidr"
}

// secretRef is a ${NAME} reference in a secret header's value, as the
// daemon expands them.
var secretRef = regexp.MustCompile(`\$\{[A-Za-z_][A-Za-z0-9_]*\}`)

// secretHeaderValue collects --secret-header HOST=Header: value. Its
// errors never quote the value, which may be a secret.
type secretHeaderValue struct{ p *[]api.SecretHeader }

func (s secretHeaderValue) Set(v string) error {
	host, rest, ok := strings.Cut(v, "=")
	header, value, ok2 := strings.Cut(rest, ":")
	host, header, value = strings.TrimSpace(host), strings.TrimSpace(header), strings.TrimSpace(value)
	switch {
	case !ok || !ok2 || host == "" || header == "":
		return errors.New("want 'HOST=Header: value', like 'api.example.com=Authorization: Bearer ${TOKEN}'")
	case value == "":
		return fmt.Errorf("the value of header %s for %s is empty", header, host)
	case strings.Contains(secretRef.ReplaceAllString(value, ""), "${"):
		return fmt.Errorf("the value of header %s for %s has a bad reference: write ${NAME}, NAME made of letters, digits and _", header, host)
	}
	h := api.SecretHeader{Host: host, Header: header, Value: value}
	// The daemon's own checks: an exact host name, a header name that is
	// a token and not one that frames the message, no control characters,
	// no header twice for a host.
	pol := egress.Policy{Mode: egress.ModeNone}
	for _, x := range append(*s.p, h) {
		pol.Secrets = append(pol.Secrets, egress.SecretHeader{Host: x.Host, Header: x.Header, Value: x.Value})
	}
	if err := pol.Validate(); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "egress policy: "))
	}
	*s.p = append(*s.p, h)
	return nil
}

func (s secretHeaderValue) String() string {
	if s.p == nil {
		return ""
	}
	var l []string
	for _, h := range *s.p {
		l = append(l, secretHeaderText(h))
	}
	return strings.Join(l, ",")
}

// hidesValue keeps the flag's value out of error messages.
func (secretHeaderValue) hidesValue() bool { return true }

// secretHeaderText is a secret header in the form of the flag.
func secretHeaderText(h api.SecretHeader) string { return h.Host + "=" + h.Header + ": " + h.Value }

// modeValue is a network mode: none, allow or open.
type modeValue struct{ p *string }

func (m modeValue) Set(v string) error {
	switch v {
	case api.NetNone, api.NetAllow, api.NetOpen:
		*m.p = v
		return nil
	}
	return fmt.Errorf("want %s, %s or %s", api.NetNone, api.NetAllow, api.NetOpen)
}

func (m modeValue) String() string {
	if m.p == nil {
		return ""
	}
	return *m.p
}

// checkDomain accepts a domain name or *.suffix.
func checkDomain(s string) (string, error) {
	s = strings.TrimSpace(s)
	name := strings.TrimPrefix(s, "*.")
	switch {
	case isAddr(name):
		return "", errors.New("an address, not a domain: use --allow-cidr")
	case name == "" || name == "." || strings.ContainsAny(name, " \t\n/:@*"):
		return "", errors.New("want a domain like example.com or *.example.com")
	}
	return s, nil
}

func isAddr(s string) bool {
	_, err := netip.ParseAddr(strings.Trim(s, "[]"))
	return err == nil
}

// checkCIDR accepts an address range or a single address.
func checkCIDR(s string) (string, error) {
	s = strings.TrimSpace(s)
	if _, err := netip.ParsePrefix(s); err == nil {
		return s, nil
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return s, nil
	}
	return "", errors.New("want a CIDR like 203.0.113.0/24, or an address")
}

// netMode is a policy's mode as shown: none when unset.
func netMode(p api.NetworkPolicy) string {
	if p.Mode == "" {
		return api.NetNone
	}
	return p.Mode
}

func cmdNetSet(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	var o netOpts
	o.define(f)
	jsonOut := f.jsonFlag("print the sandbox as JSON")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef(v, "net set needs one sandbox ID (got %d arguments)", len(pos))
	}
	if !o.given() {
		return usagef(v, "net set needs --net, --allow or --allow-cidr (--net none cuts the sandbox off)")
	}
	p, err := o.policy(v, c.stderr)
	if err != nil {
		return err
	}
	sb, err := c.client(f).SetNetwork(context.Background(), pos[0], *p)
	if err != nil {
		return err
	}
	if *jsonOut {
		return c.printJSON(sb)
	}
	if sb.Address != "" {
		_, err = fmt.Fprintf(c.stdout, "%s %s\n", netMode(sb.Network), sb.Address)
	} else {
		_, err = fmt.Fprintln(c.stdout, netMode(sb.Network))
	}
	return err
}

func cmdNetShow(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag(`print JSON: {"network": NetworkPolicy, "address": ...}`)
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef(v, "net show needs one sandbox ID (got %d arguments)", len(pos))
	}
	sb, err := c.client(f).Get(context.Background(), pos[0])
	if err != nil {
		return err
	}
	if *jsonOut {
		return c.printJSON(struct {
			Network api.NetworkPolicy `json:"network"`
			Address string            `json:"address,omitempty"`
		}{sb.Network, sb.Address})
	}
	list := func(l []string) string {
		if len(l) == 0 {
			return "-"
		}
		return strings.Join(l, ", ")
	}
	addr := sb.Address
	if addr == "" {
		addr = "-"
	}
	n := sb.Network
	rate, egressMax, bw := "-", "-", "-"
	if n.ConnRate > 0 {
		rate = strconv.FormatFloat(n.ConnRate, 'g', -1, 64) + " connections/s"
	}
	if n.MaxEgress > 0 {
		egressMax = humanSize(int64(n.MaxEgress))
	}
	if n.Bandwidth > 0 {
		bw = humanSize(int64(n.Bandwidth)) + "/s"
	}
	// The header values are templates: ${NAME} references, not secrets.
	headers := "-"
	for i, h := range n.SecretHeaders {
		if i == 0 {
			headers = secretHeaderText(h)
		} else {
			headers += "\n             " + secretHeaderText(h)
		}
	}
	_, err = fmt.Fprintf(c.stdout, "Mode:        %s\nAddress:     %s\nAllow:       %s\nAllow CIDR:  %s\nDeny:        %s\n"+
		"Conn rate:   %s\nMax egress:  %s\nBandwidth:   %s\nHeaders:     %s\n",
		netMode(n), addr, list(n.Allow), list(n.AllowCIDR), list(n.Deny), rate, egressMax, bw, headers)
	return err
}

// netRow is one event as the columns of den net log.
func netRow(e *api.Event) []string {
	// The data is the daemon's egress.Event (snake_case keys).
	var d egress.Event
	json.Unmarshal(e.Data, &d) // what does not decode stays empty
	// Events an older daemon logged have the Go field names as keys: the
	// one-word ones decode above (keys match case-insensitively), these
	// do not.
	var old struct {
		BytesOut, BytesIn int64
		ProcessUnknown    string
	}
	if json.Unmarshal(e.Data, &old) == nil && d.BytesOut == 0 && d.BytesIn == 0 && d.ProcessUnknown == "" {
		d.BytesOut, d.BytesIn, d.ProcessUnknown = old.BytesOut, old.BytesIn, old.ProcessUnknown
	}
	t := d.Time
	if t.IsZero() {
		t = e.Time
	}
	kind := d.Kind
	if kind == "" {
		kind = strings.TrimPrefix(e.Type, "net.")
	}
	name := d.Name
	if d.QType != "" {
		name += " " + d.QType
	}
	addr := d.Addr
	if d.Port != 0 && addr != "" && !strings.Contains(addr, ",") {
		addr = net.JoinHostPort(addr, strconv.Itoa(d.Port))
	} else if d.Port != 0 && addr == "" {
		addr = ":" + strconv.Itoa(d.Port)
	}
	bytes := "-"
	if kind != egress.KindDNS {
		bytes = humanSize(d.BytesOut) + "/" + humanSize(d.BytesIn)
	}
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	process, reason := dash(clip(d.Process, maxProcess)), d.Reason
	if d.Process == "" && d.ProcessUnknown != "" {
		process, reason = "?", reason+" (process unknown: "+d.ProcessUnknown+")"
	}
	return []string{t.Local().Format("2006-01-02 15:04:05"), dash(kind), dash(name), dash(addr), dash(d.Verdict), bytes,
		process, reason}
}

// maxProcess bounds the PROCESS column: a process's command line can be
// long (--json has it whole).
const maxProcess = 40

// clip shortens s to n runes, marking the cut with "…".
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

var netLogHeader = []string{"TIME", "KIND", "NAME", "ADDR:PORT", "VERDICT", "OUT/IN", "PROCESS", "REASON"}

// netLogWidths are the column widths of den net log -f, which cannot
// align columns on what it has not seen yet.
var netLogWidths = []int{19, 7, 30, 21, 7, 17, 24}

func netLogLine(cells []string) string {
	var b strings.Builder
	for i, s := range cells {
		if i < len(netLogWidths) {
			fmt.Fprintf(&b, "%-*s   ", netLogWidths[i], s)
		} else {
			b.WriteString(s)
		}
	}
	return strings.TrimRight(b.String(), " ") + "\n"
}

func cmdNetLog(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	filter := client.EventFilter{Type: "net."}
	jsonOut, follow := eventFlags(f, &filter)
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef(v, "net log needs one sandbox ID (got %d arguments)", len(pos))
	}
	ctx := context.Background()
	cl := c.client(f)
	if filter.Sandbox, err = eventSandbox(ctx, cl, pos[0]); err != nil {
		return err
	}
	if *follow {
		enc := json.NewEncoder(c.stdout)
		enc.SetEscapeHTML(false)
		if !*jsonOut {
			fmt.Fprint(c.stdout, netLogLine(netLogHeader))
		}
		return pollEvents(cl, filter, func(e *api.Event) error {
			if *jsonOut {
				return enc.Encode(e)
			}
			_, err := fmt.Fprint(c.stdout, netLogLine(netRow(e)))
			return err
		})
	}
	list, err := cl.Events(ctx, filter)
	if err != nil {
		return err
	}
	return printList(c, list, *jsonOut, false, nil, strings.Join(netLogHeader, "\t"), func(e *api.Event) string {
		return strings.Join(netRow(e), "\t") + "\n"
	})
}
