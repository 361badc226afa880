package gitws

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/den-dev/den/internal/fuzztest"
)

// FuzzWorkspaceImport feeds arbitrary tar streams, as a sandbox's
// /workspace comes out through the agent, through snapshotting's scan and
// git fast-import into a bare repository and checks the commit it makes:
// the import never fails on a stream the scan accepted (no name can break
// or inject into the fast-import stream), the commit carries exactly its
// message, and its tree holds only names of the tar's workspace entries,
// none with a ".git" or ".." component, each regular file with the
// content of the first entry of that name.
func FuzzWorkspaceImport(f *testing.F) {
	ctx := context.Background()
	dir := filepath.Join(f.TempDir(), "repo.git")
	run := func(stdin string, args ...string) string {
		cmd := gitCmd(ctx, "", args...)
		if len(args) > 0 && args[0] != "init" {
			cmd.Dir = dir
		}
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			f.Fatalf("git %s: %v: %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("", "init", "-q", "--bare", dir)
	parent := run("", "commit-tree", run("", "mktree"), "-m", "base")
	r := &Repo{Dir: dir}
	ws := func(entries ...fuzztest.Entry) []byte {
		for i := range entries {
			entries[i].Name = "workspace/" + entries[i].Name
		}
		return fuzztest.Tar(f, append([]fuzztest.Entry{{Name: "", Type: tar.TypeDir}}, entries...)...)
	}
	f.Add(ws(fuzztest.Entry{Name: "a.txt", Body: "a"}, fuzztest.Entry{Name: "d/", Type: tar.TypeDir}, fuzztest.Entry{Name: "d/x", Body: "x", Mode: 0o755},
		fuzztest.Entry{Name: "l", Type: tar.TypeSymlink, Link: "../../etc/passwd"}, fuzztest.Entry{Name: "h", Type: tar.TypeLink, Link: "workspace/a.txt"}))
	f.Add(ws(fuzztest.Entry{Name: "x\nM 100644 inline evil\n", Body: "q"}, fuzztest.Entry{Name: "q\"uote\\d", Body: "q"}, fuzztest.Entry{Name: "\x01ctl", Body: "c"}))
	f.Add(ws(fuzztest.Entry{Name: ".git/config", Body: "[core]\n"}, fuzztest.Entry{Name: "sub/.GIT/hooks/x", Body: "x"}, fuzztest.Entry{Name: "../escape", Body: "e"},
		fuzztest.Entry{Name: "a/./b", Body: "b"}, fuzztest.Entry{Name: "a//b", Body: "b"}))
	f.Add(ws(fuzztest.Entry{Name: "a", Body: "file"}, fuzztest.Entry{Name: "a/b", Body: "below a file"}, fuzztest.Entry{Name: "a", Body: "again"}))
	f.Add(ws(fuzztest.Entry{Name: "h", Type: tar.TypeLink, Link: "workspace/.git/config"}, fuzztest.Entry{Name: "p", Type: tar.TypeFifo}))
	for _, s := range fuzztest.EscapeTars(f, "workspace") {
		f.Add(s)
	}
	const message = "den snapshot\n\nwith a body"
	f.Fuzz(func(t *testing.T, data []byte) {
		spool := filepath.Join(t.TempDir(), "ws.tar")
		if err := os.WriteFile(spool, data, 0o600); err != nil {
			t.Fatal(err)
		}
		entries, _, err := scanTar(spool)
		if err != nil {
			return // a malformed stream is refused
		}
		if err := r.importTree(ctx, spool, entries, nil, parent, message, ""); err != nil {
			t.Fatalf("import of the scanned entries %+v: %v", entries, err)
		}
		// What the tar holds, by workspace name: the first regular file's content.
		names := map[string]bool{}
		first := map[string][]byte{}
		tr := tar.NewReader(bytes.NewReader(data))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			n := workspaceName(h.Name)
			if n == "" {
				continue
			}
			names[n] = true
			if _, seen := first[n]; !seen && h.Typeflag == tar.TypeReg {
				b := new(bytes.Buffer)
				b.ReadFrom(tr)
				first[n] = b.Bytes()
			} else if !seen {
				first[n] = nil
			}
		}
		cmd := gitCmd(ctx, dir, "ls-tree", "-r", "-z", "refs/den/head")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("ls-tree: %v", err)
		}
		for _, rec := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
			if rec == "" {
				continue
			}
			meta, p, _ := strings.Cut(rec, "\t")
			if !names[p] {
				t.Fatalf("the commit holds %q, which is no workspace entry of the tar (%v)", p, names)
			}
			for _, part := range strings.Split(p, "/") {
				if strings.EqualFold(part, ".git") || part == ".." || part == "." || part == "" {
					t.Fatalf("the commit holds %q", p)
				}
			}
			if f := strings.Fields(meta); len(f) == 3 && f[0] != "120000" && f[1] == "blob" && first[p] != nil {
				got, err := gitCmd(ctx, dir, "cat-file", "blob", f[2]).Output()
				if err != nil || !bytes.Equal(got, first[p]) {
					t.Fatalf("%s holds %q, the tar's first entry %q, %v", p, got, first[p], err)
				}
			}
		}
		msg, err := gitCmd(ctx, dir, "log", "-1", "--format=%B", "refs/den/head").Output()
		if err != nil || strings.TrimSpace(string(msg)) != message {
			t.Fatalf("commit message %q, %v", msg, err)
		}
	})
}
