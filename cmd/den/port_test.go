package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/api"
)

func TestPort(t *testing.T) {
	t.Setenv("DEN_TOKEN", "t")
	t.Setenv("DEN_DATA", t.TempDir())
	f := newFakeDaemon(t)
	sb := f.addSandbox(api.CreateRequest{Name: "web"})
	sock := strings.TrimPrefix(f.host, "unix://")
	tcpBase := "http://" + strings.TrimPrefix(f.tcpHost, "tcp://")
	_, tcpPort, _ := net.SplitHostPort(strings.TrimPrefix(f.tcpHost, "tcp://"))

	// A daemon on its unix socket only: the curl command that reaches the
	// preview through it.
	f.listeners = []string{f.host}
	r := den(t, f, "", "port", "web", "8000")
	want := "curl --unix-socket " + sock + " 'http://den/preview/" + sb.ID + "/8000/?den_token=tok-8000'\n"
	if r.code != 0 || r.stdout != want || !strings.Contains(r.stderr, "unix socket") {
		t.Errorf("den port over the socket: %+v, want stdout %q", r, want)
	}
	r = den(t, f, "", "port", "--json", "web", "5173")
	var out struct {
		api.Preview
		URL     string `json:"url"`
		HostURL string `json:"host_url"`
		PathURL string `json:"path_url"`
		Socket  string `json:"socket"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.URL != out.Path+"?den_token=tok-5173" || out.PathURL != out.URL || out.Socket != sock {
		t.Errorf("den port --json over the socket: %+v (%v)", r, err)
	}

	// With a TCP listener on loopback and host previews on localhost: over
	// the socket too, the host URL first, then the path URL, both on the
	// TCP listener a browser reaches.
	f.listeners = []string{f.host, f.tcpHost}
	f.previewDomain = "localhost"
	hostURL := "http://8000-" + sb.ID + ".localhost:" + tcpPort + "/?den_token=tok-8000"
	pathURL := tcpBase + "/preview/" + sb.ID + "/8000/?den_token=tok-8000"
	for _, host := range []string{f.host, f.tcpHost} {
		r = den(t, f, "", "port", "--host", host, "web", "8000")
		if want := hostURL + "\n" + pathURL + "\n"; r.code != 0 || r.stdout != want || r.stderr != "" {
			t.Errorf("den port --host %s: %+v, want %q", host, r, want)
		}
	}
	r = den(t, f, "", "port", "--host", f.tcpHost, "--rotate", "web", "8000")
	if !strings.HasPrefix(r.stdout, "http://8000-"+sb.ID+".localhost:"+tcpPort+"/?den_token=tok-8000-rotated\n") {
		t.Errorf("den port --rotate: %+v", r)
	}
	den(t, f, "", "port", "--host", f.tcpHost, "web", "8000") // the fake's token again, for ls below
	r = den(t, f, "", "port", "--host", f.tcpHost, "--public", "web", "3000")
	if want := "http://3000-" + sb.ID + ".localhost:" + tcpPort + "/\n" + tcpBase + "/preview/" + sb.ID + "/3000/\n"; r.code != 0 || r.stdout != want {
		t.Errorf("den port --public: %+v, want %q", r, want)
	}
	r = den(t, f, "", "port", "--json", "--host", f.tcpHost, "web", "5173")
	out.Socket = ""
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Port != 5173 || out.Token != "tok-5173" || out.Public ||
		out.URL != "http://5173-"+sb.ID+".localhost:"+tcpPort+"/?den_token=tok-5173" || out.HostURL != out.URL ||
		out.PathURL != tcpBase+out.Path+"?den_token=tok-5173" || out.Socket != "" {
		t.Errorf("den port --json: %+v (%v)", r, err)
	}

	// ls, with --host before the sub-command too.
	for _, host := range []string{f.tcpHost, f.host} {
		r = den(t, f, "", "port", "--host", host, "ls", "web")
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if r.code != 0 || len(lines) != 4 || !regexp.MustCompile(`^PORT\s+ACCESS\s+URL\s+PATH URL$`).MatchString(lines[0]) ||
			!regexp.MustCompile(`(?m)^3000\s+public\s+`+regexp.QuoteMeta("http://3000-"+sb.ID+".localhost:"+tcpPort+"/")+`\s+`+regexp.QuoteMeta(tcpBase+"/preview/"+sb.ID+"/3000/")+`$`).MatchString(r.stdout) ||
			!regexp.MustCompile(`(?m)^8000\s+private\s+`+regexp.QuoteMeta(hostURL)+`\s+`+regexp.QuoteMeta(pathURL)+`$`).MatchString(r.stdout) {
			t.Errorf("den port --host %s ls:\n%s%s", host, r.stdout, r.stderr)
		}
	}
	f.listeners, f.previewDomain = []string{f.host}, ""
	r = den(t, f, "", "port", "ls", "web")
	if r.code != 0 || !strings.Contains(r.stdout, "curl --unix-socket "+sock+" http://den/preview/"+sb.ID+"/3000/ ") {
		t.Errorf("den port ls over the socket:\n%s", r.stdout)
	}
	r = den(t, f, "", "port", "ls", "--json", "web")
	var outs []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &outs); err != nil || len(outs) != 3 || outs[0]["port"] != 8000.0 || outs[0]["url"] != outs[0]["path"].(string)+"?den_token=tok-8000" {
		t.Errorf("den port ls --json: %+v (%v)", r, err)
	}

	// rm, then the port is gone.
	r = den(t, f, "", "port", "rm", "web", "8000", "5173")
	if r.code != 0 || r.stdout != "8000\n5173\n" {
		t.Errorf("den port rm: %+v", r)
	}
	r = den(t, f, "", "port", "ls", "web")
	if strings.Contains(r.stdout, "8000") || !strings.Contains(r.stdout, "3000") {
		t.Errorf("den port ls after rm:\n%s", r.stdout)
	}
	r = den(t, f, "", "port", "rm", "web", "8000")
	if r.code != 1 || !strings.Contains(r.stderr, "not shared") || !strings.Contains(r.stderr, "hint: run `den port ls ID`") {
		t.Errorf("den port rm of a port not shared: %+v", r)
	}
	r = den(t, f, "", "port", "ls", "--json", "nosuch")
	if r.code != 1 || !strings.Contains(r.stderr, "den ls") {
		t.Errorf("den port ls of no sandbox: %+v", r)
	}
	// The wire: a PortRequest.
	if !logHas(f, "POST /v1/sandboxes/web/ports", "") || !logHas(f, "DELETE /v1/sandboxes/web/ports/5173", "") {
		t.Errorf("requests: %q", f.log)
	}
}

func TestPortErrors(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "web"})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"port", "web"}, "sandbox ID and a PORT"},
		{[]string{"port", "web", "8000", "9000"}, "sandbox ID and a PORT"},
		{[]string{"port", "web", "0"}, `"0" is not a TCP port`},
		{[]string{"port", "web", "http"}, `"http" is not a TCP port`},
		{[]string{"port", "web", "65536"}, "not a TCP port"},
		{[]string{"port", "--rotate", "--public", "web", "8000"}, "--public one has none"},
		{[]string{"port", "--json", "ls", "web"}, `"web" is not a TCP port`},
		{[]string{"port", "ls"}, "one sandbox ID"},
		{[]string{"port", "ls", "--public", "web"}, "--public"},
		{[]string{"port", "rm", "web"}, "sandbox ID and a PORT"},
		{[]string{"port", "rm", "web", "80", "x"}, `"x" is not a TCP port`},
		{[]string{"forward", "web"}, "sandbox ID and [LOCALADDR:]LOCALPORT:PORT"},
		{[]string{"forward", "web", "8000:0"}, `"0" is not a TCP port`},
		{[]string{"forward", "web", "8000:"}, "not a TCP port"},
		{[]string{"forward", "web", "x:8000"}, `"x" is not a local port`},
		{[]string{"forward", "web", "70000:80"}, "not a local port"},
		{[]string{"forward", "web", "::1:80:80"}, "bad forward"},
	} {
		r := den(t, f, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("den %q: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if len(f.ports) != 0 {
		t.Errorf("a usage error shared ports: %v", f.ports)
	}
	r := den(t, f, "", "port", "nosuch", "8000")
	if r.code != 1 || !strings.Contains(r.stderr, `no such sandbox`) {
		t.Errorf("den port of no sandbox: %+v", r)
	}
}

func TestParseForward(t *testing.T) {
	for in, want := range map[string]forwardSpec{
		"8000":                {"127.0.0.1:8000", 8000},
		"9000:8000":           {"127.0.0.1:9000", 8000},
		"0:80":                {"127.0.0.1:0", 80},
		"0.0.0.0:8080:80":     {"0.0.0.0:8080", 80},
		"localhost:8080:80":   {"localhost:8080", 80},
		"[::1]:15432:5432":    {"[::1]:15432", 5432},
		":8080:80":            {":8080", 80},
		"192.0.2.1:65535:443": {"192.0.2.1:65535", 443},
	} {
		got, err := parseForward(verbForward, in)
		if err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", in, got, err, want)
		}
	}
}

func TestForward(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "web"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	old := forwardContext
	forwardContext = func() (context.Context, context.CancelFunc) { return ctx, cancel }
	defer func() { forwardContext = old }()

	stdout, stderr, code := background(f, nil, "forward", "web", "0:8000", "127.0.0.1:0:9")
	var lines []string
	eventually(t, "the forwarding lines", func() bool {
		lines = strings.Split(strings.TrimSpace(stdout.String()), "\n")
		return len(lines) == 2
	})
	addr := regexp.MustCompile(`^forwarding (127\.0\.0\.1:[0-9]+) -> web:8000$`).FindStringSubmatch(lines[0])
	addr9 := regexp.MustCompile(`^forwarding (127\.0\.0\.1:[0-9]+) -> web:9$`).FindStringSubmatch(lines[1])
	if addr == nil || addr9 == nil {
		t.Fatalf("den forward printed %q", lines)
	}

	// Two connections at once, each its own connection inside.
	a, err := net.Dial("tcp", addr[1])
	must(t, err)
	defer a.Close()
	b, err := net.Dial("tcp", addr[1])
	must(t, err)
	defer b.Close()
	for _, c := range []net.Conn{a, b, a} {
		_, err := c.Write([]byte("hello, sandbox\n"))
		must(t, err)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if got := readUntil(t, c, "\n"); got != "HELLO, SANDBOX\n" {
			t.Errorf("read back %q", got)
		}
	}
	f.mu.Lock()
	if f.tcpConns != 2 {
		t.Errorf("%d connections reached the sandbox, want 2", f.tcpConns)
	}
	f.mu.Unlock()

	// Nothing listening inside: the local connection is closed, the error
	// reported, and den keeps forwarding.
	c, err := net.Dial("tcp", addr9[1])
	must(t, err)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("a connection to a port nothing listens on: %d, %v; want EOF", n, err)
	}
	c.Close()
	eventually(t, "the error", func() bool { return strings.Contains(stderr.String(), "nothing answers on port 9") })
	if _, err := b.Write([]byte("still\n")); err != nil || readUntil(t, b, "\n") != "STILL\n" {
		t.Errorf("after a failed connection: %v", err)
	}

	// Ctrl-C ends it.
	cancel()
	select {
	case n := <-code:
		if n != 130 {
			t.Errorf("den forward ended with %d, want 130 (stderr %q)", n, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("den forward did not end after Ctrl-C")
	}
	if _, err := net.Dial("tcp", addr[1]); err == nil {
		t.Error("den forward still listens after it ended")
	}

	// A sandbox that does not exist is an error at once.
	forwardContext = old
	r := den(t, f, "", "forward", "nosuch", "0:80")
	if r.code != 1 || !strings.Contains(r.stderr, "no such sandbox") || r.stdout != "" {
		t.Errorf("den forward to no sandbox: %+v", r)
	}
}

// readUntil reads from r until what it read ends with want.
func readUntil(t *testing.T, r io.Reader, want string) string {
	t.Helper()
	var got []byte
	buf := make([]byte, 1)
	for !strings.HasSuffix(string(got), want) {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Errorf("read %q, then %v; want %q", got, err, want)
			return string(got)
		}
	}
	return string(got)
}
