package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/den-dev/den/api"
)

// gitDaemon answers the git workspace routes the way den serve does and
// records what the CLI sent.
type gitDaemon struct {
	host    string
	mu      sync.Mutex
	creates []api.CreateRequest
	exports []api.ExportRequest
}

var testPatch = []byte("diff --git a/b.bin b/b.bin\nGIT binary patch\n\x00\xff odd bytes\n")

func newGitDaemon(t *testing.T) *gitDaemon {
	t.Helper()
	g := &gitDaemon{}
	g.host = miniDaemon(t, func(mux *http.ServeMux) {
		mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
			var req api.CreateRequest
			json.NewDecoder(r.Body).Decode(&req)
			g.mu.Lock()
			g.creates = append(g.creates, req)
			g.mu.Unlock()
			replyJSON(w, 201, api.Sandbox{ID: "0123456789abcdef", State: api.StateRunning})
		})
		mux.HandleFunc("GET /v1/sandboxes/{id}/diff", func(w http.ResponseWriter, r *http.Request) {
			if r.PathValue("id") != "box" {
				replyJSON(w, 404, api.ErrorDoc{Error: api.Errorf(api.KindNotFound, "no sandbox %q", r.PathValue("id"))})
				return
			}
			replyJSON(w, 200, api.Diff{Source: "/src/app", Branch: "den/box", Base: strings.Repeat("a", 40), Head: strings.Repeat("b", 40),
				Commits: []api.DiffCommit{{Commit: strings.Repeat("c", 40), Subject: "agent: fix"}},
				Files: []api.DiffFile{{Path: "b.bin", Status: "A"}, {Path: "new name", OldPath: "old", Status: "R"},
					{Path: "tab\there", Status: "A"}, {Path: "café \"x\"", OldPath: "back\\slash", Status: "R"}},
				Patch: testPatch})
		})
		mux.HandleFunc("POST /v1/sandboxes/{id}/export", func(w http.ResponseWriter, r *http.Request) {
			var req api.ExportRequest
			json.NewDecoder(r.Body).Decode(&req)
			g.mu.Lock()
			g.exports = append(g.exports, req)
			g.mu.Unlock()
			if req.Branch == "main" {
				replyJSON(w, 409, api.ErrorDoc{Error: api.Errorf(api.KindConflict, "branch main is checked out in /src/app (a worktree of it): export to another branch")})
				return
			}
			n := 2
			if req.Branch == "one" {
				n = 1
			}
			replyJSON(w, 200, api.ExportResult{Repository: "/src/app", Branch: req.Branch, Commit: strings.Repeat("d", 40), Base: strings.Repeat("a", 40), Commits: n})
		})
	})
	return g
}

func TestCreateGitFlags(t *testing.T) {
	g := newGitDaemon(t)
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "repo"), 0o755)
	t.Chdir(dir)
	for _, tc := range []struct {
		args []string
		want api.GitSource
	}{
		{[]string{"create", "--git", "repo", "--branch", "dev"}, api.GitSource{URL: filepath.Join(dir, "repo"), Branch: "dev"}},
		{[]string{"create", "--git", "https://example.com/x.git"}, api.GitSource{URL: "https://example.com/x.git"}},
		{[]string{"run", "--git", "/abs/repo"}, api.GitSource{URL: "/abs/repo"}},
		{[]string{"create", "--git", "/abs/repo", "--git-author", "Ada <ada@example.com>"}, api.GitSource{URL: "/abs/repo", Author: "Ada <ada@example.com>"}},
	} {
		if r := den(t, nil, "", append([]string{"--host", g.host}, tc.args...)...); r.code != 0 || r.stdout != "0123456789abcdef\n" {
			t.Fatalf("%v: %+v", tc.args, r)
		}
		got := g.creates[len(g.creates)-1].Git
		if got == nil || *got != tc.want {
			t.Errorf("%v sent %+v, want %+v", tc.args, got, tc.want)
		}
	}
	n := len(g.creates)
	if r := den(t, nil, "", "--host", g.host, "create", "--branch", "dev"); r.code != 2 || !strings.Contains(r.stderr, "--branch goes with --git") {
		t.Errorf("--branch without --git: %+v", r)
	}
	if r := den(t, nil, "", "--host", g.host, "create", "--git-author", "Ada <ada@example.com>"); r.code != 2 || !strings.Contains(r.stderr, "--git-author goes with --git") {
		t.Errorf("--git-author without --git: %+v", r)
	}
	if len(g.creates) != n {
		t.Error("a bad create reached the daemon")
	}
}

func TestDiffCLI(t *testing.T) {
	g := newGitDaemon(t)
	if r := den(t, nil, "", "--host", g.host, "diff", "box"); r.code != 0 || r.stdout != string(testPatch) {
		t.Errorf("den diff: %+v, want the patch's bytes exactly", r)
	}
	r := den(t, nil, "", "--host", g.host, "diff", "--stat", "box")
	// Counts in the singular for one; names quoted only when git would
	// (a tab, a double quote, a backslash, bytes from 0x80 up).
	want := "base aaaaaaaaaaaa (/src/app), 1 commit, 4 files\ncommit cccccccccccc agent: fix\n" +
		"A\tb.bin\nR\told -> new name\nA\t\"tab\\there\"\nR\t\"back\\\\slash\" -> \"caf\\303\\251 \\\"x\\\"\"\n"
	if r.code != 0 || r.stdout != want {
		t.Errorf("den diff --stat printed\n%s\nwant\n%s", r.stdout, want)
	}
	r = den(t, nil, "", "--host", g.host, "diff", "--json", "box")
	var d api.Diff
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || string(d.Patch) != string(testPatch) {
		t.Errorf("den diff --json: %v %+v", err, r)
	}
	if r := den(t, nil, "", "--host", g.host, "diff"); r.code != 2 || !strings.Contains(r.stderr, "one sandbox ID") {
		t.Errorf("den diff without an id: %+v", r)
	}
	if r := den(t, nil, "", "--host", g.host, "diff", "nope"); r.code == 0 || !strings.Contains(r.stderr, "no sandbox") {
		t.Errorf("den diff of an unknown sandbox: %+v", r)
	}
}

func TestExportCLI(t *testing.T) {
	g := newGitDaemon(t)
	r := den(t, nil, "", "--host", g.host, "export", "box", "--branch", "agent/fix", "-m", "wip", "--force")
	if r.code != 0 || !strings.Contains(r.stdout, "/src/app agent/fix at dddddddddddd (2 commits") {
		t.Errorf("den export: %+v", r)
	}
	if got := g.exports[0]; got != (api.ExportRequest{Branch: "agent/fix", Message: "wip", Force: true}) {
		t.Errorf("sent %+v", got)
	}
	if r := den(t, nil, "", "--host", g.host, "export", "box", "--branch", "one"); r.code != 0 || !strings.Contains(r.stdout, "(1 commit on aaaaaaaaaaaa)") {
		t.Errorf("den export of one commit: %+v", r)
	}
	r = den(t, nil, "", "--host", g.host, "export", "--json", "box", "-b", "x")
	var res api.ExportResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Branch != "x" || res.Commits != 2 {
		t.Errorf("den export --json: %v %+v", err, r)
	}
	if r := den(t, nil, "", "--host", g.host, "export", "box", "--branch", "main"); r.code == 0 || !strings.Contains(r.stderr, "checked out") {
		t.Errorf("export to the checked-out branch: %+v", r)
	}
	n := len(g.exports)
	for _, args := range [][]string{{"export", "box"}, {"export", "--branch", "x"}} {
		if r := den(t, nil, "", append([]string{"--host", g.host}, args...)...); r.code != 2 {
			t.Errorf("%v: %+v", args, r)
		}
	}
	if len(g.exports) != n {
		t.Error("a bad export reached the daemon")
	}
	if r := den(t, nil, "", "export", "-h"); r.code != 0 || !strings.Contains(r.stdout, "working tree and index are not") {
		t.Errorf("export -h: %+v", r)
	}
}
