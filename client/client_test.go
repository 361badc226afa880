package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/den-dev/den/api"
)

// recorded is one request as the fake daemon saw it.
type recorded struct {
	Method, Path, RawPath, Query string
	Header                       http.Header
	Body                         []byte
}

// fake is a scripted daemon: it records every request and answers with the
// handler set by the test, after checking the route against the contract.
type fake struct {
	t      *testing.T
	mu     sync.Mutex
	reqs   []recorded
	answer http.HandlerFunc
	srv    *httptest.Server
	host   string
}

// routes of docs/api.md, as Go 1.22 mux patterns.
var routes = []string{
	"GET /v1/version",
	"POST /v1/sandboxes",
	"GET /v1/sandboxes",
	"GET /v1/sandboxes/{id}",
	"POST /v1/sandboxes/{id}/stop",
	"POST /v1/sandboxes/{id}/start",
	"DELETE /v1/sandboxes/{id}",
	"POST /v1/sandboxes/{id}/exec",
	"GET /v1/sandboxes/{id}/files",
	"PUT /v1/sandboxes/{id}/files",
	"DELETE /v1/sandboxes/{id}/files",
	"GET /v1/sandboxes/{id}/files/list",
	"GET /v1/sandboxes/{id}/files/stat",
	"POST /v1/sandboxes/{id}/files/mkdir",
	"POST /v1/sandboxes/{id}/files/rename",
	"GET /v1/sandboxes/{id}/archive",
	"PUT /v1/sandboxes/{id}/archive",
	"POST /v1/sandboxes/{id}/processes",
	"GET /v1/sandboxes/{id}/processes",
	"GET /v1/sandboxes/{id}/processes/{proc}",
	"GET /v1/sandboxes/{id}/processes/{proc}/logs",
	"POST /v1/sandboxes/{id}/processes/{proc}/kill",
	"POST /v1/sandboxes/{id}/processes/{proc}/stdin",
	"GET /v1/sandboxes/{id}/processes/{proc}/wait",
	"PUT /v1/sandboxes/{id}/network",
	"POST /v1/sandboxes/{id}/ports",
	"GET /v1/sandboxes/{id}/ports",
	"DELETE /v1/sandboxes/{id}/ports/{port}",
	"GET /v1/sandboxes/{id}/sessions",
	"DELETE /v1/sandboxes/{id}/sessions/{name}",
	"GET /v1/sandboxes/{id}/stats",
	"GET /metrics",
	"PUT /v1/secrets/{name}",
	"GET /v1/secrets",
	"DELETE /v1/secrets/{name}",
	"GET /v1/images",
	"GET /v1/images/{name}",
	"POST /v1/images/import",
	"POST /v1/images/pull",
	"POST /v1/images/build",
	"POST /v1/sandboxes/{id}/commit",
	"GET /v1/images/save",
	"POST /v1/images/prune",
	"DELETE /v1/images/{name}",
	"GET /v1/events",
}

func newFake(t *testing.T, unix bool) *fake {
	f := &fake{t: t}
	mux := http.NewServeMux()
	for _, r := range routes {
		mux.HandleFunc(r, f.serve)
	}
	// Anything else is a request outside the contract.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("request outside the API contract: %s %s", r.Method, r.URL)
		http.Error(w, "no such route", http.StatusTeapot)
	})
	f.srv = httptest.NewUnstartedServer(mux)
	if unix {
		f.host = "unix://" + onUnixSocket(t, f.srv)
	}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	if !unix {
		f.host = "tcp://" + f.srv.Listener.Addr().String()
	}
	return f
}

func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.reqs = append(f.reqs, recorded{r.Method, r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.Header.Clone(), body})
	answer := f.answer
	f.mu.Unlock()
	if answer == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	answer(w, r)
}

func (f *fake) last() recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		f.t.Fatal("no request reached the fake daemon")
	}
	return f.reqs[len(f.reqs)-1]
}

func (f *fake) reset(answer http.HandlerFunc) {
	f.mu.Lock()
	f.reqs, f.answer = nil, answer
	f.mu.Unlock()
}

// onUnixSocket moves an unstarted test server to a unix socket of its own
// (removed at the end of the test) and returns the socket's path.
func onUnixSocket(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "denc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "den.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener.Close()
	srv.Listener = l
	return sock
}

func jsonAnswer(status int, v any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(v)
	}
}

func rawAnswer(status int, ct, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if ct != "" {
			w.Header().Set("Content-Type", ct)
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

var ctx = context.Background()

// TestRequests checks the method, path, query and body of every call of the
// SDK, over TCP and over a unix socket, and what it makes of the answer.
func TestRequests(t *testing.T) {
	for _, transport := range []string{"tcp", "unix"} {
		t.Run(transport, func(t *testing.T) {
			t.Setenv("DEN_TOKEN", "")
			t.Setenv("DEN_DATA", t.TempDir())
			f := newFake(t, transport == "unix")
			c := &Client{Host: f.host, Token: "s3cret"}
			sb := &api.Sandbox{ID: "0123456789abcdef", Name: "web", Image: "host", State: api.StateRunning}
			fi := &api.FileInfo{Name: "a.txt", Path: "/work/a.txt", Type: "file", Size: 3, Mode: 0o644}
			img := &api.Image{Name: "alpine:3.20", ID: "sha256:abc", Size: 42}
			proc := &api.ProcessInfo{ID: "p1", Pid: 42, Cmd: []string{"sleep", "9"}, State: api.ProcRunning,
				Started: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
			ended := &api.ProcessInfo{ID: "p2", Pid: 43, Cmd: []string{"true"}, State: api.ProcExited,
				Started: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), Ended: time.Date(2025, 1, 2, 3, 4, 6, 0, time.UTC),
				Exit: &api.ExitStatus{Reason: api.ReasonExited, Duration: api.Duration(time.Second)}, Output: 12}
			exit := &api.ExitStatus{ExitCode: 3, Reason: api.ReasonExited, Duration: api.Duration(2 * time.Second)}
			preview := &api.Preview{Port: 8000, Token: "t0k", Path: "/preview/0123456789abcdef/8000/"}
			public := &api.Preview{Port: 3000, Public: true, Path: "/preview/0123456789abcdef/3000/", Host: "3000-0123456789ab.example.test"}
			session := &api.Session{Name: "s1", Pid: 12, Started: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), Busy: true}
			stats := &api.Stats{ID: "0123456789abcdef", CPU: api.Duration(1500 * time.Millisecond), Memory: 10 << 20,
				MemoryLimit: 512 << 20, Pids: 3, PidsLimit: 100, Disk: 4096, NetRxBytes: 10, NetTxBytes: 20,
				Usage: api.Usage{CPUSeconds: 12.5, MemoryGiBHours: 0.25, AliveSeconds: 3600, ActiveSeconds: 60, EgressBytes: 20}}

			type tc struct {
				name   string
				answer http.HandlerFunc
				call   func() (any, error)
				method string
				path   string
				query  string
				body   string // JSON compared semantically when it starts with {
				want   any
			}
			cases := []tc{
				{"version", jsonAnswer(200, api.VersionInfo{Version: "1.2", Runtimes: []string{"linux"}}),
					func() (any, error) { return c.Version(ctx) },
					"GET", "/v1/version", "", "", &api.VersionInfo{Version: "1.2", Runtimes: []string{"linux"}}},
				{"create", jsonAnswer(201, sb),
					func() (any, error) {
						return c.Create(ctx, api.CreateRequest{Name: "web", Labels: map[string]string{"a": "b"},
							Limits: api.Limits{Memory: 512 << 20}, TTL: api.Duration(time.Hour)})
					},
					"POST", "/v1/sandboxes", "",
					`{"name":"web","labels":{"a":"b"},"limits":{"memory":536870912},"ttl":"1h0m0s"}`, sb},
				{"create with network", jsonAnswer(201, sb),
					func() (any, error) {
						return c.Create(ctx, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"example.com"}}})
					},
					"POST", "/v1/sandboxes", "", `{"network":{"mode":"allow","allow":["example.com"]}}`, sb},
				{"set network", jsonAnswer(200, sb),
					func() (any, error) {
						return c.SetNetwork(ctx, "web", api.NetworkPolicy{Mode: api.NetOpen, Deny: []string{"x.example"}, AllowCIDR: []string{"10.0.0.0/8"}})
					},
					"PUT", "/v1/sandboxes/web/network", "", `{"mode":"open","deny":["x.example"],"allow_cidr":["10.0.0.0/8"]}`, sb},
				{"share port", jsonAnswer(201, preview),
					func() (any, error) { return c.SharePort(ctx, "web", 8000, false) },
					"POST", "/v1/sandboxes/web/ports", "", `{"port":8000}`, preview},
				{"share port public", jsonAnswer(201, public),
					func() (any, error) { return c.SharePort(ctx, "web", 3000, true) },
					"POST", "/v1/sandboxes/web/ports", "", `{"port":3000,"public":true}`, public},
				{"ports", jsonAnswer(200, []*api.Preview{public, preview}),
					func() (any, error) { return c.Ports(ctx, "web") },
					"GET", "/v1/sandboxes/web/ports", "", "", []*api.Preview{public, preview}},
				{"unshare port", nil,
					func() (any, error) { return nil, c.UnsharePort(ctx, "web", 8000) },
					"DELETE", "/v1/sandboxes/web/ports/8000", "", "", nil},
				{"list", jsonAnswer(200, []*api.Sandbox{sb}),
					func() (any, error) { return c.List(ctx, map[string]string{"b": "2", "a": "1"}) },
					"GET", "/v1/sandboxes", "label=a%3D1&label=b%3D2", "", []*api.Sandbox{sb}},
				{"list all", jsonAnswer(200, []*api.Sandbox{}),
					func() (any, error) { return c.List(ctx, nil) },
					"GET", "/v1/sandboxes", "", "", []*api.Sandbox{}},
				{"get", jsonAnswer(200, sb),
					func() (any, error) { return c.Get(ctx, "web") },
					"GET", "/v1/sandboxes/web", "", "", sb},
				{"stop", jsonAnswer(200, sb),
					func() (any, error) { return c.Stop(ctx, "0123") },
					"POST", "/v1/sandboxes/0123/stop", "", "", sb},
				{"start", jsonAnswer(200, sb),
					func() (any, error) { return c.Start(ctx, "0123") },
					"POST", "/v1/sandboxes/0123/start", "", "", sb},
				{"remove force", nil,
					func() (any, error) { return nil, c.Remove(ctx, "0123", true) },
					"DELETE", "/v1/sandboxes/0123", "force=true", "", nil},
				{"remove", nil,
					func() (any, error) { return nil, c.Remove(ctx, "0123", false) },
					"DELETE", "/v1/sandboxes/0123", "", "", nil},
				{"exec", jsonAnswer(200, api.ExecResult{ExitStatus: api.ExitStatus{ExitCode: 3, Reason: api.ReasonExited}, Stdout: []byte("hi\n")}),
					func() (any, error) {
						return c.Exec(ctx, "web", api.ExecRequest{Cmd: []string{"echo", "hi"}, Stdin: []byte("in"), Timeout: api.Duration(30 * time.Second)})
					},
					"POST", "/v1/sandboxes/web/exec", "", `{"cmd":["echo","hi"],"stdin":"aW4=","timeout":"30s"}`,
					&api.ExecResult{ExitStatus: api.ExitStatus{ExitCode: 3, Reason: api.ReasonExited}, Stdout: []byte("hi\n")}},
				{"write file", jsonAnswer(200, fi),
					func() (any, error) { return c.WriteFile(ctx, "web", "/work/a.txt", strings.NewReader("abc"), 0o640) },
					"PUT", "/v1/sandboxes/web/files", "mode=0640&path=%2Fwork%2Fa.txt", "abc", fi},
				{"write file setuid", jsonAnswer(200, fi),
					func() (any, error) {
						return c.WriteFile(ctx, "web", "/bin/x", strings.NewReader(""), 0o755|os.ModeSetuid)
					},
					"PUT", "/v1/sandboxes/web/files", "mode=04755&path=%2Fbin%2Fx", "", fi},
				{"list dir", jsonAnswer(200, []*api.FileInfo{fi}),
					func() (any, error) { return c.ListDir(ctx, "web", "/work") },
					"GET", "/v1/sandboxes/web/files/list", "path=%2Fwork", "", []*api.FileInfo{fi}},
				{"stat", jsonAnswer(200, fi),
					func() (any, error) { return c.Stat(ctx, "web", "/work/a.txt") },
					"GET", "/v1/sandboxes/web/files/stat", "path=%2Fwork%2Fa.txt", "", fi},
				{"mkdir", jsonAnswer(200, fi),
					func() (any, error) { return c.Mkdir(ctx, "web", "/a/b", 0o700, true) },
					"POST", "/v1/sandboxes/web/files/mkdir", "", `{"path":"/a/b","mode":448,"parents":true}`, fi},
				{"rename", jsonAnswer(200, fi),
					func() (any, error) { return c.Rename(ctx, "web", "/a", "/b") },
					"POST", "/v1/sandboxes/web/files/rename", "", `{"from":"/a","to":"/b"}`, fi},
				{"remove file", nil,
					func() (any, error) { return nil, c.RemoveFile(ctx, "web", "/a", true) },
					"DELETE", "/v1/sandboxes/web/files", "path=%2Fa&recursive=true", "", nil},
				{"upload", nil,
					func() (any, error) { return nil, c.Upload(ctx, "web", "/work", strings.NewReader("TARBYTES")) },
					"PUT", "/v1/sandboxes/web/archive", "path=%2Fwork", "TARBYTES", nil},
				{"images", jsonAnswer(200, []*api.Image{img}),
					func() (any, error) { return c.Images(ctx) },
					"GET", "/v1/images", "", "", []*api.Image{img}},
				{"image", jsonAnswer(200, img),
					func() (any, error) { return c.Image(ctx, "alpine:3.20") },
					"GET", "/v1/images/alpine:3.20", "", "", img},
				{"image with slash", jsonAnswer(200, img),
					func() (any, error) { return c.Image(ctx, "docker.io/library/alpine:3.20") },
					"GET", "/v1/images/docker.io/library/alpine:3.20", "", "", img},
				{"remove image", nil,
					func() (any, error) { return nil, c.RemoveImage(ctx, "alpine:3.20") },
					"DELETE", "/v1/images/alpine:3.20", "", "", nil},
				{"import", jsonAnswer(200, []*api.Image{img}),
					func() (any, error) { return c.ImportImage(ctx, "alpine:3.20", strings.NewReader("OCI"), nil) },
					"POST", "/v1/images/import", "name=alpine%3A3.20", "OCI", []*api.Image{img}},
				{"pull", jsonAnswer(200, img),
					func() (any, error) {
						return c.PullImage(ctx, api.PullRequest{Ref: "alpine:3.20", Name: "a", Username: "u", Password: "p", Insecure: true, Platform: "linux/arm64"}, nil)
					},
					"POST", "/v1/images/pull", "",
					`{"ref":"alpine:3.20","name":"a","username":"u","password":"p","insecure":true,"platform":"linux/arm64"}`, img},
				{"commit", jsonAnswer(201, img),
					func() (any, error) { return c.Commit(ctx, "web", api.CommitRequest{Name: "snap:1"}) },
					"POST", "/v1/sandboxes/web/commit", "", `{"name":"snap:1"}`, img},
				{"commit with config", jsonAnswer(201, img),
					func() (any, error) {
						return c.Commit(ctx, "web", api.CommitRequest{Name: "snap:1", Config: &api.ImageConfig{Workdir: "/src", Cmd: []string{"make"}}})
					},
					"POST", "/v1/sandboxes/web/commit", "", `{"name":"snap:1","config":{"workdir":"/src","cmd":["make"]}}`, img},
				{"prune", jsonAnswer(200, map[string]any{"images": []string{"den-cache/x"}, "layers": 3}),
					func() (any, error) {
						imgs, n, err := c.PruneImages(ctx)
						return map[string]any{"images": imgs, "layers": n}, err
					},
					"POST", "/v1/images/prune", "", "", map[string]any{"images": []string{"den-cache/x"}, "layers": 3}},
				{"events", jsonAnswer(200, []*api.Event{{Seq: 7, Type: "exec.end", Time: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}}),
					func() (any, error) {
						return c.Events(ctx, EventFilter{Sandbox: "0123", Type: "exec.", After: 6, Limit: 10,
							Since: time.Date(2025, 1, 2, 3, 4, 5, 0, time.FixedZone("X", 3600))})
					},
					"GET", "/v1/events", "after=6&limit=10&sandbox=0123&since=2025-01-02T02%3A04%3A05Z&type=exec.", "",
					[]*api.Event{{Seq: 7, Type: "exec.end", Time: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}}},
				{"start process", jsonAnswer(201, proc),
					func() (any, error) {
						return c.StartProcess(ctx, "web", api.ExecRequest{Cmd: []string{"sleep", "9"}, Env: []string{"A=1"}, Timeout: api.Duration(time.Minute)})
					},
					"POST", "/v1/sandboxes/web/processes", "", `{"cmd":["sleep","9"],"env":["A=1"],"timeout":"1m0s"}`, proc},
				{"processes", jsonAnswer(200, []*api.ProcessInfo{proc, ended}),
					func() (any, error) { return c.Processes(ctx, "web") },
					"GET", "/v1/sandboxes/web/processes", "", "", []*api.ProcessInfo{proc, ended}},
				{"process", jsonAnswer(200, ended),
					func() (any, error) { return c.Process(ctx, "web", "p2") },
					"GET", "/v1/sandboxes/web/processes/p2", "", "", ended},
				{"kill", nil,
					func() (any, error) { return nil, c.Kill(ctx, "web", "p1", "TERM") },
					"POST", "/v1/sandboxes/web/processes/p1/kill", "", `{"signal":"TERM"}`, nil},
				{"kill default", nil,
					func() (any, error) { return nil, c.Kill(ctx, "web", "p1", "") },
					"POST", "/v1/sandboxes/web/processes/p1/kill", "", `{}`, nil},
				{"stdin", nil,
					func() (any, error) { return nil, c.WriteStdin(ctx, "web", "p1", strings.NewReader("input\n"), false) },
					"POST", "/v1/sandboxes/web/processes/p1/stdin", "", "input\n", nil},
				{"stdin close", nil,
					func() (any, error) { return nil, c.WriteStdin(ctx, "web", "p1", nil, true) },
					"POST", "/v1/sandboxes/web/processes/p1/stdin", "close=true", "", nil},
				{"wait", jsonAnswer(200, exit),
					func() (any, error) { return c.Wait(ctx, "web", "p1") },
					"GET", "/v1/sandboxes/web/processes/p1/wait", "", "", exit},
				{"start service", jsonAnswer(201, proc),
					func() (any, error) {
						return c.StartProcess(ctx, "web", api.ExecRequest{Cmd: []string{"srv"}, Restart: "on-failure", Name: "api"})
					},
					"POST", "/v1/sandboxes/web/processes", "", `{"cmd":["srv"],"restart":"on-failure","name":"api"}`, proc},
				{"start tty", jsonAnswer(201, proc),
					func() (any, error) {
						return c.StartProcess(ctx, "web", api.ExecRequest{Cmd: []string{"bash"}, TTY: true, Rows: 40, Cols: 120})
					},
					"POST", "/v1/sandboxes/web/processes", "", `{"cmd":["bash"],"tty":true,"rows":40,"cols":120}`, proc},
				{"session exec", jsonAnswer(200, api.ExecResult{ExitStatus: api.ExitStatus{Reason: api.ReasonExited}}),
					func() (any, error) {
						return c.Exec(ctx, "web", api.ExecRequest{Shell: "cd src", Session: "s1"})
					},
					"POST", "/v1/sandboxes/web/exec", "", `{"shell":"cd src","session":"s1"}`,
					&api.ExecResult{ExitStatus: api.ExitStatus{Reason: api.ReasonExited}}},
				{"sessions", jsonAnswer(200, []*api.Session{session}),
					func() (any, error) { return c.Sessions(ctx, "web") },
					"GET", "/v1/sandboxes/web/sessions", "", "", []*api.Session{session}},
				{"close session", nil,
					func() (any, error) { return nil, c.CloseSession(ctx, "web", "s 1") },
					"DELETE", "/v1/sandboxes/web/sessions/s 1", "", "", nil},
				{"stats", jsonAnswer(200, stats),
					func() (any, error) { return c.Stats(ctx, "web") },
					"GET", "/v1/sandboxes/web/stats", "", "", stats},
				{"set secret", nil,
					func() (any, error) { return nil, c.SetSecret(ctx, "TOKEN", []byte("s3\x00cr{et}\n")) },
					"PUT", "/v1/secrets/TOKEN", "", "s3\x00cr{et}\n", nil},
				{"secrets", jsonAnswer(200, []string{"A", "TOKEN"}),
					func() (any, error) { return c.Secrets(ctx) },
					"GET", "/v1/secrets", "", "", []string{"A", "TOKEN"}},
				{"delete secret", nil,
					func() (any, error) { return nil, c.DeleteSecret(ctx, "TOKEN") },
					"DELETE", "/v1/secrets/TOKEN", "", "", nil},
				{"set network with limits", jsonAnswer(200, sb),
					func() (any, error) {
						return c.SetNetwork(ctx, "web", api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"api.example.com"}, ConnRate: 2.5, MaxEgress: 1 << 30, Bandwidth: 1 << 20,
							SecretHeaders: []api.SecretHeader{{Host: "api.example.com", Header: "Authorization", Value: "Bearer ${TOKEN}"}}})
					},
					"PUT", "/v1/sandboxes/web/network", "",
					`{"mode":"allow","allow":["api.example.com"],"conn_rate":2.5,"max_egress":1073741824,"bandwidth":1048576,"secret_headers":[{"host":"api.example.com","header":"Authorization","value":"Bearer ${TOKEN}"}]}`, sb},
				{"metrics", rawAnswer(200, "text/plain; version=0.0.4", "den_sandboxes{state=\"running\"} 1\n"),
					func() (any, error) { return c.Metrics(ctx) },
					"GET", "/metrics", "", "", "den_sandboxes{state=\"running\"} 1\n"},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					f.reset(tc.answer)
					got, err := tc.call()
					if err != nil {
						t.Fatalf("error: %v", err)
					}
					r := f.last()
					if r.Method != tc.method || r.Path != tc.path {
						t.Errorf("request %s %s, want %s %s", r.Method, r.Path, tc.method, tc.path)
					}
					if r.Query != tc.query {
						t.Errorf("query %q, want %q", r.Query, tc.query)
					}
					if strings.HasPrefix(tc.body, "{") {
						var g, w any
						if err := json.Unmarshal(r.Body, &g); err != nil {
							t.Fatalf("body %q is not JSON: %v", r.Body, err)
						}
						json.Unmarshal([]byte(tc.body), &w)
						if !reflect.DeepEqual(g, w) {
							t.Errorf("body %s, want %s", r.Body, tc.body)
						}
						if ct := r.Header.Get("Content-Type"); ct != "application/json" {
							t.Errorf("Content-Type %q for a JSON body", ct)
						}
					} else if string(r.Body) != tc.body {
						t.Errorf("body %q, want %q", r.Body, tc.body)
					}
					if auth := r.Header.Get("Authorization"); auth != "Bearer s3cret" {
						t.Errorf("Authorization %q, want the bearer token", auth)
					}
					if tc.want != nil && !reflect.DeepEqual(got, tc.want) {
						gj, _ := json.Marshal(got)
						wj, _ := json.Marshal(tc.want)
						t.Errorf("result %s, want %s", gj, wj)
					}
				})
			}
		})
	}
}

func TestImageNameEscaping(t *testing.T) {
	f := newFake(t, false)
	c := New(f.host)
	f.reset(nil)
	if err := c.RemoveImage(ctx, "reg.example/a/b:1"); err != nil {
		t.Fatal(err)
	}
	// The name is one path segment: its slashes are escaped on the wire.
	if r := f.last(); r.RawPath != "/v1/images/reg.example%2Fa%2Fb:1" {
		t.Errorf("raw path %q", r.RawPath)
	}
}

func TestStreams(t *testing.T) {
	f := newFake(t, true)
	c := New(f.host)
	f.reset(rawAnswer(200, "application/octet-stream", "file bytes"))
	rc, err := c.ReadFile(ctx, "web", "/etc/hostname")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "file bytes" {
		t.Errorf("ReadFile gave %q", b)
	}
	r := f.last()
	if r.Method != "GET" || r.Path != "/v1/sandboxes/web/files" || r.Query != "path=%2Fetc%2Fhostname" {
		t.Errorf("ReadFile sent %s %s?%s", r.Method, r.Path, r.Query)
	}

	f.reset(rawAnswer(200, "application/x-tar", "TAR"))
	rc, err = c.Download(ctx, "web", "/src")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(rc)
	rc.Close()
	if string(b) != "TAR" {
		t.Errorf("Download gave %q", b)
	}
	if r := f.last(); r.Path != "/v1/sandboxes/web/archive" || r.Query != "path=%2Fsrc" {
		t.Errorf("Download sent %s?%s", r.Path, r.Query)
	}

	// An error status is an error before any byte is returned.
	f.reset(jsonAnswer(404, api.ErrorDoc{Error: &api.Error{Kind: api.KindNotFound, Message: "no such file /x"}}))
	if _, err := c.ReadFile(ctx, "web", "/x"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("ReadFile of a missing file: %v", err)
	}
}

func TestErrorDecoding(t *testing.T) {
	f := newFake(t, false)
	c := New(f.host)

	f.reset(jsonAnswer(400, api.ErrorDoc{Error: &api.Error{Kind: api.KindInvalid, Message: "limits.memory: bad size", Field: "limits.memory"}}))
	_, err := c.Create(ctx, api.CreateRequest{})
	var e *api.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %T %v is not an *api.Error", err, err)
	}
	if e.Kind != api.KindInvalid || e.Field != "limits.memory" || e.Message != "limits.memory: bad size" {
		t.Errorf("decoded %+v", e)
	}
	if !errors.Is(err, api.ErrInvalid) {
		t.Error("errors.Is(err, api.ErrInvalid) is false")
	}

	f.reset(jsonAnswer(409, api.ErrorDoc{Error: &api.Error{Kind: api.KindConflict, Message: "sandbox is running"}}))
	if err := c.Remove(ctx, "x", false); !errors.Is(err, api.ErrConflict) || err.Error() != "sandbox is running" {
		t.Errorf("Remove: %v", err)
	}

	// Not an error document: the status and the start of the body.
	long := "<html>" + strings.Repeat("gateway trouble ", 40) + "</html>"
	f.reset(rawAnswer(502, "text/html", long))
	_, err = c.Get(ctx, "x")
	if !errors.As(err, &e) {
		t.Fatalf("error %T %v is not an *api.Error", err, err)
	}
	if e.Kind != api.KindInternal || !strings.Contains(e.Message, "502") || !strings.Contains(e.Message, "<html>gateway trouble") {
		t.Errorf("synthesized %+v", e)
	}
	if strings.Contains(e.Message, "</html>") || len(e.Message) > 200+40 {
		t.Errorf("synthesized message is not cut to 200 bytes of body: %d bytes", len(e.Message))
	}

	f.reset(rawAnswer(404, "text/plain", "404 page not found\n"))
	if _, err := c.Get(ctx, "x"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("plain 404: %v", err)
	}
	f.reset(rawAnswer(401, "", ""))
	if _, err := c.Version(ctx); api.KindOf(err) != api.KindUnauthorized {
		t.Errorf("bare 401: %v", err)
	}

	// A 2xx answer that is not the promised JSON.
	f.reset(rawAnswer(200, "application/json", "{"))
	if _, err := c.Get(ctx, "x"); err == nil || !strings.Contains(err.Error(), "decode") {
		t.Errorf("bad JSON answer: %v", err)
	}

	if _, err := c.Get(ctx, ""); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("empty id: %v", err)
	}
}

// frames builds a framed stream.
func frames(t *testing.T, fs ...func(io.Writer) error) string {
	var b bytes.Buffer
	for _, f := range fs {
		if err := f(&b); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

func raw(typ byte, s string) func(io.Writer) error {
	return func(w io.Writer) error { return api.WriteFrame(w, typ, []byte(s)) }
}

func jsonFrame(typ byte, v any) func(io.Writer) error {
	return func(w io.Writer) error { return api.WriteJSONFrame(w, typ, v) }
}

func TestExecStream(t *testing.T) {
	f := newFake(t, true)
	c := New(f.host)
	req := api.ExecRequest{Cmd: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}

	stream := frames(t,
		jsonFrame(api.FrameStarted, api.Process{ID: "p1", Pid: 42}),
		raw(api.FrameStdout, "out 1\n"),
		raw(api.FrameStderr, "err 1"),
		jsonFrame(api.FrameDropped, api.DroppedOutput{Bytes: 4096}),
		raw(api.FrameStdout, "out 2\n"),
		raw(api.FrameStderr, "err 2\n"),
		jsonFrame(api.FrameExit, api.ExitStatus{ExitCode: 3, Reason: api.ReasonExited, Duration: api.Duration(time.Second)}),
	)
	f.reset(rawAnswer(200, api.StreamContentType, stream))
	var stdout, stderr bytes.Buffer
	st, err := c.ExecStream(ctx, "web", req, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if st.ExitCode != 3 || st.Reason != api.ReasonExited || st.Duration.D() != time.Second {
		t.Errorf("status %+v", st)
	}
	if stdout.String() != "out 1\nout 2\n" {
		t.Errorf("stdout %q", stdout.String())
	}
	wantErr := "err 1\n[den: 4096 bytes of output dropped: the reader fell behind]\nerr 2\n"
	if stderr.String() != wantErr {
		t.Errorf("stderr %q, want %q", stderr.String(), wantErr)
	}
	r := f.last()
	if r.Header.Get("Accept") != api.StreamContentType {
		t.Errorf("Accept %q", r.Header.Get("Accept"))
	}
	var sent api.ExecRequest
	if err := json.Unmarshal(r.Body, &sent); err != nil || !reflect.DeepEqual(sent, req) {
		t.Errorf("sent %s (%v)", r.Body, err)
	}

	// An error frame ends the stream with an *api.Error.
	f.reset(rawAnswer(200, api.StreamContentType, frames(t,
		raw(api.FrameStdout, "partial"),
		jsonFrame(api.FrameError, api.Error{Kind: api.KindConflict, Message: "sandbox stopped"}))))
	stdout.Reset()
	_, err = c.ExecStream(ctx, "web", req, &stdout, nil)
	var e *api.Error
	if !errors.As(err, &e) || e.Kind != api.KindConflict || e.Message != "sandbox stopped" {
		t.Errorf("error frame gave %T %v", err, err)
	}
	if stdout.String() != "partial" {
		t.Errorf("stdout before the error %q", stdout.String())
	}

	// A stream cut before the exit frame is an error.
	f.reset(rawAnswer(200, api.StreamContentType, frames(t, raw(api.FrameStdout, "x"))))
	if _, err := c.ExecStream(ctx, "web", req, nil, nil); err == nil || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut stream: %v", err)
	}

	// A daemon answering the JSON form still works.
	f.reset(jsonAnswer(200, api.ExecResult{ExitStatus: api.ExitStatus{Reason: api.ReasonSignaled, Signal: "SIGKILL"}, Stdout: []byte("o"), Stderr: []byte("e")}))
	stdout.Reset()
	stderr.Reset()
	st, err = c.ExecStream(ctx, "web", req, &stdout, &stderr)
	if err != nil || st.Signal != "SIGKILL" || stdout.String() != "o" || stderr.String() != "e" {
		t.Errorf("JSON fallback: %+v %v %q %q", st, err, stdout.String(), stderr.String())
	}

	// An error status before the stream.
	f.reset(jsonAnswer(404, api.ErrorDoc{Error: &api.Error{Kind: api.KindNotFound, Message: "no sandbox web"}}))
	if _, err := c.ExecStream(ctx, "web", req, nil, nil); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("404: %v", err)
	}
}

func TestLogs(t *testing.T) {
	f := newFake(t, true)
	c := New(f.host)
	since := time.Date(2025, 1, 2, 3, 4, 5, 600, time.FixedZone("X", 3600))

	// A finished process: its output, then its exit status.
	f.reset(rawAnswer(200, api.StreamContentType, frames(t,
		raw(api.FrameStdout, "out\n"),
		raw(api.FrameStderr, "err"),
		jsonFrame(api.FrameDropped, api.DroppedOutput{Bytes: 10}),
		raw(api.FrameStdout, "more\n"),
		jsonFrame(api.FrameExit, api.ExitStatus{ExitCode: 2, Reason: api.ReasonExited}))))
	var stdout, stderr bytes.Buffer
	st, err := c.Logs(ctx, "web", "p1", LogsOptions{Tail: 5, Since: since}, &stdout, &stderr)
	if err != nil || st == nil || st.ExitCode != 2 {
		t.Fatalf("logs of an ended process: %+v, %v", st, err)
	}
	if stdout.String() != "out\nmore\n" || stderr.String() != "err\n[den: 10 bytes of output dropped: the reader fell behind]\n" {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
	r := f.last()
	if r.Method != "GET" || r.Path != "/v1/sandboxes/web/processes/p1/logs" || r.Query != "since=2025-01-02T02%3A04%3A05.0000006Z&tail=5" {
		t.Errorf("logs sent %s %s?%s", r.Method, r.Path, r.Query)
	}
	if r.Header.Get("Accept") != api.StreamContentType {
		t.Errorf("Accept %q", r.Header.Get("Accept"))
	}

	// A running process without follow: the stream ends with no status.
	f.reset(rawAnswer(200, api.StreamContentType, frames(t, raw(api.FrameStdout, "so far"))))
	stdout.Reset()
	st, err = c.Logs(ctx, "web", "p1", LogsOptions{}, &stdout, nil)
	if err != nil || st != nil || stdout.String() != "so far" {
		t.Errorf("logs of a running process: %+v, %v, %q", st, err, stdout.String())
	}
	if r := f.last(); r.Query != "" {
		t.Errorf("logs without options sent query %q", r.Query)
	}

	// With follow the same end is an error: the process has not ended.
	st, err = c.Logs(ctx, "web", "p1", LogsOptions{Follow: true}, nil, nil)
	if st != nil || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("follow cut short: %+v, %v", st, err)
	}
	if r := f.last(); r.Query != "follow=true" {
		t.Errorf("follow sent query %q", r.Query)
	}
	// A negative Tail asks for none of the retained output.
	c.Logs(ctx, "web", "p1", LogsOptions{Follow: true, Tail: -1}, nil, nil)
	if r := f.last(); r.Query != "follow=true&tail=0" {
		t.Errorf("negative tail sent query %q", r.Query)
	}

	// A frame cut in the middle is an error either way.
	cut := frames(t, raw(api.FrameStdout, "abc"))
	f.reset(rawAnswer(200, api.StreamContentType, cut[:len(cut)-1]))
	if _, err := c.Logs(ctx, "web", "p1", LogsOptions{}, nil, nil); err == nil || !strings.Contains(err.Error(), "logs output stream") {
		t.Errorf("cut frame: %v", err)
	}

	// An error frame.
	f.reset(rawAnswer(200, api.StreamContentType, frames(t, jsonFrame(api.FrameError, api.Error{Kind: api.KindConflict, Message: "sandbox stopped"}))))
	if _, err := c.Logs(ctx, "web", "p1", LogsOptions{Follow: true}, nil, nil); !errors.Is(err, api.ErrConflict) {
		t.Errorf("error frame: %v", err)
	}

	// An error status.
	f.reset(jsonAnswer(404, api.ErrorDoc{Error: &api.Error{Kind: api.KindNotFound, Message: "no process p9"}}))
	if _, err := c.Logs(ctx, "web", "p9", LogsOptions{}, nil, nil); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("404: %v", err)
	}
}

func TestProcessIDs(t *testing.T) {
	f := newFake(t, false)
	c := New(f.host)
	f.reset(nil)
	if err := c.WriteStdin(ctx, "web", "a/b c", strings.NewReader("x"), true); err != nil {
		t.Fatal(err)
	}
	r := f.last()
	if r.RawPath != "/v1/sandboxes/web/processes/a%2Fb%20c/stdin" || r.Query != "close=true" {
		t.Errorf("raw path %q query %q", r.RawPath, r.Query)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/octet-stream" {
		t.Errorf("stdin Content-Type %q", ct)
	}
	for name, call := range map[string]func() error{
		"process": func() error { _, err := c.Process(ctx, "web", ""); return err },
		"logs":    func() error { _, err := c.Logs(ctx, "web", "", LogsOptions{}, nil, nil); return err },
		"kill":    func() error { return c.Kill(ctx, "web", "", "") },
		"stdin":   func() error { return c.WriteStdin(ctx, "web", "", nil, false) },
		"wait":    func() error { _, err := c.Wait(ctx, "web", ""); return err },
		"start":   func() error { _, err := c.StartProcess(ctx, "", api.ExecRequest{Cmd: []string{"x"}}); return err },
	} {
		if err := call(); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("%s with an empty id: %v", name, err)
		}
	}
}

func TestLogsFollowCancel(t *testing.T) {
	f := newFake(t, false)
	c := New(f.host)
	release := make(chan struct{})
	defer close(release)
	f.reset(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", api.StreamContentType)
		api.WriteFrame(w, api.FrameStdout, []byte("tick\n"))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	cctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	go func() {
		buf := make([]byte, 5)
		io.ReadFull(pr, buf)
		cancel()
		io.Copy(io.Discard, pr)
	}()
	_, err := c.Logs(cctx, "web", "p1", LogsOptions{Follow: true}, pw, nil)
	pw.Close()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled logs: %v", err)
	}
}

func TestExecStreamCancel(t *testing.T) {
	f := newFake(t, false)
	c := New(f.host)
	release := make(chan struct{})
	defer close(release)
	f.reset(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", api.StreamContentType)
		api.WriteFrame(w, api.FrameStdout, []byte("tick\n"))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	cctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	go func() {
		buf := make([]byte, 5)
		io.ReadFull(pr, buf)
		cancel()
		io.Copy(io.Discard, pr)
	}()
	_, err := c.ExecStream(cctx, "web", api.ExecRequest{Cmd: []string{"sleep", "1000"}}, pw, nil)
	pw.Close()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled exec: %v", err)
	}
}

func TestImportProgress(t *testing.T) {
	f := newFake(t, false)
	c := New(f.host)
	img := &api.Image{Name: "alpine:3.20", ID: "sha256:abc"}
	f.reset(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"progress":{"done":10,"total":100,"what":"layer 1"}}`+"\n")
		io.WriteString(w, `{"progress":{"done":100,"total":100,"what":"layer 1"}}`+"\n")
		json.NewEncoder(w).Encode(map[string]any{"images": []*api.Image{img}})
	})
	var got []string
	list, err := c.ImportImage(ctx, "", strings.NewReader("OCI"), func(done, total int64, what string) {
		got = append(got, what+":"+itoa(done)+"/"+itoa(total))
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != "alpine:3.20" {
		t.Errorf("images %+v", list)
	}
	if strings.Join(got, " ") != "layer 1:10/100 layer 1:100/100" {
		t.Errorf("progress %q", got)
	}
	r := f.last()
	if r.Header.Get("Accept") != "application/x-ndjson" || r.Query != "" || string(r.Body) != "OCI" {
		t.Errorf("import sent Accept %q query %q body %q", r.Header.Get("Accept"), r.Query, r.Body)
	}

	f.reset(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"progress":{"done":1,"total":0,"what":"reading"}}`+"\n")
		io.WriteString(w, `{"error":{"kind":"invalid","message":"not an OCI archive"}}`+"\n")
	})
	_, err = c.ImportImage(ctx, "x", strings.NewReader("junk"), func(int64, int64, string) {})
	if !errors.Is(err, api.ErrInvalid) || err.Error() != "not an OCI archive" {
		t.Errorf("import error line: %v", err)
	}

	f.reset(rawAnswer(200, "application/x-ndjson", `{"progress":{"done":1,"total":0,"what":"reading"}}`+"\n"))
	if _, err := c.ImportImage(ctx, "x", strings.NewReader("junk"), func(int64, int64, string) {}); err == nil {
		t.Error("import stream without a result is not an error")
	}
}

func TestPullProgress(t *testing.T) {
	f := newFake(t, false)
	c := New(f.host)
	img := &api.Image{Name: "alpine:3.20", ID: "sha256:abc"}
	f.reset(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"progress":{"done":5,"total":10,"what":"layer sha256:aa"}}`+"\n")
		json.NewEncoder(w).Encode(map[string]any{"image": img})
	})
	var got []string
	res, err := c.PullImage(ctx, api.PullRequest{Ref: "alpine:3.20"}, func(done, total int64, what string) {
		got = append(got, what+":"+itoa(done)+"/"+itoa(total))
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(res, img) || strings.Join(got, " ") != "layer sha256:aa:5/10" {
		t.Errorf("pull gave %+v, progress %q", res, got)
	}
	r := f.last()
	if r.Header.Get("Accept") != "application/x-ndjson" || string(r.Body) != `{"ref":"alpine:3.20"}` {
		t.Errorf("pull sent Accept %q body %s", r.Header.Get("Accept"), r.Body)
	}

	f.reset(rawAnswer(200, "application/x-ndjson", `{"error":{"kind":"invalid","message":"pull nosuch: 404 Not Found"}}`+"\n"))
	if _, err := c.PullImage(ctx, api.PullRequest{Ref: "nosuch"}, func(int64, int64, string) {}); !errors.Is(err, api.ErrInvalid) || err.Error() != "pull nosuch: 404 Not Found" {
		t.Errorf("pull error line: %v", err)
	}
	f.reset(rawAnswer(200, "application/x-ndjson", `{"progress":{"done":1,"total":2,"what":"x"}}`+"\n"))
	if _, err := c.PullImage(ctx, api.PullRequest{Ref: "a"}, func(int64, int64, string) {}); err == nil || !strings.Contains(err.Error(), "without a result") {
		t.Errorf("pull stream without a result: %v", err)
	}
	// A status error comes before any stream.
	f.reset(jsonAnswer(400, api.ErrorDoc{Error: &api.Error{Kind: api.KindInvalid, Message: "ref: missing"}}))
	if _, err := c.PullImage(ctx, api.PullRequest{Ref: "a"}, func(int64, int64, string) {}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("pull 400: %v", err)
	}
	f.reset(nil)
	if _, err := c.PullImage(ctx, api.PullRequest{}, nil); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("pull without a ref: %v", err)
	}
}

func TestBuildImage(t *testing.T) {
	f := newFake(t, true)
	c := New(f.host)
	img := &api.Image{Name: "app", ID: "sha256:abc"}
	f.reset(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(map[string]string{"stream": "Step 1/2 : FROM host\n"})
		enc.Encode(map[string]string{"stream": "Step 2/2 : RUN make\n"})
		enc.Encode(map[string]string{"stream": "ok\n"})
		enc.Encode(map[string]any{"image": img})
	})
	var out bytes.Buffer
	res, err := c.BuildImage(ctx, strings.NewReader("TAR"), BuildOptions{Tag: "app", Dockerfile: "sub/Dockerfile",
		BuildArgs: map[string]string{"B": "2", "A": "x=y"}, NoCache: true, Timeout: 30 * time.Minute}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(res, img) || out.String() != "Step 1/2 : FROM host\nStep 2/2 : RUN make\nok\n" {
		t.Errorf("build gave %+v, output %q", res, out.String())
	}
	r := f.last()
	if r.Method != "POST" || r.Path != "/v1/images/build" ||
		r.Query != "build-arg=A%3Dx%3Dy&build-arg=B%3D2&dockerfile=sub%2FDockerfile&no-cache=true&t=app&timeout=30m0s" {
		t.Errorf("build sent %s %s?%s", r.Method, r.Path, r.Query)
	}
	if string(r.Body) != "TAR" || r.Header.Get("Content-Type") != "application/x-tar" || r.Header.Get("Accept") != "application/x-ndjson" {
		t.Errorf("build sent body %q, Content-Type %q, Accept %q", r.Body, r.Header.Get("Content-Type"), r.Header.Get("Accept"))
	}

	// An error line is an *api.Error; the output before it was written.
	f.reset(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"stream":"Step 1/1 : RUN false\n"}`+"\n")
		io.WriteString(w, `{"error":{"kind":"invalid","message":"Dockerfile line 2: RUN false: exit code 1"}}`+"\n")
	})
	out.Reset()
	_, err = c.BuildImage(ctx, strings.NewReader("TAR"), BuildOptions{Tag: "app"}, &out)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Kind != api.KindInvalid || ae.Message != "Dockerfile line 2: RUN false: exit code 1" {
		t.Errorf("build error line: %v", err)
	}
	if out.String() != "Step 1/1 : RUN false\n" {
		t.Errorf("output before the error %q", out.String())
	}
	if r := f.last(); r.Query != "t=app" {
		t.Errorf("build with defaults sent ?%s", r.Query)
	}

	// The RUN steps' network.
	c.BuildImage(ctx, strings.NewReader("TAR"), BuildOptions{Tag: "app", Network: "allow", Allow: []string{"a.test", "*.b.test"}, AllowCIDR: []string{"203.0.113.0/24"}}, nil)
	if r := f.last(); r.Query != "allow=a.test&allow=%2A.b.test&allow-cidr=203.0.113.0%2F24&network=allow&t=app" {
		t.Errorf("build with a network sent ?%s", r.Query)
	}

	// Debian: no body; a nil output is fine.
	f.reset(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"stream":"Running mmdebstrap\n"}`+"\n")
		json.NewEncoder(w).Encode(map[string]any{"image": img})
	})
	if res, err := c.BuildImage(ctx, strings.NewReader("ignored"), BuildOptions{Tag: "debian", Debian: "bookworm"}, nil); err != nil || res.Name != "app" {
		t.Errorf("debian build: %v %+v", err, res)
	}
	if r := f.last(); r.Query != "debian=bookworm&t=debian" || len(r.Body) != 0 || r.Header.Get("Content-Type") != "" {
		t.Errorf("debian build sent ?%s body %q Content-Type %q", r.Query, r.Body, r.Header.Get("Content-Type"))
	}

	// A daemon answering plain JSON, and a status error.
	f.reset(jsonAnswer(200, img))
	if res, err := c.BuildImage(ctx, strings.NewReader("TAR"), BuildOptions{Tag: "app"}, nil); err != nil || !reflect.DeepEqual(res, img) {
		t.Errorf("build with a JSON answer: %v %+v", err, res)
	}
	f.reset(jsonAnswer(413, api.ErrorDoc{Error: &api.Error{Kind: api.KindTooLarge, Message: "build context over 4294967296 bytes"}}))
	if _, err := c.BuildImage(ctx, strings.NewReader("TAR"), BuildOptions{Tag: "app"}, nil); !errors.Is(err, api.ErrTooLarge) {
		t.Errorf("build 413: %v", err)
	}
	if _, err := c.BuildImage(ctx, nil, BuildOptions{}, nil); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("build without a tag: %v", err)
	}
}

func TestSaveImages(t *testing.T) {
	f := newFake(t, false)
	c := New(f.host)
	f.reset(rawAnswer(200, "application/x-tar", "OCI TAR"))
	rc, err := c.SaveImages(ctx, []string{"a:1", "reg.example/b:2"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "OCI TAR" {
		t.Errorf("save gave %q", b)
	}
	r := f.last()
	if r.Method != "GET" || r.Path != "/v1/images/save" || r.Query != "name=a%3A1&name=reg.example%2Fb%3A2" || r.Header.Get("Accept") != "application/x-tar" {
		t.Errorf("save sent %s %s?%s Accept %q", r.Method, r.Path, r.Query, r.Header.Get("Accept"))
	}
	f.reset(jsonAnswer(422, api.ErrorDoc{Error: &api.Error{Kind: api.KindUnsupported, Message: "image \"x\" is built on this host's own files"}}))
	if _, err := c.SaveImages(ctx, []string{"x"}); !errors.Is(err, api.ErrUnsupported) {
		t.Errorf("save 422: %v", err)
	}
	if _, err := c.SaveImages(ctx, nil); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("save of nothing: %v", err)
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func TestUnreachable(t *testing.T) {
	dir, err := os.MkdirTemp("", "denc")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// No socket file at all.
	missing := "unix://" + filepath.Join(dir, "none.sock")
	_, err = New(missing).Version(ctx)
	want := `cannot reach den at ` + missing + `: is "den serve" running? (set DEN_HOST or --host to pick another daemon)`
	if err == nil || err.Error() != want {
		t.Errorf("missing socket: %v\nwant %s", err, want)
	}
	var ce *ConnError
	if !errors.As(err, &ce) {
		t.Errorf("%T is not a *ConnError", err)
	}

	// A socket file nobody listens on: connection refused.
	sock := filepath.Join(dir, "dead.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	_, err = New("unix://"+sock).List(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), `cannot reach den at unix://`+sock+`: is "den serve" running?`) {
		t.Errorf("refused socket: %v", err)
	}

	// The default host is named in the message too.
	t.Setenv("DEN_HOST", "")
	var zero Client
	if got := zero.Addr(); got != DefaultHost {
		t.Errorf("zero Client talks to %q, want %q", got, DefaultHost)
	}
}

func TestDefaultsFromEnv(t *testing.T) {
	f := newFake(t, false)
	tokdir := t.TempDir()
	if err := os.WriteFile(filepath.Join(tokdir, "token"), []byte("filetoken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DEN_HOST", f.host)
	t.Setenv("DEN_TOKEN", "")
	t.Setenv("DEN_DATA", tokdir)
	f.reset(jsonAnswer(200, api.VersionInfo{Version: "x"}))

	// A zero Client: $DEN_HOST, and the token file of the local daemon.
	var c Client
	if _, err := c.Version(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.last().Header.Get("Authorization"); got != "Bearer filetoken" {
		t.Errorf("token from DataDir: Authorization %q", got)
	}

	// $DEN_TOKEN wins over the file.
	t.Setenv("DEN_TOKEN", "envtoken")
	c2 := New("")
	if _, err := c2.Version(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.last().Header.Get("Authorization"); got != "Bearer envtoken" {
		t.Errorf("token from DEN_TOKEN: Authorization %q", got)
	}

	// Client.Token wins over both; changing it takes effect.
	c2.Token = "field"
	if _, err := c2.Version(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.last().Header.Get("Authorization"); got != "Bearer field" {
		t.Errorf("Client.Token: Authorization %q", got)
	}

	// An http:// host works as well, with a caller's HTTPClient.
	hc := &http.Client{Timeout: 5 * time.Second}
	c3 := &Client{Host: strings.Replace(f.host, "tcp://", "http://", 1), HTTPClient: hc, Token: "t"}
	if _, err := c3.Version(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestNoTokenOnUnixSocket(t *testing.T) {
	t.Setenv("DEN_TOKEN", "")
	tokdir := t.TempDir()
	os.WriteFile(filepath.Join(tokdir, "token"), []byte("filetoken"), 0o600)
	t.Setenv("DEN_DATA", tokdir)
	f := newFake(t, true)
	f.reset(jsonAnswer(200, api.VersionInfo{}))
	if _, err := New(f.host).Version(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.last().Header.Get("Authorization"); got != "" {
		t.Errorf("unix socket request carries Authorization %q", got)
	}
}

func TestBadHost(t *testing.T) {
	for _, h := range []string{"ftp://x", "unix://", "tcp://", "nonsense"} {
		if _, err := New(h).Version(ctx); err == nil || !strings.Contains(err.Error(), "bad den host") {
			t.Errorf("host %q: %v", h, err)
		}
	}
}

func TestModes(t *testing.T) {
	for _, m := range []os.FileMode{0o644, 0o755 | os.ModeSetuid, 0o1777&^0o1000 | os.ModeSticky, 0o2750&^0o2000 | os.ModeSetgid} {
		if got := FileMode(UnixMode(m)); got != m {
			t.Errorf("FileMode(UnixMode(%v)) = %v", m, got)
		}
	}
	if UnixMode(0o755|os.ModeSetuid|os.ModeDir) != 0o4755 {
		t.Error("UnixMode keeps type bits")
	}
}
