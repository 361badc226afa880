package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/den-dev/den/api"
)

// tokenDaemon answers the token routes on a unix socket and records the
// create requests it gets.
type tokenDaemon struct {
	host string
	mu   sync.Mutex
	reqs []api.TokenRequest
	gone []string
}

func newTokenDaemon(t *testing.T) *tokenDaemon {
	t.Helper()
	d := &tokenDaemon{}
	d.host = miniDaemon(t, func(mux *http.ServeMux) {
		mux.HandleFunc("POST /v1/tokens", func(w http.ResponseWriter, r *http.Request) {
			var req api.TokenRequest
			json.NewDecoder(r.Body).Decode(&req)
			d.mu.Lock()
			d.reqs = append(d.reqs, req)
			d.mu.Unlock()
			if req.Name == "taken" {
				replyJSON(w, 409, api.ErrorDoc{Error: api.Errorf(api.KindExists, "a token named %q already exists", req.Name)})
				return
			}
			replyJSON(w, 201, api.Token{ID: "0123456789abcdef", Name: req.Name, MaxSandboxes: req.MaxSandboxes, CPUs: req.CPUs, Memory: req.Memory, Token: "den_SECRET", CreatedAt: time.Now()})
		})
		mux.HandleFunc("GET /v1/tokens", func(w http.ResponseWriter, r *http.Request) {
			replyJSON(w, 200, []api.Token{{ID: "0123456789abcdef", Name: "agent-1", MaxSandboxes: 5, CPUs: 1.5, Memory: 1 << 30, Sandboxes: 2, CreatedAt: time.Now()}})
		})
		mux.HandleFunc("DELETE /v1/tokens/{id}", func(w http.ResponseWriter, r *http.Request) {
			if r.PathValue("id") != "agent-1" {
				replyJSON(w, 404, api.ErrorDoc{Error: api.Errorf(api.KindNotFound, "no token %q", r.PathValue("id"))})
				return
			}
			d.mu.Lock()
			d.gone = append(d.gone, r.PathValue("id"))
			d.mu.Unlock()
			w.WriteHeader(204)
		})
	})
	return d
}

func TestTokenCLI(t *testing.T) {
	d := newTokenDaemon(t)
	r := den(t, nil, "", "--host", d.host, "token", "create", "--name", "ci", "--max-sandboxes", "3", "--cpus", "1.5", "--memory", "2g",
		"--disk", "5g", "--max-volumes", "2", "--max-snapshots", "4", "--max-images", "1")
	if r.code != 0 || r.stdout != "den_SECRET\n" || !strings.Contains(r.stderr, "cannot show it again") {
		t.Fatalf("token create: %+v", r)
	}
	if len(d.reqs) != 1 || d.reqs[0] != (api.TokenRequest{Name: "ci", MaxSandboxes: 3, CPUs: 1.5, Memory: 2 << 30, Disk: 5 << 30, MaxVolumes: 2, MaxSnapshots: 4, MaxImages: 1}) {
		t.Fatalf("sent %+v", d.reqs)
	}
	r = den(t, nil, "", "--host", d.host, "token", "create", "--name", "ci", "--json")
	var tok api.Token
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &tok) != nil || tok.Token != "den_SECRET" {
		t.Fatalf("token create --json: %+v", r)
	}
	r = den(t, nil, "", "--host", d.host, "token", "create", "--name", "taken")
	if r.code != 1 || !strings.Contains(r.stderr, "already exists") {
		t.Fatalf("duplicate name: %+v", r)
	}

	n := len(d.reqs)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"token", "create"}, "--name is required"},
		{[]string{"token", "create", "--name", ""}, "--name is required"},
		{[]string{"token", "create", "--name", "x", "--max-sandboxes", "three"}, "want a whole number"},
		{[]string{"token", "create", "--name", "x", "--max-sandboxes", "-1"}, "want a whole number"},
		{[]string{"token", "create", "--name", "x", "--memory", "12q"}, "--memory"},
		{[]string{"token", "create", "--name", "x", "--disk", "12q"}, "--disk"},
		{[]string{"token", "create", "--name", "x", "--max-volumes", "-1"}, "--max-volumes"},
		{[]string{"token", "create", "--name", "x", "--max-images", "many"}, "--max-images"},
		{[]string{"token", "create", "--name", "x", "--cpus", "-2"}, "negative"},
		{[]string{"token", "create", "--name", "x", "extra"}, "no arguments"},
		{[]string{"token", "ls", "extra"}, "no arguments"},
		{[]string{"token", "rm"}, "at least one"},
	} {
		r := den(t, nil, "", append([]string{"--host", d.host}, tc.args...)...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "den: ") || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want a usage error with %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if len(d.reqs) != n {
		t.Errorf("bad token create commands sent requests: %+v", d.reqs[n:])
	}

	r = den(t, nil, "", "--host", d.host, "token", "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "0123456789abcdef") || !strings.Contains(r.stdout, "agent-1") || !strings.Contains(r.stdout, "1.5") || strings.Contains(r.stdout, "den_") {
		t.Fatalf("token ls: %+v", r)
	}
	r = den(t, nil, "", "--host", d.host, "token", "ls", "--json")
	var list []api.Token
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list) != 1 || list[0].Sandboxes != 2 {
		t.Fatalf("token ls --json: %+v", r)
	}
	r = den(t, nil, "", "--host", d.host, "token", "rm", "agent-1", "nope")
	if r.code != 1 || r.stdout != "agent-1\n" || !strings.Contains(r.stderr, "den token ls") || len(d.gone) != 1 {
		t.Fatalf("token rm: %+v %v", r, d.gone)
	}
	h := den(t, nil, "", "help", "token", "create")
	for _, w := range []string{"--max-sandboxes", "--max-volumes", "--max-snapshots", "--max-images", "--cpus", "--memory", "--disk", "--json", "shown this\nonce"} {
		if !strings.Contains(h.stdout, w) {
			t.Errorf("den help token create lacks %q:\n%s", w, h.stdout)
		}
	}
}
