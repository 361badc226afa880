package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/testenv/e2e"
)

// cliSplit runs den as a CLI against the daemon, as root, and returns its
// stdout, its stderr and its exit code.
func (d *daemon) cliSplit(args ...string) (stdout, stderr string, code int) {
	d.t.Helper()
	cmd := exec.Command(e2e.DenBinary(d.t), args...)
	cmd.Env = []string{"DEN_TEST_RUN_DEN=1", "DEN_HOST=" + d.addr, "DEN_TOKEN=" + d.token, "HOME=/", "PATH=/usr/bin:/bin"}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		d.t.Fatalf("den %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// newNetDaemon is newDaemon with sandbox networking on, on a bridge and
// subnet of its own (removed at the end).
func newNetDaemon(t *testing.T) *daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("den serve needs root")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("sandbox networking needs nft")
	}
	n := os.Getpid() % 100000
	bridge := fmt.Sprintf("dene%d", n)
	t.Cleanup(func() { // after the daemon's own cleanup
		exec.Command("nft", "delete", "table", "inet", "den_"+bridge).Run()
		exec.Command("ip", "link", "del", bridge).Run()
	})
	return newDaemonArgs(t, []string{"--net=true", "--bridge", bridge, "--subnet", fmt.Sprintf("10.203.%d.0/24", n%200)})
}

// den exec names, in one stderr line after the command, the connections
// den refused it, keeping the command's exit code; a command refused
// nothing gets no line; --json has the list.
func TestExecDeniedLine(t *testing.T) {
	d := newNetDaemon(t)
	sb, err := d.c.Create(context.Background(), api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test"}}})
	if err != nil {
		t.Fatalf("create a networked sandbox: %v\n%s", err, d.logText())
	}
	// The control: a command refused nothing prints only its own output.
	out, errOut, code := d.cliSplit("exec", sb.ID, "--", "sh", "-c", "echo fine; exit 4")
	if out != "fine\n" || errOut != "" || code != 4 {
		t.Fatalf("den exec of a command refused nothing: stdout %q, stderr %q, exit %d", out, errOut, code)
	}
	// A request through HTTP_PROXY and a direct connection, both refused.
	script := `curl -sS --max-time 5 -o /dev/null -D - http://other.test/
curl -sS --max-time 5 -o /dev/null -D - --noproxy '*' http://10.1.2.3/
exit 3`
	out, errOut, code = d.cliSplit("exec", sb.ID, "--", "sh", "-c", script)
	if code != 3 {
		t.Errorf("exit %d; want the command's 3 (stderr %q)", code, errOut)
	}
	for _, line := range []string{"HTTP/1.1 403 den egress: name not in allow list\r\n", "HTTP/1.1 403 den egress: address not public\r\n"} {
		if !strings.Contains(out, line) {
			t.Errorf("the command did not see the status line %q:\n%s", line, out)
		}
	}
	want := "den: 2 connections denied (other.test:80 name not in allow list; 10.1.2.3:80 address not public): see den net log " + sb.ID + "\n"
	if errOut != want {
		t.Errorf("stderr:\n%q\nwant\n%q", errOut, want)
	}
	// --json: the list in the result, no line.
	out, errOut, code = d.cliSplit("exec", "--json", sb.ID, "--", "curl", "-s", "--max-time", "5", "http://other.test/")
	var res api.ExecResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 || errOut != "" {
		t.Fatalf("den exec --json: %v, exit %d, stderr %q, stdout %s", err, code, errOut, out)
	}
	if len(res.Denied) != 1 || res.Denied[0].Host != "other.test" || res.Denied[0].Port != 80 || res.Denied[0].Rule != "name not in allow list" || res.Denied[0].Count != 1 {
		t.Errorf("den exec --json: denied %+v", res.Denied)
	}
	if !strings.Contains(out, `"denied": [`) || !strings.Contains(out, `"rule": "name not in allow list"`) {
		t.Errorf("den exec --json does not show the list in snake_case:\n%s", out)
	}
	// MCP's exec tool, where an agent looks, has the list too.
	mcpExec := func(shell string) map[string]any {
		t.Helper()
		ctx := context.Background()
		tr := &sdk.StreamableClientTransport{Endpoint: "http://" + strings.TrimPrefix(d.addr, "tcp://") + "/mcp",
			HTTPClient: &http.Client{Transport: bearerAuth{d.token}}}
		cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "0"}, nil).Connect(ctx, tr, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "exec", Arguments: map[string]any{"sandbox": sb.ID, "shell": shell}})
		if err != nil || res.IsError {
			t.Fatalf("MCP exec: %v %+v", err, res)
		}
		b, _ := json.Marshal(res.StructuredContent)
		var m map[string]any
		json.Unmarshal(b, &m)
		return m
	}
	if got := fmt.Sprint(mcpExec("curl -s --max-time 5 http://other.test/")["denied"]); got != "[map[count:1 host:other.test port:80 proto:tcp reason:name not in allow list rule:name not in allow list]]" {
		t.Errorf("MCP exec: denied %s", got)
	}
	if got, ok := mcpExec("true")["denied"]; ok {
		t.Errorf("MCP exec of a command refused nothing: denied %v", got)
	}
	// den run says it too, naming the sandbox by its full id (its net
	// log outlives --rm).
	out, errOut, code = d.cliSplit("run", "--rm", "--allow", "allowed.test", "--", "curl", "-s", "--max-time", "5", "-o", "/dev/null", "http://other.test/")
	if code != 0 || !strings.HasPrefix(errOut, "den: 1 connection denied (other.test:80 name not in allow list): see den net log ") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("den run: exit %d, stderr %q, stdout %q", code, errOut, out)
	}
}

// bearerAuth sets the daemon's token on MCP requests.
type bearerAuth struct{ token string }

func (b bearerAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}
