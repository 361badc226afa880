package server_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/gitws/gitwstest"
	"github.com/den-dev/den/internal/server"
	"github.com/den-dev/den/internal/testenv/e2e"
)

// newGitRepo makes a host repository: a few files on main, and a branch
// other with one more commit.
func newGitRepo(t *testing.T) string {
	t.Helper()
	dir := gitwstest.Repo(t, map[string]string{
		"keep.txt": "keep\n", "edit.txt": "one\n", "gone.txt": "gone\n", "run.sh": "#!/bin/sh\necho run\n",
		".gitignore": "*.log\n", "src/lib.go": "package lib\n",
	})
	gitHost(t, dir, "checkout", "-qb", "other")
	os.WriteFile(filepath.Join(dir, "other.txt"), []byte("other\n"), 0o644)
	gitHost(t, dir, "add", "-A")
	gitHost(t, dir, "commit", "-qm", "on other")
	gitHost(t, dir, "checkout", "-q", "main")
	return dir
}

// gitHost runs git in a host repository of the test's (not a sandbox's).
var gitHost = gitwstest.Git

// hostState is what export must leave alone: HEAD, the index file and the
// working tree's status.
func hostState(t *testing.T, dir string) string {
	t.Helper()
	idx, _ := os.ReadFile(filepath.Join(dir, ".git", "index"))
	return gitHost(t, dir, "rev-parse", "HEAD") + " " + gitHost(t, dir, "symbolic-ref", "HEAD") + " " +
		gitHost(t, dir, "--no-optional-locks", "status", "--porcelain", "--ignored") + " " + fmt.Sprintf("%x", sha256.Sum256(idx))
}

func TestGitWorkspace(t *testing.T) {
	e := newGitEnv(t)
	host := newGitRepo(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{User: "1000:1000", Git: &api.GitSource{URL: host}})
	if sb.Workdir != "/workspace" {
		t.Errorf("workdir %q, want /workspace", sb.Workdir)
	}
	// The checkout is the sandbox user's, on its own branch, with a .git
	// the agent can use.
	out := e.sh(t, sb.ID, `cd /workspace && git branch --show-current && stat -c %u:%g . .git edit.txt && cat keep.txt && git status --porcelain`)
	want := "den/" + sb.ID + "\n1000:1000\n1000:1000\n1000:1000\nkeep\n"
	if out.ExitCode != 0 || string(out.Stdout) != want {
		t.Fatalf("inside: %d %q %s, want %q", out.ExitCode, out.Stdout, out.Stderr, want)
	}
	// A commit inside, then changes of every kind left uncommitted.
	out = e.sh(t, sb.ID, `cd /workspace && echo two > edit.txt && git -c user.name=agent -c user.email=agent@test commit -qam 'agent: edit' &&
		rm gone.txt && printf '\000\001\002\377' > new.bin && chmod +x run.sh && ln -s /etc/passwd pw &&
		echo noise > debug.log && echo 'package lib // changed' > src/lib.go`)
	if out.ExitCode != 0 {
		t.Fatalf("change the workspace: %s", out.Stderr)
	}
	d, err := e.c.Diff(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range d.Files {
		got[f.Path] = f.Status
	}
	wantFiles := map[string]string{"edit.txt": "M", "gone.txt": "D", "new.bin": "A", "run.sh": "M", "pw": "A", "src/lib.go": "M"}
	if len(got) != len(wantFiles) {
		t.Errorf("changed files %v, want %v", got, wantFiles)
	}
	for p, s := range wantFiles {
		if got[p] != s {
			t.Errorf("%s: status %q, want %q", p, got[p], s)
		}
	}
	if len(d.Commits) != 2 || d.Commits[0].Subject != "agent: edit" {
		t.Errorf("commits %+v, want the agent's and one for the uncommitted changes", d.Commits)
	}
	for _, part := range []string{"GIT binary patch", "new mode 100755", "new file mode 120000", "deleted file mode 100644", "+/etc/passwd"} {
		if !strings.Contains(string(d.Patch), part) {
			t.Errorf("the patch lacks %q:\n%s", part, d.Patch)
		}
	}
	// The patch applies to the base, in another clone.
	chk := t.TempDir()
	gitHost(t, chk, "clone", "-q", host, ".")
	os.WriteFile(filepath.Join(chk, ".git", "p.diff"), d.Patch, 0o644)
	gitHost(t, chk, "apply", "--index", ".git/p.diff")

	// The host repository belongs to a user: what export adds is theirs too.
	filepath.WalkDir(host, func(p string, d os.DirEntry, err error) error { return os.Lchown(p, 1000, 1000) })
	before := hostState(t, host)
	res, err := e.c.Export(ctx, sb.ID, api.ExportRequest{Branch: "agent/feature", Message: "wip from the sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Commits != 2 || res.Previous != "" || res.Repository != host {
		t.Errorf("export: %+v", res)
	}
	if after := hostState(t, host); after != before {
		t.Errorf("export touched the host's HEAD, index or working tree:\n%s\n%s", before, after)
	}
	filepath.WalkDir(filepath.Join(host, ".git"), func(p string, d os.DirEntry, err error) error {
		if info, err := d.Info(); err == nil && info.Sys().(*syscall.Stat_t).Uid != 1000 {
			t.Errorf("export left %s owned by uid %d, not the repository's owner", p, info.Sys().(*syscall.Stat_t).Uid)
		}
		return nil
	})
	// The branch's tree is the workspace's: same files, modes and symlink.
	if tree, wantTree := gitHost(t, host, "rev-parse", "agent/feature^{tree}"), gitHost(t, chk, "write-tree"); tree != wantTree {
		t.Errorf("exported tree %s, the patched clone's %s", tree, wantTree)
	}
	if s := gitHost(t, host, "log", "--format=%s", "main..agent/feature"); s != "wip from the sandbox\nagent: edit" {
		t.Errorf("exported commits: %q", s)
	}
	if l := gitHost(t, host, "ls-tree", "agent/feature", "pw", "run.sh", "debug.log"); !strings.Contains(l, "120000 blob") || !strings.Contains(l, "100755 blob") || strings.Contains(l, "debug.log") {
		t.Errorf("modes in the export: %s", l)
	}

	// Again, nothing new: the same commits, so the branch stays where it is.
	if again, err := e.c.Export(ctx, sb.ID, api.ExportRequest{Branch: "agent/feature", Message: "wip from the sandbox"}); err != nil || again.Commit != res.Commit {
		t.Errorf("export again: %+v %v, want commit %s", again, err, res.Commit)
	}
	// other has a commit the workspace lacks: refused, unless forced.
	_, err = e.c.Export(ctx, sb.ID, api.ExportRequest{Branch: "other"})
	wantKind(t, err, api.KindConflict)
	if res, err := e.c.Export(ctx, sb.ID, api.ExportRequest{Branch: "other", Force: true}); err != nil || res.Previous == "" {
		t.Errorf("forced export: %+v %v", res, err)
	}
	// Bad export requests.
	_, err = e.c.Export(ctx, sb.ID, api.ExportRequest{Branch: "bad..name"})
	wantKind(t, err, api.KindInvalid)
	_, err = e.c.Export(ctx, sb.ID, api.ExportRequest{})
	wantKind(t, err, api.KindInvalid)
	// A sandbox without a workspace.
	plain := e.create(t, api.CreateRequest{})
	_, err = e.c.Diff(ctx, plain.ID)
	wantKind(t, err, api.KindInvalid)
}

func TestGitExportCheckedOutBranch(t *testing.T) {
	e := newGitEnv(t)
	host := newGitRepo(t)
	sb := e.create(t, api.CreateRequest{Git: &api.GitSource{URL: host, Branch: "other"}})
	if out := e.sh(t, sb.ID, "cd /workspace && cat other.txt && echo x >> keep.txt"); out.ExitCode != 0 || string(out.Stdout) != "other\n" {
		t.Fatalf("checkout of branch other: %q %s", out.Stdout, out.Stderr)
	}
	before := hostState(t, host)
	_, err := e.c.Export(context.Background(), sb.ID, api.ExportRequest{Branch: "main", Force: true})
	if ae := wantKind(t, err, api.KindConflict); !strings.Contains(ae.Message, "checked out") {
		t.Errorf("message %q does not say why", ae.Message)
	}
	if after := hostState(t, host); after != before {
		t.Errorf("a refused export changed the host repository")
	}
}

func TestGitCreateBadURL(t *testing.T) {
	e := newGitEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a port that answers nothing git wants
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
			c.Close()
		}
	}()
	defer ln.Close()
	_, err = e.c.Create(context.Background(), api.CreateRequest{Git: &api.GitSource{URL: "http://" + ln.Addr().String() + "/nope.git"}})
	if ae := wantKind(t, err, api.KindInvalid); ae.Field != "git.url" || !strings.Contains(ae.Message, "clone") {
		t.Errorf("error %+v", ae)
	}
	for _, bad := range []string{"ext::sh -c touch% /tmp/den-ext-pwned", "relative/dir", "ftp://example.com/x.git", ""} {
		_, err = e.c.Create(context.Background(), api.CreateRequest{Git: &api.GitSource{URL: bad}})
		wantKind(t, err, api.KindInvalid)
	}
	if all, _ := e.c.List(context.Background(), nil); len(all) != 0 {
		t.Errorf("failed creates left %d sandboxes", len(all))
	}
}

func TestGitCreateNotARepository(t *testing.T) {
	e := newGitEnv(t)
	newGitRepo(t) // skips without git
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644)
	for _, p := range []string{dir, filepath.Join(dir, "file"), filepath.Join(dir, "missing")} {
		_, err := e.c.Create(context.Background(), api.CreateRequest{Git: &api.GitSource{URL: p}})
		if ae := wantKind(t, err, api.KindInvalid); ae.Field != "git.url" {
			t.Errorf("%s: field %q", p, ae.Field)
		}
	}
	if all, _ := e.c.List(context.Background(), nil); len(all) != 0 {
		t.Errorf("failed creates left %d sandboxes", len(all))
	}
}

func TestGitCreateMissingBranch(t *testing.T) {
	e := newGitEnv(t)
	host := newGitRepo(t)
	_, err := e.c.Create(context.Background(), api.CreateRequest{Git: &api.GitSource{URL: "file://" + host, Branch: "no-such-branch"}})
	if ae := wantKind(t, err, api.KindInvalid); ae.Field != "git.branch" || !strings.Contains(ae.Message, "other") {
		t.Errorf("error %+v: want field git.branch and the branches there are", ae)
	}
	_, err = e.c.Create(context.Background(), api.CreateRequest{Git: &api.GitSource{URL: host, Branch: "--upload-pack=touch"}})
	wantKind(t, err, api.KindInvalid)
}

// clientAs serves e's manager on another socket with every request acting
// for p (host paths and export are the admin's).
func clientAs(t *testing.T, e *env, p *server.Principal) *client.Client {
	t.Helper()
	sock := filepath.Join(e.data, fmt.Sprintf("as-%p.sock", p))
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(e.m, e.db, slog.New(slog.NewTextHandler(io.Discard, nil)), "test", e.rt.CgroupVersion())
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.ServeHTTP(w, r.WithContext(server.WithPrincipal(r.Context(), p)))
	})}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return client.New("unix://" + sock)
}

// newGitEnv is newEnv whose client acts for the admin.
func newGitEnv(t *testing.T) *env {
	e := newEnv(t)
	e.c = clientAs(t, e, server.AdminPrincipal)
	return e
}

// Host paths read the host's files: a scoped (non-admin) principal is refused.
func TestGitHostPathAdminOnly(t *testing.T) {
	e := newGitEnv(t)
	host := newGitRepo(t)
	c := clientAs(t, e, &server.Principal{TokenID: "tok-test", Name: "scoped"})
	for _, u := range []string{host, "file://" + host} {
		_, err := c.Create(context.Background(), api.CreateRequest{Git: &api.GitSource{URL: u}})
		wantKind(t, err, api.KindUnauthorized)
	}
}

// The sandbox's .git is hostile: a config and hooks planted there (and
// attributes naming filters and diff drivers) never run on the host.
func TestGitHostileWorkspace(t *testing.T) {
	e := newGitEnv(t)
	host := newGitRepo(t)
	marker := filepath.Join(t.TempDir(), "pwned")
	sb := e.create(t, api.CreateRequest{Git: &api.GitSource{URL: host}})
	cmd := "touch " + marker
	script := `cd /workspace && cat > .git/config <<EOF
[core]
	repositoryformatversion = 0
	bare = false
	fsmonitor = "` + cmd + `"
	hooksPath = .git/hooks
	sshCommand = "` + cmd + `"
	pager = "` + cmd + `"
[diff "evil"]
	command = "` + cmd + `"
	textconv = "` + cmd + `"
[filter "evil"]
	clean = "` + cmd + `"
	smudge = "` + cmd + `"
	process = "` + cmd + `"
[uploadpack]
	packObjectsHook = "` + cmd + `"
EOF
for h in pre-commit post-commit reference-transaction post-checkout pre-push fsmonitor-watchman post-index-change; do
	printf '#!/bin/sh\n` + cmd + `\n' > .git/hooks/$h && chmod +x .git/hooks/$h
done
printf '* diff=evil filter=evil\n' > .gitattributes && echo changed >> keep.txt`
	if out := e.sh(t, sb.ID, script); out.ExitCode != 0 {
		t.Fatalf("plant: %s", out.Stderr)
	}
	d, err := e.c.Diff(context.Background(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(d.Patch), "+changed") {
		t.Errorf("the diff lacks the change:\n%s", d.Patch)
	}
	if _, err := e.c.Export(context.Background(), sb.ID, api.ExportRequest{Branch: "hostile"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a command planted in the sandbox's .git ran on the host")
	}
	// The planted .git never reaches the export; .gitattributes is just a file.
	if l := gitHost(t, host, "ls-tree", "-r", "--name-only", "hostile"); strings.Contains(l, ".git/") || !strings.Contains(l, ".gitattributes") {
		t.Errorf("exported files: %s", l)
	}
}

// A symlink in the workspace is exported as a symlink, never followed on
// the host.
func TestGitSymlinkExport(t *testing.T) {
	e := newGitEnv(t)
	host := newGitRepo(t)
	sb := e.create(t, api.CreateRequest{Git: &api.GitSource{URL: host}})
	if out := e.sh(t, sb.ID, "cd /workspace && ln -s /etc/passwd passwd && ln -s ../../../../etc/shadow src/up"); out.ExitCode != 0 {
		t.Fatal(string(out.Stderr))
	}
	if _, err := e.c.Export(context.Background(), sb.ID, api.ExportRequest{Branch: "links"}); err != nil {
		t.Fatal(err)
	}
	for p, target := range map[string]string{"passwd": "/etc/passwd", "src/up": "../../../../etc/shadow"} {
		if l := gitHost(t, host, "ls-tree", "links", p); !strings.HasPrefix(l, "120000 blob") {
			t.Errorf("%s: %s, want a symlink", p, l)
		}
		if got := gitHost(t, host, "cat-file", "-p", "links:"+p); got != target {
			t.Errorf("%s points at %q, want %q", p, got, target)
		}
	}
}

// A URL is cloned by the daemon (here git's "dumb" HTTP protocol from a
// loopback file server); the clone inside keeps the URL as origin, diff
// works, and export has no host repository to write to.
func TestGitCreateFromURL(t *testing.T) {
	e := newGitEnv(t)
	url := serveRepo(t, newGitRepo(t))
	sb := e.create(t, api.CreateRequest{Git: &api.GitSource{URL: url, Branch: "other"}})
	out := e.sh(t, sb.ID, "cd /workspace && git remote get-url origin && cat other.txt && echo new > added.txt")
	if out.ExitCode != 0 || string(out.Stdout) != url+"\nother\n" {
		t.Fatalf("inside: %q %s", out.Stdout, out.Stderr)
	}
	d, err := e.c.Diff(context.Background(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.Source != url || len(d.Files) != 1 || d.Files[0].Path != "added.txt" || d.Files[0].Status != "A" {
		t.Errorf("diff: source %s, files %+v", d.Source, d.Files)
	}
	_, err = e.c.Export(context.Background(), sb.ID, api.ExportRequest{Branch: "x"})
	if ae := wantKind(t, err, api.KindInvalid); !strings.Contains(ae.Message, "den diff") {
		t.Errorf("export of a URL workspace: %s", ae.Message)
	}
}

// serveRepo serves a copy of repository src over git's "dumb" HTTP
// protocol from a loopback file server, and returns its URL.
func serveRepo(t *testing.T, src string) string {
	t.Helper()
	served := t.TempDir()
	gitHost(t, served, "clone", "-q", "--bare", src, "app.git")
	gitHost(t, filepath.Join(served, "app.git"), "update-server-info")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.FileServer(http.Dir(served))}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return "http://" + ln.Addr().String() + "/app.git"
}

// A plain git commit works inside: the author is --git-author's, else the
// host repository's user.name and user.email, else den's; the commit den
// makes of uncommitted changes has that author too. A bad author is
// refused, naming git.author, and creates nothing.
func TestGitAuthor(t *testing.T) {
	e := newGitEnv(t)
	host := newGitRepo(t)
	gitHost(t, host, "config", "user.name", "Host Person")
	gitHost(t, host, "config", "user.email", "host@example.com")
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		git  api.GitSource
		want string
	}{
		{"host repository", api.GitSource{URL: host}, "Host Person <host@example.com>"},
		{"given", api.GitSource{URL: host, Author: "Ada Lovelace <ada@example.com>"}, "Ada Lovelace <ada@example.com>"},
		{"URL", api.GitSource{URL: serveRepo(t, host)}, "den <den@localhost>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.git
			sb := e.create(t, api.CreateRequest{User: "1000:1000", Git: &g})
			out := e.sh(t, sb.ID, `cd /workspace && echo two > edit.txt && git commit -qam inside && git log -1 --format='%an <%ae>' && echo three > keep.txt`)
			if out.ExitCode != 0 || strings.TrimSpace(string(out.Stdout)) != tc.want {
				t.Fatalf("git commit inside: exit %d %q %s, want author %q", out.ExitCode, out.Stdout, out.Stderr, tc.want)
			}
			d, err := e.c.Diff(ctx, sb.ID)
			if err != nil || len(d.Commits) != 2 {
				t.Fatalf("diff: %+v %v", d, err)
			}
			if tc.git.URL != host {
				return
			}
			branch := "author-" + strings.ReplaceAll(tc.name, " ", "-")
			if _, err := e.c.Export(ctx, sb.ID, api.ExportRequest{Branch: branch}); err != nil {
				t.Fatal(err)
			}
			// Newest first: den's commit of the uncommitted changes (by
			// the author, committed by den), then the one made inside.
			name := tc.want[:strings.Index(tc.want, " <")]
			if got, want := gitHost(t, host, "log", "--format=%an <%ae>|%cn", "main.."+branch), tc.want+"|den\n"+tc.want+"|"+name; got != want {
				t.Errorf("authors|committers on %s: %q, want %q", branch, got, want)
			}
		})
	}
	all, _ := e.c.List(ctx, nil)
	n := len(all)
	for _, bad := range []string{"Ada Lovelace", "<ada@example.com>", "Ada <ada@example.com> x", "Ada <a b@c>", "Ada\n<ada@example.com>"} {
		_, err := e.c.Create(ctx, api.CreateRequest{Git: &api.GitSource{URL: host, Author: bad}})
		if ae := wantKind(t, err, api.KindInvalid); ae.Field != "git.author" {
			t.Errorf("author %q: field %q, want git.author", bad, ae.Field)
		}
	}
	if all, _ := e.c.List(ctx, nil); len(all) != n {
		t.Errorf("refused creates left %d sandboxes", len(all)-n)
	}
}

// The workspace goes in and comes out through the agent, so it works on
// every tier: gvisor with the host image (git inside, a commit carried
// over) and microvm with a busybox image (no git inside: the changes come
// out as one commit).
func TestGitWorkspaceTiers(t *testing.T) {
	e := newTierEnv(t)
	e.c = clientAs(t, e, server.AdminPrincipal)
	host := newGitRepo(t)
	for _, tc := range []struct {
		tier, script string
		commits      int
	}{
		{"gvisor", "cd /workspace && echo two > edit.txt && git -c user.name=a -c user.email=a@b commit -qam inside && echo x > new.txt", 2},
		{"microvm", "cd /workspace && echo two > edit.txt && echo x > new.txt", 1},
	} {
		t.Run(tc.tier, func(t *testing.T) {
			e.need(t, tc.tier)
			req := api.CreateRequest{Runtime: tc.tier, Git: &api.GitSource{URL: host}}
			if tc.tier == "microvm" {
				req.Image = e2e.BusyboxImage(t, e.c)
			}
			sb := e.create(t, req)
			defer e.c.Remove(context.Background(), sb.ID, true)
			if out := e.sh(t, sb.ID, tc.script); out.ExitCode != 0 {
				t.Fatalf("change the workspace: %s", out.Stderr)
			}
			d, err := e.c.Diff(context.Background(), sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Commits) != tc.commits || len(d.Files) != 2 {
				t.Errorf("commits %+v, files %+v", d.Commits, d.Files)
			}
		})
	}
}

// Forks, snapshots and sandboxes created from a snapshot keep the git
// workspace: each has its own (branch den/<its id>, the source's base), so
// an agent can try several ways, see each one's diff and export the one
// that won.
func TestGitWorkspaceForks(t *testing.T) {
	e := newGitEnv(t)
	host := newGitRepo(t)
	ctx := context.Background()
	src := e.create(t, api.CreateRequest{Git: &api.GitSource{URL: host}})
	if out := e.sh(t, src.ID, `cd /workspace && echo shared > edit.txt`); out.ExitCode != 0 {
		t.Fatalf("change the source: %s", out.Stderr)
	}
	forks, err := e.c.Fork(ctx, src.ID, api.ForkRequest{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := e.c.Snapshot(ctx, src.ID, api.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	from := e.create(t, api.CreateRequest{From: snap.ID})
	ways := []*api.Sandbox{forks[0], forks[1], from}
	for i, sb := range ways {
		script := fmt.Sprintf(`cd /workspace && echo way%d > way%d.txt && git branch --show-current`, i, i)
		out := e.sh(t, sb.ID, script)
		if out.ExitCode != 0 || strings.TrimSpace(string(out.Stdout)) != "den/"+sb.ID {
			t.Errorf("%s: branch inside %q (%s), want den/%s", sb.ID[:12], out.Stdout, out.Stderr, sb.ID)
		}
	}
	base := gitHost(t, host, "rev-parse", "main")
	for i, sb := range ways {
		d, err := e.c.Diff(ctx, sb.ID)
		if err != nil {
			t.Fatalf("diff of %s: %v", sb.ID[:12], err)
		}
		var files []string
		for _, f := range d.Files {
			files = append(files, f.Status+" "+f.Path)
		}
		want := fmt.Sprintf("M edit.txt,A way%d.txt", i)
		if strings.Join(files, ",") != want || d.Base != base || d.Branch != "den/"+sb.ID {
			t.Errorf("diff of %s: files %q base %s branch %s; want %q on %s, branch den/%s", sb.ID[:12], files, d.Base, d.Branch, want, base, sb.ID)
		}
	}
	// The source is unchanged by what the forks did.
	if d, err := e.c.Diff(ctx, src.ID); err != nil || len(d.Files) != 1 || d.Files[0].Path != "edit.txt" {
		t.Errorf("diff of the source: %+v %v", d, err)
	}
	// The winner (the second fork) goes to a host branch.
	res, err := e.c.Export(ctx, forks[1].ID, api.ExportRequest{Branch: "agent/winner", Message: "the winner"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Base != base || res.Commits != 1 {
		t.Errorf("export: %+v", res)
	}
	if l := gitHost(t, host, "ls-tree", "-r", "--name-only", "agent/winner"); !strings.Contains(l, "way1.txt") || strings.Contains(l, "way0.txt") || strings.Contains(l, "way2.txt") {
		t.Errorf("files on agent/winner: %s", l)
	}
	if got := gitHost(t, host, "show", "agent/winner:edit.txt", "agent/winner:way1.txt"); got != "shared\nway1" {
		t.Errorf("agent/winner holds %q", got)
	}
	if got := gitHost(t, host, "log", "--format=%s", "main..agent/winner"); got != "the winner" {
		t.Errorf("commits on agent/winner: %q", got)
	}
	// The sandbox made from the snapshot exports too, after its source is gone.
	if err := e.c.Remove(ctx, src.ID, true); err != nil {
		t.Fatal(err)
	}
	e.create(t, api.CreateRequest{Git: &api.GitSource{URL: host}}) // prunes removed sandboxes' workspaces
	if _, err := e.c.Export(ctx, from.ID, api.ExportRequest{Branch: "agent/from-snapshot"}); err != nil {
		t.Fatal(err)
	}
	if got := gitHost(t, host, "show", "agent/from-snapshot:way2.txt"); got != "way2" {
		t.Errorf("agent/from-snapshot holds %q", got)
	}
	again := e.create(t, api.CreateRequest{From: snap.ID})
	if d, err := e.c.Diff(ctx, again.ID); err != nil || len(d.Files) != 1 || d.Files[0].Path != "edit.txt" {
		t.Errorf("diff of a second sandbox from the snapshot (source removed): %+v %v", d, err)
	}
	// A sandbox of another workspace (another repository) restored to the
	// snapshot takes the snapshot's workspace with its files.
	other := gitwstest.Repo(t, map[string]string{"elsewhere.txt": "x\n"})
	plain := e.create(t, api.CreateRequest{Git: &api.GitSource{URL: other}})
	if _, err := e.c.Restore(ctx, plain.ID, snap.ID); err != nil {
		t.Fatal(err)
	}
	d, err := e.c.Diff(ctx, plain.ID)
	if err != nil || d.Base != base || d.Source != host || len(d.Files) != 1 || d.Files[0].Path != "edit.txt" {
		t.Errorf("diff after restoring the snapshot: %+v %v, want edit.txt on %s of %s", d, err, base, host)
	}
	if out := e.sh(t, plain.ID, "cd /workspace && git branch --show-current"); strings.TrimSpace(string(out.Stdout)) != "den/"+plain.ID {
		t.Errorf("branch inside after the restore: %q %s", out.Stdout, out.Stderr)
	}
}
