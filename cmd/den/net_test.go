package main

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/egress"
)

func TestRunCreateNetFlags(t *testing.T) {
	f := newFakeDaemon(t)
	for _, tc := range []struct {
		args []string
		want *api.NetworkPolicy
	}{
		{[]string{"create"}, nil},
		{[]string{"create", "--net", "open"}, &api.NetworkPolicy{Mode: api.NetOpen}},
		{[]string{"create", "--net=none"}, &api.NetworkPolicy{Mode: api.NetNone}},
		// --allow and --allow-cidr imply allow.
		{[]string{"create", "--allow", "example.com", "--allow", "*.pypi.org", "--deny", "bad.example.com", "--allow-cidr", "10.1.0.0/16", "--allow-cidr", "192.0.2.7"},
			&api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"example.com", "*.pypi.org"}, Deny: []string{"bad.example.com"}, AllowCIDR: []string{"10.1.0.0/16", "192.0.2.7"}}},
		{[]string{"create", "--allow-cidr", "2001:db8::/32"}, &api.NetworkPolicy{Mode: api.NetAllow, AllowCIDR: []string{"2001:db8::/32"}}},
		{[]string{"create", "--net", "open", "--deny", "example.com", "--allow-cidr", "10.0.0.1"},
			&api.NetworkPolicy{Mode: api.NetOpen, Deny: []string{"example.com"}, AllowCIDR: []string{"10.0.0.1"}}},
		{[]string{"run", "--rm", "--net", "allow", "--allow", "example.com", "--", "exit", "0"}, &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"example.com"}}},
		{[]string{"run", "--rm", "--", "exit", "0"}, nil},
		// Limits and secret headers.
		{[]string{"create", "--net", "open", "--conn-rate", "2.5", "--max-egress", "1g", "--bandwidth", "512k"},
			&api.NetworkPolicy{Mode: api.NetOpen, ConnRate: 2.5, MaxEgress: 1 << 30, Bandwidth: 512 << 10}},
		{[]string{"create", "--allow", "api.example.com", "--secret-header", "api.example.com=Authorization: Bearer ${TOKEN}",
			"--secret-header", "api.example.com = X-Api-Key:${KEY}", "--secret-header", "API.example.com=x-other: a=b:c ${A}${B_2} "},
			&api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"api.example.com"}, SecretHeaders: []api.SecretHeader{
				{Host: "api.example.com", Header: "Authorization", Value: "Bearer ${TOKEN}"},
				{Host: "api.example.com", Header: "X-Api-Key", Value: "${KEY}"},
				{Host: "API.example.com", Header: "x-other", Value: "a=b:c ${A}${B_2}"}}}},
		{[]string{"run", "--rm", "--net", "open", "--secret-header=h.example=A: ${X}", "--bandwidth=8k", "--", "exit", "0"},
			&api.NetworkPolicy{Mode: api.NetOpen, Bandwidth: 8 << 10, SecretHeaders: []api.SecretHeader{{Host: "h.example", Header: "A", Value: "${X}"}}}},
	} {
		n := len(f.creates)
		r := den(t, f, "", tc.args...)
		if r.code != 0 || len(f.creates) != n+1 {
			t.Errorf("%q: %+v", tc.args, r)
			continue
		}
		if got := f.creates[n].Network; !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q sent network %+v, want %+v", tc.args, got, tc.want)
		}
		if r.stderr != "" {
			t.Errorf("%q: stderr %q", tc.args, r.stderr)
		}
	}
	// The wire form: no network key without the flags.
	r := den(t, f, "", "create", "--json", "--allow", "example.com")
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil || sb.Network.Mode != api.NetAllow || sb.Address == "" {
		t.Errorf("create --json --allow: %+v", r)
	}
}

func TestNetFlagErrors(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--net", "wide", "--", "echo"}, "--net"},
		{[]string{"create", "--net", "NONE"}, "--net"},
		{[]string{"create", "--net"}, "--net"},
		{[]string{"create", "--allow-cidr", "10.0.0.0/33"}, "--allow-cidr"},
		{[]string{"create", "--allow-cidr", "example.com"}, "--allow-cidr"},
		{[]string{"run", "--allow", "192.0.2.1", "--", "echo"}, "--allow-cidr"},
		{[]string{"create", "--allow", "http://example.com/"}, "--allow"},
		{[]string{"create", "--deny", ""}, "--deny"},
		{[]string{"create", "--deny", "example.com"}, "--deny"},
		{[]string{"create", "--net", "none", "--allow", "example.com"}, "--allow"},
		{[]string{"create", "--allow-cidr", "10.0.0.0/8", "--net", "none"}, "--allow-cidr"},
		{[]string{"run", "--net", "open", "--allow", "example.com", "--", "echo"}, "--allow"},
		{[]string{"net", "set", "--net", "all", "box"}, "--net"},
		{[]string{"net", "set", "--allow-cidr", "1.2.3", "box"}, "--allow-cidr"},
		{[]string{"net", "set", "box"}, "--net"},
		{[]string{"net", "set", "--net", "open"}, "one sandbox"},
		{[]string{"net", "set", "--net", "open", "box", "other"}, "one sandbox"},
		{[]string{"net", "set", "--deny", "example.com", "box"}, "--deny"},
		{[]string{"net", "show"}, "one sandbox"},
		{[]string{"net", "log", "box", "other"}, "one sandbox"},
		{[]string{"net", "log", "--since", "whenever", "box"}, "--since"},
		{[]string{"net", "frob"}, "frob"},
		{[]string{"net", "--json", "show", "box"}, "--json"},
		// Limits and secret headers.
		{[]string{"create", "--net", "open", "--conn-rate", "fast"}, "--conn-rate"},
		{[]string{"create", "--net", "open", "--conn-rate", "-1"}, "--conn-rate"},
		{[]string{"create", "--net", "open", "--conn-rate", "inf"}, "--conn-rate"},
		{[]string{"create", "--net", "open", "--conn-rate", "NaN"}, "--conn-rate"},
		{[]string{"create", "--net", "open", "--max-egress", "lots"}, "--max-egress"},
		{[]string{"create", "--net", "open", "--max-egress", "-1g"}, "--max-egress"},
		{[]string{"run", "--net", "open", "--bandwidth", "1q", "--", "echo"}, "--bandwidth"},
		{[]string{"net", "set", "--net", "open", "--bandwidth", "", "box"}, "--bandwidth"},
		{[]string{"create", "--max-egress", "1g"}, "--max-egress"},
		{[]string{"net", "set", "--conn-rate", "5", "box"}, "--conn-rate"},
		{[]string{"create", "--net", "none", "--bandwidth", "1m"}, "--bandwidth"},
		{[]string{"create", "--secret-header", "a.example=Authorization: Bearer ${T}"}, "--secret-header"},
		{[]string{"create", "--net", "none", "--secret-header", "a.example=Authorization: Bearer ${T}"}, "--secret-header"},
		{[]string{"create", "--net", "open", "--secret-header", "Authorization: Bearer ${T}"}, "--secret-header"},
		{[]string{"create", "--net", "open", "--secret-header", "a.example=Authorization Bearer ${T}"}, "--secret-header"},
		{[]string{"create", "--net", "open", "--secret-header", "=Authorization: x${T}"}, "--secret-header"},
		{[]string{"create", "--net", "open", "--secret-header", "a.example=: x${T}"}, "--secret-header"},
		{[]string{"create", "--net", "open", "--secret-header", "a.example=Authorization:  "}, "--secret-header"},
		{[]string{"create", "--net", "open", "--secret-header", "*.example.com=Authorization: ${T}"}, "--secret-header"},
		{[]string{"create", "--net", "open", "--secret-header", "a.example=Host: ${T}"}, "--secret-header"},
		{[]string{"create", "--net", "open", "--secret-header", "a.example=Bad Header: ${T}"}, "--secret-header"},
		{[]string{"create", "--net", "open", "--secret-header", "a.example=A: ${T", "box"}, "--secret-header"},
		{[]string{"create", "--net", "open", "--secret-header", "a.example=A: ${1T}", "box"}, "--secret-header"},
		{[]string{"create", "--net", "open", "--secret-header", "a.example=A: ${T}\x01"}, "--secret-header"},
		{[]string{"create", "--net", "open", "--secret-header", "a.example=A: ${T}", "--secret-header", "A.example=a: ${U}"}, "--secret-header"},
		{[]string{"net", "set", "--net", "open", "--secret-header", "a.example", "box"}, "--secret-header"},
	} {
		r := den(t, f, "", tc.args...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "den: ") || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 naming %s", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if len(f.creates) != 0 || len(f.netSets) != 0 {
		t.Errorf("a bad command line sent requests: %+v %+v", f.creates, f.netSets)
	}
}

func TestNetSet(t *testing.T) {
	f := newFakeDaemon(t)
	sb := f.addSandbox(api.CreateRequest{Name: "box"})

	r := den(t, f, "", "net", "set", "--allow", "example.com", "--allow", "*.example.org", "--deny", "x.example.com", "--allow-cidr", "203.0.113.0/24", "box")
	if r.code != 0 || r.stdout != "allow 10.89.0.2\n" || r.stderr != "" {
		t.Errorf("net set --allow: %+v", r)
	}
	want := api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"example.com", "*.example.org"}, Deny: []string{"x.example.com"}, AllowCIDR: []string{"203.0.113.0/24"}}
	if len(f.netSets) != 1 || !reflect.DeepEqual(f.netSets[0], want) {
		t.Errorf("net set sent %+v, want %+v", f.netSets, want)
	}
	if !logHas(f, "PUT /v1/sandboxes/box/network", "") {
		t.Errorf("no PUT network in %q", f.log)
	}

	// Flags after the ID; the id prefix is passed on.
	if r := den(t, f, "", "net", "set", sb.ID[:8], "--net", "open"); r.code != 0 || r.stdout != "open 10.89.0.2\n" {
		t.Errorf("net set --net open: %+v", r)
	}
	if got := f.netSets[len(f.netSets)-1]; !reflect.DeepEqual(got, api.NetworkPolicy{Mode: api.NetOpen}) {
		t.Errorf("net set --net open sent %+v", got)
	}
	if r := den(t, f, "", "net", "set", "--net", "none", "box"); r.code != 0 || r.stdout != "none\n" {
		t.Errorf("net set --net none: %+v", r)
	}

	r = den(t, f, "", "net", "set", "--json", "--net", "open", "box")
	var got api.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.ID != sb.ID || got.Network.Mode != api.NetOpen || got.Address != "10.89.0.2" {
		t.Errorf("net set --json: %+v", r)
	}

	// --host before the sub-command.
	if r := den(t, nil, "", "net", "--host", f.host, "set", "--net", "none", "box"); r.code != 0 || r.stdout != "none\n" {
		t.Errorf("net --host H set: %+v", r)
	}

	r = den(t, f, "", "net", "set", "--net", "open", "nope")
	if r.code != 1 || !strings.Contains(r.stderr, `no such sandbox "nope"`) || !strings.Contains(r.stderr, "den ls") {
		t.Errorf("net set on a missing sandbox: %+v", r)
	}
}

func TestNetShow(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box", Network: &api.NetworkPolicy{Mode: api.NetAllow,
		Allow: []string{"example.com", "*.example.org"}, AllowCIDR: []string{"203.0.113.0/24"}}})
	f.addSandbox(api.CreateRequest{Name: "off"})

	f.addSandbox(api.CreateRequest{Name: "lim", Network: &api.NetworkPolicy{Mode: api.NetOpen, Deny: []string{"x.example"},
		ConnRate: 2.5, MaxEgress: 1 << 30, Bandwidth: 512 << 10, SecretHeaders: []api.SecretHeader{
			{Host: "api.example.com", Header: "Authorization", Value: "Bearer ${TOKEN}"},
			{Host: "b.example", Header: "X-Key", Value: "${KEY}"}}}})

	r := den(t, f, "", "net", "show", "box")
	want := "Mode:        allow\nAddress:     10.89.0.2\nAllow:       example.com, *.example.org\nAllow CIDR:  203.0.113.0/24\nDeny:        -\n" +
		"Conn rate:   -\nMax egress:  -\nBandwidth:   -\nHeaders:     -\n"
	if r.code != 0 || r.stdout != want {
		t.Errorf("net show:\n%s\nwant\n%s(%+v)", r.stdout, want, r)
	}
	// The header values as stored: the references, not the secrets.
	r = den(t, f, "", "net", "show", "lim")
	want = "Mode:        open\nAddress:     10.89.0.2\nAllow:       -\nAllow CIDR:  -\nDeny:        x.example\n" +
		"Conn rate:   2.5 connections/s\nMax egress:  1.00GiB\nBandwidth:   512.0KiB/s\n" +
		"Headers:     api.example.com=Authorization: Bearer ${TOKEN}\n             b.example=X-Key: ${KEY}\n"
	if r.code != 0 || r.stdout != want {
		t.Errorf("net show:\n%s\nwant\n%s(%+v)", r.stdout, want, r)
	}
	r = den(t, f, "", "net", "show", "off")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "Mode:        none\nAddress:     -\n") {
		t.Errorf("net show of an offline sandbox:\n%s", r.stdout)
	}
	r = den(t, f, "", "net", "show", "--json", "box")
	var doc struct {
		Network api.NetworkPolicy
		Address string
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil || doc.Network.Mode != api.NetAllow || len(doc.Network.Allow) != 2 || doc.Address != "10.89.0.2" {
		t.Errorf("net show --json: %+v", r)
	}
	if !strings.Contains(r.stdout, `"allow_cidr": [`) || !strings.Contains(r.stdout, `"address": "10.89.0.2"`) {
		t.Errorf("net show --json does not use the API's keys:\n%s", r.stdout)
	}
	r = den(t, f, "", "net", "show", "--json", "lim")
	for _, w := range []string{`"conn_rate": 2.5`, `"max_egress": 1073741824`, `"bandwidth": 524288`, `"secret_headers": [`, `"value": "Bearer ${TOKEN}"`} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("net show --json lacks %s:\n%s", w, r.stdout)
		}
	}
	if r := den(t, f, "", "net", "show", "nope"); r.code != 1 || !strings.Contains(r.stderr, "den ls") {
		t.Errorf("net show of a missing sandbox: %+v", r)
	}
}

// egressData is the data of a net.* event, as the daemon writes it.
func egressData(t *testing.T, ev egress.Event) map[string]any {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestNetLog(t *testing.T) {
	f := newFakeDaemon(t)
	sb := f.addSandbox(api.CreateRequest{Name: "box", Network: &api.NetworkPolicy{Mode: api.NetOpen}})
	other := f.addSandbox(api.CreateRequest{Name: "other"})
	at := time.Date(2025, 3, 4, 5, 6, 7, 0, time.Local)
	f.netEvent(sb.ID, "dns", egressData(t, egress.Event{Time: at, Sandbox: sb.ID, Kind: egress.KindDNS, Name: "example.com", QType: "A",
		Addr: "93.184.215.14,93.184.215.15", Verdict: egress.VerdictAllow, Reason: "open mode", Duration: 3 * time.Millisecond, SrcPort: 40000}))
	f.netEvent(sb.ID, "connect", egressData(t, egress.Event{Time: at.Add(time.Second), Sandbox: sb.ID, Kind: egress.KindConnect, Name: "example.com",
		Addr: "93.184.215.14", Port: 443, BytesOut: 512, BytesIn: 3 << 20, Verdict: egress.VerdictAllow, Reason: "open mode", Duration: time.Second,
		Process: "p12 (curl -s https://example.com/)"}))
	f.netEvent(sb.ID, "connect", egressData(t, egress.Event{Time: at.Add(2 * time.Second), Sandbox: sb.ID, Kind: egress.KindConnect,
		Addr: "2001:db8::1", Port: 80, Verdict: egress.VerdictDeny, Reason: "private address",
		Process: "p3 (python3 -c import urllib.request; urllib.request.urlopen('http://[2001:db8::1]/'))"}))
	f.netEvent(sb.ID, "dns", egressData(t, egress.Event{Time: at.Add(3 * time.Second), Sandbox: sb.ID, Kind: egress.KindDNS, Name: "gone.example", QType: "A",
		Verdict: egress.VerdictDeny, Reason: "name not in allow list", ProcessUnknown: "the socket was closed before den looked"}))
	f.netEvent(other.ID, "connect", egressData(t, egress.Event{Time: at, Sandbox: other.ID, Kind: egress.KindConnect, Name: "elsewhere.example", Port: 443}))

	r := den(t, f, "", "net", "log", "box")
	if r.code != 0 {
		t.Fatalf("net log: %+v", r)
	}
	q := f.lastQuery["GET /v1/events"]
	if !strings.Contains(q, "sandbox="+sb.ID) || !strings.Contains(q, "type=net.") {
		t.Errorf("net log query %q", q)
	}
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	wants := []string{
		`^TIME\s+KIND\s+NAME\s+ADDR:PORT\s+VERDICT\s+OUT/IN\s+PROCESS\s+REASON$`,
		`^2025-03-04 05:06:07\s+dns\s+example\.com A\s+93\.184\.215\.14,93\.184\.215\.15\s+allow\s+-\s+-\s+open mode$`,
		`^2025-03-04 05:06:08\s+connect\s+example\.com\s+93\.184\.215\.14:443\s+allow\s+512B/3\.00MiB\s+p12 \(curl -s https://example\.com/\)\s+open mode$`,
		// A long command line is cut.
		`^2025-03-04 05:06:09\s+connect\s+-\s+\[2001:db8::1\]:80\s+deny\s+0B/0B\s+p3 \(python3 -c import urllib\.request; u…\s+private address$`,
		// No process, and why.
		`^2025-03-04 05:06:10\s+dns\s+gone\.example A\s+-\s+deny\s+-\s+\?\s+name not in allow list \(process unknown: the socket was closed before den looked\)$`,
	}
	if len(lines) != len(wants) {
		t.Fatalf("net log printed %d lines, want %d:\n%s", len(lines), len(wants), r.stdout)
	}
	for i, w := range wants {
		if !regexp.MustCompile(w).MatchString(lines[i]) {
			t.Errorf("net log line %d %q does not match %s", i, lines[i], w)
		}
	}

	r = den(t, f, "", "net", "log", "--json", "box")
	var list []*api.Event
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 4 || list[0].Type != "net.dns" {
		t.Errorf("net log --json: %+v", r)
	}
	if !strings.Contains(r.stdout, `"process": "p3 (python3 -c import urllib.request; urllib.request.urlopen('http://[2001:db8::1]/'))"`) {
		t.Errorf("net log --json does not have the whole process:\n%s", r.stdout)
	}
	if r := den(t, f, "", "net", "log", "--json", "--since", "1h", "other"); r.code != 0 || !strings.Contains(r.stdout, "elsewhere.example") ||
		!strings.Contains(f.lastQuery["GET /v1/events"], "since=") {
		t.Errorf("net log --since: %+v", r)
	}
	// A removed sandbox's log is still there under its full id.
	if r := den(t, f, "", "net", "log", "--json", "0000"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("net log of an unknown sandbox: %+v", r)
	}
}

// Events an older daemon logged with Go field names as keys still print.
func TestNetLogLegacyKeys(t *testing.T) {
	f := newFakeDaemon(t)
	sb := f.addSandbox(api.CreateRequest{Name: "box", Network: &api.NetworkPolicy{Mode: api.NetOpen}})
	f.netEvent(sb.ID, "connect", map[string]any{"Time": "2025-03-04T05:06:07Z", "Kind": "connect", "Name": "old.example", "Addr": "192.0.2.1",
		"Port": 443, "BytesOut": 512, "BytesIn": 1024, "Verdict": "deny", "Reason": "gone", "ProcessUnknown": "the socket was closed"})
	r := den(t, f, "", "net", "log", "box")
	if !regexp.MustCompile(`connect\s+old\.example\s+192\.0\.2\.1:443\s+deny\s+512B/1\.00KiB\s+\?\s+gone \(process unknown: the socket was closed\)`).MatchString(r.stdout) {
		t.Errorf("net log of a legacy event:\n%s", r.stdout)
	}
}

func TestNetLogFollow(t *testing.T) {
	f := newFakeDaemon(t)
	sb := f.addSandbox(api.CreateRequest{Name: "box", Network: &api.NetworkPolicy{Mode: api.NetOpen}})
	f.netEvent(sb.ID, "dns", egressData(t, egress.Event{Sandbox: sb.ID, Kind: egress.KindDNS, Name: "old.example"})) // before: not printed
	old := eventsPoll
	eventsPoll = 5 * time.Millisecond
	defer func() { eventsPoll = old }()

	stdout, _, code := background(f, nil, "net", "log", "-f", "-n", "2", "box")
	eventually(t, "the first poll", func() bool { return logHas(f, "GET /v1/events", "since=") })
	time.Sleep(10 * time.Millisecond)
	f.mu.Lock()
	f.event(sb.ID, "exec.start") // not a net event
	f.mu.Unlock()
	f.netEvent(sb.ID, "connect", egressData(t, egress.Event{Time: time.Now(), Sandbox: sb.ID, Kind: egress.KindConnect, Name: "new.example",
		Addr: "192.0.2.1", Port: 443, BytesOut: 10, BytesIn: 20, Verdict: egress.VerdictAllow, Reason: "open mode", Process: "pid 7 (wget)"}))
	eventually(t, "the first event", func() bool { return strings.Count(stdout.String(), "\n") >= 2 })
	f.netEvent(sb.ID, "dns", egressData(t, egress.Event{Time: time.Now(), Sandbox: sb.ID, Kind: egress.KindDNS, Name: "deny.example", QType: "AAAA",
		Verdict: egress.VerdictDeny, Reason: "not allowed"}))
	if c := waitCode(t, code); c != 0 {
		t.Errorf("net log -f -n 2: exit %d", c)
	}
	want := `^TIME\s+KIND\s+NAME\s+ADDR:PORT\s+VERDICT\s+OUT/IN\s+PROCESS\s+REASON\n` +
		`\S+ \S+\s+connect\s+new\.example\s+192\.0\.2\.1:443\s+allow\s+10B/20B\s+pid 7 \(wget\)\s+open mode\n` +
		`\S+ \S+\s+dns\s+deny\.example AAAA\s+-\s+deny\s+-\s+-\s+not allowed\n$`
	if !regexp.MustCompile(want).MatchString(stdout.String()) {
		t.Errorf("net log -f:\n%s", stdout.String())
	}
	if !logHas(f, "GET /v1/events", "type=net.") {
		t.Errorf("net log -f does not ask for net. events: %q", f.log)
	}

	// --json: one event a line.
	stdout, _, code = background(f, nil, "net", "log", "-f", "--json", "--since", "1h", "-n", "2", "box")
	if c := waitCode(t, code); c != 0 {
		t.Errorf("net log -f --json: exit %d", c)
	}
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var e api.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil || !strings.HasPrefix(e.Type, "net.") {
			t.Errorf("net log -f --json line %q (%v)", l, err)
		}
	}
}

func TestNetHelp(t *testing.T) {
	r := den(t, nil, "", "help")
	if !regexp.MustCompile(`(?m)^  net\s+` + regexp.QuoteMeta(verbNet.summary) + `$`).MatchString(r.stdout) {
		t.Errorf("den help does not list net:\n%s", r.stdout)
	}
	r = den(t, nil, "", "net")
	for _, sub := range []string{"set", "show", "log"} {
		if r.code != 0 || !regexp.MustCompile(`(?m)^  `+sub+`\s`).MatchString(r.stdout) {
			t.Errorf("den net does not list %s:\n%s", sub, r.stdout)
		}
	}
	const netLimitFlags = "--conn-rate N"
	for _, verb := range []string{"run", "create", "net set"} {
		h := den(t, nil, "", append([]string{"help"}, strings.Fields(verb)...)...)
		for _, w := range []string{"--max-egress SIZE", "--bandwidth SIZE", "--secret-header HOST=HEADER:VALUE", "bytes per second each way", "${NAME}"} {
			if !strings.Contains(h.stdout, w) {
				t.Errorf("den help %s lacks %q", verb, w)
			}
		}
	}
	for verb, wants := range map[string][]string{
		"run":      {"--net MODE", "--allow DOMAIN", "--deny DOMAIN", "--allow-cidr CIDR", "den run --rm --allow", netLimitFlags, "--secret-header 'api.github.com=Authorization: Bearer ${GITHUB_TOKEN}'", "Single-quote"},
		"create":   {"--net MODE", "--allow DOMAIN", "--deny DOMAIN", "--allow-cidr CIDR", "den create --allow", netLimitFlags, "--max-egress 2g", "--secret-header 'api.example.com=Authorization: Bearer ${TOKEN}'"},
		"net set":  {"--net MODE", "--allow DOMAIN", "--deny DOMAIN", "--allow-cidr CIDR", "--json", "den net set --allow", netLimitFlags, "--conn-rate 20", "--secret-header 'api.example.com=Authorization: Bearer ${TOKEN}'", "den secret set"},
		"net show": {"--json", "den net show web", "${NAME} references, not the secrets"},
		"net log":  {"-f, --follow", "--json", "--since TIME", "-n, --limit N", "den net log -f web", "the process that made it"},
	} {
		h := den(t, nil, "", append([]string{"help"}, strings.Fields(verb)...)...)
		for _, w := range wants {
			if !strings.Contains(h.stdout, w) {
				t.Errorf("den help %s lacks %q:\n%s", verb, w, h.stdout)
			}
		}
	}
}

func TestNetSetLimitsAndSecretHeaders(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})

	r := den(t, f, "", "net", "set", "--allow", "api.example.com", "--allow", "*.example.org", "--conn-rate", "0.5", "--max-egress", "100m", "--bandwidth", "1m",
		"--secret-header", "api.example.com=Authorization: Bearer ${TOKEN}", "--secret-header", "x.example.org=X-Key: ${KEY}", "box")
	if r.code != 0 || r.stdout != "allow 10.89.0.2\n" || r.stderr != "" {
		t.Errorf("net set with limits and secret headers: %+v", r)
	}
	want := api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"api.example.com", "*.example.org"}, ConnRate: 0.5, MaxEgress: 100 << 20, Bandwidth: 1 << 20,
		SecretHeaders: []api.SecretHeader{{Host: "api.example.com", Header: "Authorization", Value: "Bearer ${TOKEN}"}, {Host: "x.example.org", Header: "X-Key", Value: "${KEY}"}}}
	if len(f.netSets) != 1 || !reflect.DeepEqual(f.netSets[0], want) {
		t.Errorf("net set sent %+v, want %+v", f.netSets, want)
	}
	// What net show prints can be given back to --secret-header.
	r = den(t, f, "", "net", "show", "box")
	if !strings.Contains(r.stdout, "Headers:     api.example.com=Authorization: Bearer ${TOKEN}\n             x.example.org=X-Key: ${KEY}\n") {
		t.Errorf("net show:\n%s", r.stdout)
	}

	// A value without a reference (the shell expanded it, most likely)
	// is sent, with a warning; so is a header for a host the sandbox may
	// not reach.
	r = den(t, f, "", "net", "set", "--allow", "example.com", "--secret-header", "api.example.com=Authorization: Bearer ", "--secret-header", "api.example.com=X-Literal: abc", "box")
	if r.code != 0 || !strings.Contains(r.stderr, "warning: the --secret-header value for api.example.com has no ${NAME} reference") ||
		!strings.Contains(r.stderr, "single quotes") || !strings.Contains(r.stderr, "not allowed by any --allow") || strings.Contains(r.stderr, "abc") {
		t.Errorf("net set with a literal value: %+v", r)
	}
	if got := f.netSets[len(f.netSets)-1].SecretHeaders; len(got) != 2 || got[0].Value != "Bearer" || got[1].Value != "abc" {
		t.Errorf("net set sent %+v", got)
	}
	// No warning with --allow-cidr (the host may be reached by address),
	// or in open mode.
	for _, args := range [][]string{
		{"net", "set", "--allow-cidr", "192.0.2.0/24", "--secret-header", "api.example.com=A: ${T}", "box"},
		{"net", "set", "--net", "open", "--secret-header", "API.Example.com.=A: ${T}", "box"},
		{"net", "set", "--allow", "*.example.com", "--secret-header", "api.example.com=A: ${T}", "box"},
	} {
		if r := den(t, f, "", args...); r.code != 0 || r.stderr != "" {
			t.Errorf("%q: %+v", args, r)
		}
	}

	// A bad --secret-header is not quoted back: it may hold a secret.
	r = den(t, f, "", "net", "set", "--net", "open", "--secret-header", "api.example.com=Bad Header: hunter2", "box")
	if r.code != 2 || !strings.Contains(r.stderr, "--secret-header") || strings.Contains(r.stderr, "hunter2") {
		t.Errorf("a bad --secret-header: %+v", r)
	}
	f.mu.Lock()
	n := len(f.netSets)
	f.mu.Unlock()
	if n != 5 {
		t.Errorf("%d PUT network, want 5", n)
	}
}

func TestDeniedLine(t *testing.T) {
	if got := deniedLine(nil, "web"); got != "" {
		t.Errorf("no denials: %q", got)
	}
	tcp := func(host string, port, n int, rule string) api.DeniedConn {
		return api.DeniedConn{Host: host, Port: port, Proto: "tcp", Rule: rule, Count: n}
	}
	for _, c := range []struct {
		denied []api.DeniedConn
		want   string
	}{
		{[]api.DeniedConn{tcp("example.com", 443, 1, "name not in allow list")},
			"den: 1 connection denied (example.com:443 name not in allow list): see den net log web"},
		{[]api.DeniedConn{tcp("example.com", 443, 1, "name not in allow list"), tcp("10.0.0.1", 80, 1, "address not public")},
			"den: 2 connections denied (example.com:443 name not in allow list; 10.0.0.1:80 address not public): see den net log web"},
		{[]api.DeniedConn{{Host: "x.example", Port: 53, Proto: "dns", Rule: "name not in allow list", Count: 2}, tcp("2001:db8::1", 80, 3, "address not public"),
			tcp("a", 1, 1, "r"), tcp("b", 2, 1, "r")},
			"den: 7 connections denied (DNS x.example (2 times) name not in allow list; [2001:db8::1]:80 (3 times) address not public; a:1 r; and 1 more): see den net log web"},
	} {
		if got := deniedLine(c.denied, "web"); got != c.want {
			t.Errorf("deniedLine:\n got %q\nwant %q", got, c.want)
		}
	}
}
