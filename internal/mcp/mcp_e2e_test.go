package mcp_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/mcp"
	"github.com/den-dev/den/internal/reexec"
	"github.com/den-dev/den/internal/server"
	"github.com/den-dev/den/internal/storage"
	"github.com/den-dev/den/internal/testenv/e2e"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestMain(m *testing.M) {
	reexec.Run(os.Args[1:])
	code := m.Run()
	e2e.RemoveDenBinary()
	os.Exit(code)
}

// daemon is a real den daemon stack in this process: the API on a unix
// socket (as admin) and on loopback TCP with a bearer token, /mcp mounted
// on both as den serve mounts it.
type daemon struct {
	sock, url, token string
	admin            *client.Client
}

func newDaemon(t *testing.T) *daemon {
	t.Helper()
	st := e2e.New(t, "mcp", func(s *e2e.Stack) {
		sto, err := storage.Open(storage.Config{Dir: s.Data, Mode: "dir"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sto.Close() }) // after the stack's clean-up
		s.Config.Storage = sto
	})
	ip := server.NewInProcess(st.Server)
	st.Server.Mount("/mcp", mcp.HTTPHandler(ip.ClientFor(), mcp.HTTPOptions{Version: "test", User: server.CallerID}))
	d := &daemon{sock: st.Sock, token: "test-token-" + randHex(8), admin: st.Admin}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d.url = "http://" + tl.Addr().String()
	ts := &http.Server{Handler: st.Server.Authenticate(st.Server, d.token)}
	go ts.Serve(tl)
	t.Cleanup(func() {
		ts.Close()
		ip.Close()
	})
	return d
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// session is an MCP client session and the progress notifications it got.
type session struct {
	cs       *sdk.ClientSession
	mu       sync.Mutex
	progress map[string][]string // by progress token
}

func (s *session) onProgress(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := fmt.Sprint(req.Params.ProgressToken)
	s.progress[k] = append(s.progress[k], req.Params.Message)
}

func connect(t *testing.T, tr sdk.Transport) *session {
	t.Helper()
	s := &session{progress: map[string][]string{}}
	c := sdk.NewClient(&sdk.Implementation{Name: "den-test", Version: "1"}, &sdk.ClientOptions{ProgressNotificationHandler: s.onProgress})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	s.cs = cs
	return s
}

// stdio runs `den mcp` against d's unix socket, or with env (like
// DEN_HOST and DEN_TOKEN) against what it names.
func (d *daemon) stdio(t *testing.T, env ...string) *session {
	cmd := exec.Command(e2e.DenBinary(t), "mcp")
	if env == nil {
		env = []string{"DEN_HOST=unix://" + d.sock}
	}
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	return connect(t, &sdk.CommandTransport{Command: cmd})
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// http connects to d's /mcp over TCP with its admin token, or token.
func (d *daemon) http(t *testing.T, token ...string) *session {
	tok := d.token
	if len(token) > 0 {
		tok = token[0]
	}
	return connect(t, &sdk.StreamableClientTransport{Endpoint: d.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{tok}}})
}

func (s *session) call(t *testing.T, name string, args map[string]any, meta sdk.Meta) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := s.cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args, Meta: meta})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	return res
}

func text(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// ok calls a tool that must succeed and decodes its structured result.
func (s *session) ok(t *testing.T, name string, args map[string]any, out any) {
	t.Helper()
	res := s.call(t, name, args, nil)
	if res.IsError {
		t.Fatalf("%s %v: tool error: %s", name, args, text(res))
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil || res.StructuredContent == nil {
		t.Fatalf("%s: no structured result (%v): %s", name, err, text(res))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: decode %s: %v", name, b, err)
		}
	}
}

// fail calls a tool that must fail and returns its message.
func (s *session) fail(t *testing.T, name string, args map[string]any, want ...string) string {
	t.Helper()
	res := s.call(t, name, args, nil)
	msg := text(res)
	if !res.IsError {
		t.Fatalf("%s %v: want a tool error, got %s", name, args, msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("%s %v: error %q lacks %q", name, args, msg, w)
		}
	}
	return msg
}

var allTools = []string{"commit", "diff", "edit_file", "exec", "fork", "glob", "grep", "hibernate", "list_files", "net_policy", "pause", "port_url",
	"process_kill", "process_list", "process_logs", "process_write_stdin", "read_file", "restore", "resume", "sandbox_create",
	"sandbox_list", "sandbox_remove", "snapshot", "write_file"}

type execResult struct {
	ExitCode int              `json:"exit_code"`
	Reason   string           `json:"reason"`
	Signal   string           `json:"signal"`
	Stdout   string           `json:"stdout"`
	Stderr   string           `json:"stderr"`
	Process  *api.ProcessInfo `json:"process"`
}

type logsResult struct {
	Stdout  string          `json:"stdout"`
	Running bool            `json:"running"`
	Exit    *api.ExitStatus `json:"exit"`
}

// exercise runs every tool once through s.
func exercise(t *testing.T, s *session, tag string) {
	ctx := context.Background()
	tools, err := s.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
		if tool.OutputSchema == nil || tool.InputSchema == nil || tool.Description == "" {
			t.Errorf("tool %s: want input and output schemas and a description", tool.Name)
		}
	}
	sort.Strings(names)
	if strings.Join(names, " ") != strings.Join(allTools, " ") {
		t.Errorf("tools = %v, want %v", names, allTools)
	}

	var created struct{ Sandbox api.Sandbox }
	s.ok(t, "sandbox_create", map[string]any{"name": "mcp-" + tag, "labels": map[string]string{"suite": tag}}, &created)
	id := created.Sandbox.ID
	if id == "" || created.Sandbox.State != api.StateRunning {
		t.Fatalf("sandbox_create gave %+v", created.Sandbox)
	}
	var listed struct{ Sandboxes []api.Sandbox }
	s.ok(t, "sandbox_list", map[string]any{"labels": map[string]string{"suite": tag}}, &listed)
	if len(listed.Sandboxes) != 1 || listed.Sandboxes[0].ID != id {
		t.Fatalf("sandbox_list = %+v", listed.Sandboxes)
	}

	var ex execResult
	s.ok(t, "exec", map[string]any{"sandbox": id, "shell": "echo hi; echo err >&2; exit 3"}, &ex)
	if ex.ExitCode != 3 || ex.Stdout != "hi\n" || ex.Stderr != "err\n" || ex.Reason != api.ReasonExited {
		t.Errorf("exec = %+v", ex)
	}
	s.ok(t, "exec", map[string]any{"sandbox": "mcp-" + tag, "cmd": []string{"cat"}, "stdin": "from stdin"}, &ex)
	if ex.Stdout != "from stdin" {
		t.Errorf("exec with stdin by name = %+v", ex)
	}

	// Output streams as progress while the command runs.
	res := s.call(t, "exec", map[string]any{"sandbox": id, "shell": "for i in 1 2 3; do echo line$i; sleep 0.3; done"}, sdk.Meta{"progressToken": "tok-" + tag})
	if res.IsError {
		t.Fatalf("exec with progress: %s", text(res))
	}
	s.mu.Lock()
	got := s.progress["tok-"+tag]
	s.mu.Unlock()
	if strings.Join(got, "") != "line1\nline2\nline3\n" || len(got) < 2 {
		t.Errorf("progress messages = %q, want the output in pieces", got)
	}

	s.ok(t, "exec", map[string]any{"sandbox": id, "shell": "cd /tmp && export X=7", "session": "s"}, nil)
	s.ok(t, "exec", map[string]any{"sandbox": id, "shell": "pwd; echo $X", "session": "s"}, &ex)
	if ex.Stdout != "/tmp\n7\n" {
		t.Errorf("session exec = %q", ex.Stdout)
	}
	s.ok(t, "exec", map[string]any{"sandbox": id, "shell": "sleep 5", "timeout": "300ms"}, &ex)
	if ex.Reason != api.ReasonTimeout {
		t.Errorf("exec with timeout = %+v", ex)
	}

	// Background processes: stdin, logs, list, kill.
	s.ok(t, "exec", map[string]any{"sandbox": id, "cmd": []string{"sh", "-c", "read line; echo got $line"}, "background": true}, &ex)
	if ex.Process == nil || ex.Process.ID == "" {
		t.Fatalf("background exec = %+v", ex)
	}
	p := ex.Process.ID
	s.ok(t, "process_write_stdin", map[string]any{"sandbox": id, "process": p, "data": "hello\n"}, nil)
	var logs logsResult
	s.ok(t, "process_logs", map[string]any{"sandbox": id, "process": p, "wait": "20s"}, &logs)
	if logs.Stdout != "got hello\n" || logs.Running || logs.Exit == nil || logs.Exit.ExitCode != 0 {
		t.Errorf("process_logs = %+v", logs)
	}
	s.ok(t, "exec", map[string]any{"sandbox": id, "cmd": []string{"sleep", "60"}, "background": true, "name": "sleeper"}, &ex)
	p = ex.Process.ID
	var procs struct{ Processes []api.ProcessInfo }
	s.ok(t, "process_list", map[string]any{"sandbox": id}, &procs)
	found := false
	for _, pi := range procs.Processes {
		found = found || (pi.ID == p && pi.State == "running" && pi.Name == "sleeper")
	}
	if !found {
		t.Errorf("process_list lacks running %s: %+v", p, procs.Processes)
	}
	s.ok(t, "process_kill", map[string]any{"sandbox": id, "process": p, "signal": "TERM"}, nil)
	s.ok(t, "process_logs", map[string]any{"sandbox": id, "process": p, "wait": "20s"}, &logs)
	if logs.Exit == nil || logs.Exit.Reason != api.ReasonSignaled {
		t.Errorf("killed process: %+v", logs)
	}

	// Files.
	var wrote struct{ File api.FileInfo }
	s.ok(t, "write_file", map[string]any{"sandbox": id, "path": "/work/a.txt", "content": "one\ntwo\nthree\n"}, &wrote)
	if wrote.File.Size != 14 || wrote.File.Path != "/work/a.txt" {
		t.Errorf("write_file = %+v", wrote.File)
	}
	var rd struct {
		Content    string `json:"content"`
		StartLine  int    `json:"start_line"`
		EndLine    int    `json:"end_line"`
		TotalLines int    `json:"total_lines"`
	}
	s.ok(t, "read_file", map[string]any{"sandbox": id, "path": "/work/a.txt", "offset": 2, "limit": 1}, &rd)
	if rd.Content != "two\n" || rd.StartLine != 2 || rd.EndLine != 2 || rd.TotalLines != 3 {
		t.Errorf("read_file offset 2 limit 1 = %+v", rd)
	}
	s.ok(t, "read_file", map[string]any{"sandbox": id, "path": "/work/a.txt", "tail": 1}, &rd)
	if rd.Content != "three\n" || rd.StartLine != 3 {
		t.Errorf("read_file tail 1 = %+v", rd)
	}
	var ed struct {
		Replacements int `json:"replacements"`
		FirstLine    int `json:"first_line"`
	}
	s.ok(t, "edit_file", map[string]any{"sandbox": id, "path": "/work/a.txt", "old_string": "two\n", "new_string": "TWO\n"}, &ed)
	if ed.Replacements != 1 || ed.FirstLine != 2 {
		t.Errorf("edit_file = %+v", ed)
	}
	s.ok(t, "exec", map[string]any{"sandbox": id, "cmd": []string{"cat", "/work/a.txt"}}, &ex)
	if ex.Stdout != "one\nTWO\nthree\n" {
		t.Errorf("after edit_file: %q", ex.Stdout)
	}
	s.ok(t, "write_file", map[string]any{"sandbox": id, "path": "/work/main.go", "content": "package main\n\nfunc main() {\n\tx := 1\n\tx = 2\n\tx = 2\n}\n"}, nil)
	s.fail(t, "edit_file", map[string]any{"sandbox": id, "path": "/work/main.go", "old_string": "func main() {\n    x := 1\n", "new_string": "y"},
		"nothing was changed", "closest region is lines 3-4", "line 4: indentation differs: old_string has 4 spaces, the file 1 tabs")
	s.fail(t, "edit_file", map[string]any{"sandbox": id, "path": "/work/main.go", "old_string": "\tx = 2\n", "new_string": "\tx = 3\n"},
		"occurs 2 times", "at lines 5, 6", "expected 1")
	s.ok(t, "edit_file", map[string]any{"sandbox": id, "path": "/work/main.go", "old_string": "\tx = 2\n", "new_string": "\tx = 3\n", "expected_count": 2}, &ed)
	if ed.Replacements != 2 {
		t.Errorf("edit_file expected_count 2 = %+v", ed)
	}
	var ls struct{ Entries []api.FileInfo }
	s.ok(t, "list_files", map[string]any{"sandbox": id, "path": "/work"}, &ls)
	if len(ls.Entries) != 2 || ls.Entries[0].Name != "a.txt" || ls.Entries[1].Name != "main.go" {
		t.Errorf("list_files = %+v", ls.Entries)
	}
	var gl api.GlobResult
	s.ok(t, "glob", map[string]any{"sandbox": id, "pattern": "**/*.go", "path": "/work"}, &gl)
	if strings.Join(gl.Matches, ",") != "/work/main.go" {
		t.Errorf("glob = %+v", gl)
	}
	var gr api.GrepResult
	s.ok(t, "grep", map[string]any{"sandbox": id, "pattern": "x = \\d", "path": "/work", "glob": "*.go"}, &gr)
	if len(gr.Matches) != 2 || gr.Matches[0].Line != 5 || gr.Matches[0].Text != "\tx = 3" || gr.Files != 1 {
		t.Errorf("grep = %+v", gr)
	}

	// An edit through a symlink changes its target, keeping its mode.
	s.ok(t, "exec", map[string]any{"sandbox": id, "shell": "chmod 600 /work/a.txt && ln -s a.txt /work/alias"}, nil)
	s.ok(t, "edit_file", map[string]any{"sandbox": id, "path": "/work/alias", "old_string": "one", "new_string": "ONE"}, &ed)
	s.ok(t, "exec", map[string]any{"sandbox": id, "shell": "stat -c %a /work/a.txt; cat /work/a.txt; readlink /work/alias"}, &ex)
	if ex.Stdout != "600\nONE\nTWO\nthree\na.txt\n" {
		t.Errorf("after edit_file through a symlink: %q", ex.Stdout)
	}

	// Ports, network, snapshot, fork, remove.
	var port struct{ URL string }
	s.ok(t, "port_url", map[string]any{"sandbox": id, "port": 8000}, &port)
	if !strings.Contains(port.URL, "/preview/"+id+"/8000/") {
		t.Errorf("port_url = %q", port.URL)
	}
	var np struct{ Network api.NetworkPolicy }
	s.ok(t, "net_policy", map[string]any{"sandbox": id}, &np)
	if np.Network.Mode != "" && np.Network.Mode != "none" {
		t.Errorf("net_policy = %+v", np.Network)
	}
	var snap struct{ Snapshot api.Snapshot }
	s.ok(t, "snapshot", map[string]any{"sandbox": id, "name": "snap-" + tag}, &snap)
	if snap.Snapshot.ID == "" || snap.Snapshot.Name != "snap-"+tag {
		t.Errorf("snapshot = %+v", snap.Snapshot)
	}
	var forks struct{ Sandboxes []api.Sandbox }
	s.ok(t, "fork", map[string]any{"sandbox": id}, &forks)
	if len(forks.Sandboxes) != 1 {
		t.Fatalf("fork = %+v", forks)
	}
	s.ok(t, "read_file", map[string]any{"sandbox": forks.Sandboxes[0].ID, "path": "/work/a.txt"}, &rd)
	if rd.Content != "ONE\nTWO\nthree\n" {
		t.Errorf("the fork's file = %q", rd.Content)
	}
	for _, sid := range []string{forks.Sandboxes[0].ID, id} {
		var rm struct{ Removed string }
		s.ok(t, "sandbox_remove", map[string]any{"sandbox": sid}, &rm)
		if rm.Removed != sid {
			t.Errorf("sandbox_remove = %+v", rm)
		}
	}
	s.ok(t, "sandbox_list", map[string]any{"labels": map[string]string{"suite": tag}}, &listed)
	if len(listed.Sandboxes) != 0 {
		t.Errorf("after sandbox_remove: %+v", listed.Sandboxes)
	}
}

func TestMCPStdio(t *testing.T) {
	d := newDaemon(t)
	exercise(t, d.stdio(t), "stdio")
}

func TestMCPHTTP(t *testing.T) {
	d := newDaemon(t)
	exercise(t, d.http(t), "http")
}

func TestMCPHTTPAuth(t *testing.T) {
	d := newDaemon(t)
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	for name, token := range map[string]string{"no token": "", "wrong token": "nope"} {
		req, _ := http.NewRequest("POST", d.url+"/mcp", strings.NewReader(init))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, resp.StatusCode)
		}
	}
	// The unix socket acts for the admin without a token.
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.sock)
	}}
	s := connect(t, &sdk.StreamableClientTransport{Endpoint: "http://den/mcp", HTTPClient: &http.Client{Transport: tr}})
	s.ok(t, "sandbox_list", map[string]any{}, nil)
}

// TestMCPBadInput: schema errors, unknown sandboxes and paths that try to
// leave the sandbox, over both transports.
func TestMCPBadInput(t *testing.T) {
	d := newDaemon(t)
	for _, tr := range []string{"stdio", "http"} {
		t.Run(tr, func(t *testing.T) {
			s := d.http(t)
			if tr == "stdio" {
				s = d.stdio(t)
			}
			badInput(t, s, tr)
		})
	}
}

func badInput(t *testing.T, s *session, tag string) {
	var created struct{ Sandbox api.Sandbox }
	s.ok(t, "sandbox_create", map[string]any{"name": "bad-" + tag}, &created)
	id := created.Sandbox.ID
	schema := `validating "arguments"`
	t.Run("missing sandbox", func(t *testing.T) {
		s.fail(t, "exec", map[string]any{"cmd": []string{"true"}}, schema, "sandbox")
	})
	t.Run("missing path", func(t *testing.T) {
		s.fail(t, "read_file", map[string]any{"sandbox": id}, schema, "path")
	})
	t.Run("missing old_string", func(t *testing.T) {
		s.fail(t, "edit_file", map[string]any{"sandbox": id, "path": "/x", "new_string": "y"}, schema, "old_string")
	})
	t.Run("sandbox of the wrong type", func(t *testing.T) {
		s.fail(t, "exec", map[string]any{"sandbox": 5, "cmd": []string{"true"}}, schema, "sandbox")
	})
	t.Run("cmd of the wrong type", func(t *testing.T) {
		s.fail(t, "exec", map[string]any{"sandbox": id, "cmd": "true"}, schema, "cmd")
	})
	t.Run("limit of the wrong type", func(t *testing.T) {
		s.fail(t, "read_file", map[string]any{"sandbox": id, "path": "/etc/hostname", "limit": "ten"}, schema, "limit")
	})
	t.Run("unknown argument", func(t *testing.T) {
		s.fail(t, "sandbox_list", map[string]any{"bogus": true}, schema, "bogus")
	})
	t.Run("neither cmd nor shell", func(t *testing.T) {
		s.fail(t, "exec", map[string]any{"sandbox": id}, "invalid", "exactly one of cmd")
	})
	t.Run("bad timeout", func(t *testing.T) {
		s.fail(t, "exec", map[string]any{"sandbox": id, "cmd": []string{"true"}, "timeout": "soon"}, "invalid: timeout")
	})
	t.Run("unknown sandbox", func(t *testing.T) {
		s.fail(t, "exec", map[string]any{"sandbox": "no-such-sandbox", "cmd": []string{"true"}}, `not_found: no sandbox "no-such-sandbox"`, "sandbox_list")
		s.fail(t, "read_file", map[string]any{"sandbox": "no-such-sandbox", "path": "/etc/hostname"}, `no sandbox "no-such-sandbox"`)
	})
	t.Run("unknown process", func(t *testing.T) {
		s.fail(t, "process_kill", map[string]any{"sandbox": id, "process": "p999"}, "not_found", "process_list")
	})
	t.Run("bad glob and regexp", func(t *testing.T) {
		s.fail(t, "glob", map[string]any{"sandbox": id, "pattern": "../*"}, "invalid", "..")
		s.fail(t, "grep", map[string]any{"sandbox": id, "pattern": "(", "path": "/etc"}, "invalid", "pattern")
		s.fail(t, "glob", map[string]any{"sandbox": id, "pattern": "*", "limit": 100000}, "invalid", "limit")
	})

	// A host file the sandbox must never see or change.
	host := t.TempDir()
	secret := filepath.Join(host, "secret")
	if err := os.WriteFile(secret, []byte("SECRET-MARK\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dotdot := strings.Repeat("../", 12) + strings.TrimPrefix(host, "/")
	var ex execResult
	s.ok(t, "exec", map[string]any{"sandbox": id, "shell": "ln -s " + secret + " /root/link && ln -s " + strings.Repeat("../", 12) + " /root/up && ln -s " + host + " /root/hostdir"}, &ex)
	if ex.ExitCode != 0 {
		t.Fatalf("make symlinks: %+v", ex)
	}
	for _, p := range []string{secret, dotdot + "/secret", "/root/link", "/root/up" + secret, "/root/hostdir/secret"} {
		t.Run("read_file "+p, func(t *testing.T) {
			s.fail(t, "read_file", map[string]any{"sandbox": id, "path": p}, "not_found")
		})
		t.Run("edit_file "+p, func(t *testing.T) {
			s.fail(t, "edit_file", map[string]any{"sandbox": id, "path": p, "old_string": "SECRET-MARK", "new_string": "CHANGED"}, "not_found")
		})
	}
	// Writes through .. and a symlink to / land inside the sandbox; one
	// through a symlink to a host directory fails or lands inside too.
	for _, p := range []string{dotdot + "/written", "/root/up" + host + "/written2"} {
		t.Run("write_file "+p, func(t *testing.T) {
			s.ok(t, "write_file", map[string]any{"sandbox": id, "path": p, "content": "inside"}, nil)
		})
	}
	t.Run("write_file through a symlink to a host directory", func(t *testing.T) {
		s.call(t, "write_file", map[string]any{"sandbox": id, "path": "/root/hostdir/written3", "content": "inside"}, nil)
	})
	for _, name := range []string{"written", "written2", "written3"} {
		if _, err := os.Stat(filepath.Join(host, name)); err == nil {
			t.Errorf("write_file wrote %s on the host", name)
		}
	}
	s.ok(t, "exec", map[string]any{"sandbox": id, "cmd": []string{"cat", host + "/written", host + "/written2"}}, &ex)
	if ex.Stdout != "insideinside" {
		t.Errorf("the writes inside the sandbox: %+v", ex)
	}
	if b, _ := os.ReadFile(secret); string(b) != "SECRET-MARK\n" {
		t.Errorf("the host file changed: %q", b)
	}
	t.Run("glob through symlinks and host paths", func(t *testing.T) {
		for _, root := range []string{"/root/up" + host, "/root/hostdir", "/root"} {
			var gl api.GlobResult
			s.ok(t, "glob", map[string]any{"sandbox": id, "pattern": "**/secret", "path": root}, &gl)
			if len(gl.Matches) != 0 {
				t.Errorf("glob **/secret below %s = %v", root, gl.Matches)
			}
		}
	})
	t.Run("grep through symlinks and host paths", func(t *testing.T) {
		for _, root := range []string{"/root", "/root/link", "/root/hostdir", host} {
			res := s.call(t, "grep", map[string]any{"sandbox": id, "pattern": "SECRET-MARK", "path": root}, nil)
			if res.IsError {
				continue // not found inside the sandbox
			}
			b, _ := json.Marshal(res.StructuredContent)
			var gr api.GrepResult
			if err := json.Unmarshal(b, &gr); err != nil || len(gr.Matches) != 0 {
				t.Errorf("grep below %s: %s %v", root, b, err)
			}
		}
	})
}

// TestMCPScopedToken: over both transports, a scoped token's MCP tools see
// and control only that token's sandboxes, as its API calls do.
func TestMCPScopedToken(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	other, err := d.admin.Create(ctx, api.CreateRequest{Name: "admins"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range []string{"stdio", "http"} {
		t.Run(tr, func(t *testing.T) {
			tok, err := d.admin.CreateToken(ctx, api.TokenRequest{Name: "agent-" + tr, MaxSandboxes: 1})
			if err != nil {
				t.Fatal(err)
			}
			var s *session
			if tr == "http" {
				s = d.http(t, tok.Token)
			} else {
				s = d.stdio(t, "DEN_HOST="+d.url, "DEN_TOKEN="+tok.Token)
			}
			var created struct{ Sandbox api.Sandbox }
			s.ok(t, "sandbox_create", map[string]any{"name": "mine-" + tr}, &created)
			var listed struct{ Sandboxes []api.Sandbox }
			s.ok(t, "sandbox_list", map[string]any{}, &listed)
			if len(listed.Sandboxes) != 1 || listed.Sandboxes[0].ID != created.Sandbox.ID {
				t.Errorf("the token's sandbox_list = %+v, want only its own", listed.Sandboxes)
			}
			s.fail(t, "exec", map[string]any{"sandbox": other.ID, "cmd": []string{"true"}}, "no sandbox")
			s.fail(t, "read_file", map[string]any{"sandbox": "admins", "path": "/etc/hostname"}, "no sandbox")
			s.fail(t, "sandbox_remove", map[string]any{"sandbox": other.ID}, "no sandbox")
			s.fail(t, "sandbox_create", map[string]any{"name": "second-" + tr})
			var ex execResult
			s.ok(t, "exec", map[string]any{"sandbox": created.Sandbox.ID, "cmd": []string{"hostname"}}, &ex)
			if ex.Stdout != "mine-"+tr+"\n" {
				t.Errorf("exec in its own sandbox = %+v", ex)
			}
		})
	}
	if _, err := d.admin.Get(ctx, other.ID); err != nil {
		t.Errorf("the admin's sandbox after the token's attempts: %v", err)
	}
}
