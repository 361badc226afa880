package gitws

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/gitws/gitwstest"
)

// dirInside stands in for a sandbox: its workspace is a directory of the
// test's, packed the way the agent packs /workspace.
type dirInside struct{ dir string }

func (d dirInside) Archive(ctx context.Context) (io.ReadCloser, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(d.dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, _ := e.Info()
		target := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			target, _ = os.Readlink(p)
		}
		hdr, _ := tar.FileInfoHeader(info, target)
		rel, _ := filepath.Rel(d.dir, p)
		hdr.Name = "workspace/" + rel
		if rel == "." {
			hdr.Name = "workspace"
		}
		if info.IsDir() {
			hdr.Name += "/"
		}
		tw.WriteHeader(hdr)
		if info.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			tw.Write(b)
		}
		return nil
	})
	tw.Close()
	return io.NopCloser(&buf), err
}

func (d dirInside) Bundle(ctx context.Context, base string, w io.Writer) (bool, error) {
	h, err := exec.Command("git", "-C", d.dir, "rev-parse", "HEAD").Output()
	if err != nil || strings.TrimSpace(string(h)) == base {
		return false, nil
	}
	cmd := exec.Command("git", "-C", d.dir, "bundle", "create", "--quiet", "-", base+"..HEAD")
	cmd.Stdout = w
	return cmd.Run() == nil, nil
}

// hostRepo makes a repository with a few files on main.
func hostRepo(t *testing.T) string {
	return gitwstest.Repo(t, map[string]string{"keep.txt": "keep\n", "edit.txt": "one\n", "gone.txt": "gone\n",
		"run.sh": "#!/bin/sh\n", ".gitignore": "*.log\nbuild/\n"})
}

func TestSnapshotDiffExport(t *testing.T) {
	host := hostRepo(t)
	ctx := context.Background()
	st := &Store{Dir: t.TempDir()}
	src, err := ParseSource(host)
	if err != nil {
		t.Fatal(err)
	}
	repo, err := st.Clone(ctx, src, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Keep(repo, "sb1"); err != nil {
		t.Fatal(err)
	}
	// The checkout, unpacked where a sandbox would have it.
	var tb bytes.Buffer
	if err := repo.WriteCheckout(ctx, &tb, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	untar(t, &tb, root)
	ws := filepath.Join(root, "workspace")
	if got := gitwstest.Git(t, ws, "branch", "--show-current"); got != "den/sb1" {
		t.Fatalf("branch inside = %q", got)
	}
	// A commit inside, then uncommitted changes of every kind.
	os.WriteFile(filepath.Join(ws, "edit.txt"), []byte("two\n"), 0o644)
	gitwstest.Git(t, ws, "commit", "-qam", "inside commit")
	os.Remove(filepath.Join(ws, "gone.txt"))
	os.WriteFile(filepath.Join(ws, "new.bin"), []byte{0, 1, 2, 0xff, 0}, 0o644)
	os.Chmod(filepath.Join(ws, "run.sh"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(ws, "pw"))
	os.WriteFile(filepath.Join(ws, "debug.log"), []byte("ignored"), 0o644)
	os.MkdirAll(filepath.Join(ws, "build", "x"), 0o755)
	os.WriteFile(filepath.Join(ws, "build", "x", "out.o"), []byte("ignored"), 0o644)
	os.WriteFile(filepath.Join(ws, "we\"ird\nname"), []byte("odd"), 0o644)
	// Planted in the sandbox's .git: must never matter.
	os.WriteFile(filepath.Join(ws, ".git", "config"), []byte("[core]\n\tfsmonitor = touch /tmp/pwned\n"), 0o644)

	snap, err := repo.Snapshot(ctx, dirInside{ws}, "uncommitted")
	if err != nil {
		t.Fatal(err)
	}
	d, err := repo.Diff(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range d.Files {
		got[f.Path] = f.Status
	}
	want := map[string]string{"edit.txt": "M", "gone.txt": "D", "new.bin": "A", "run.sh": "M", "pw": "A", "we\"ird\nname": "A"}
	for p, s := range want {
		if got[p] != s {
			t.Errorf("%q: status %q, want %q (all: %v)", p, got[p], s, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("files %v, want %v", got, want)
	}
	if len(d.Commits) != 2 || d.Commits[0].Subject != "inside commit" || d.Commits[1].Subject != "uncommitted" {
		t.Errorf("commits %+v", d.Commits)
	}
	if !bytes.Contains(d.Patch, []byte("GIT binary patch")) || !bytes.Contains(d.Patch, []byte("new mode 100755")) || !bytes.Contains(d.Patch, []byte("new file mode 120000")) {
		t.Errorf("patch lacks binary, mode or symlink parts:\n%s", d.Patch)
	}
	// The patch applies to the base.
	chk := t.TempDir()
	gitwstest.Git(t, chk, "clone", "-q", host, ".")
	os.WriteFile(filepath.Join(chk, "p.diff"), d.Patch, 0o644)
	gitwstest.Git(t, chk, "apply", "--index", "p.diff")

	// Snapshots at once (two diffs of one sandbox) take turns and agree.
	heads := make(chan string, 4)
	for range 4 {
		go func() {
			unlock := repo.Lock()
			defer unlock()
			s, err := repo.Snapshot(ctx, dirInside{ws}, "uncommitted")
			if err != nil {
				heads <- err.Error()
				return
			}
			heads <- s.Head
		}()
	}
	for range 4 {
		if h := <-heads; h != snap.Head {
			t.Errorf("a concurrent snapshot: %s, want %s", h, snap.Head)
		}
	}

	res, err := repo.Export(ctx, snap, "feature", false)
	if err != nil {
		t.Fatal(err)
	}
	if res.Commits != 2 || res.Commit != snap.Head {
		t.Errorf("export %+v", res)
	}
	if l := gitwstest.Git(t, host, "ls-tree", "feature", "pw"); !strings.HasPrefix(l, "120000") {
		t.Errorf("pw is not a symlink in the export: %s", l)
	}
	// Exporting again moves forward; the checked-out branch is refused.
	if _, err := repo.Export(ctx, snap, "feature", false); err != nil {
		t.Errorf("export again: %v", err)
	}
	if _, err := repo.Export(ctx, snap, "main", false); api.KindOf(err) != api.KindConflict {
		t.Errorf("export to the checked-out branch: %v", err)
	}
}

func untar(t *testing.T, r io.Reader, dir string) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			os.Symlink(hdr.Linkname, p)
		case tar.TypeReg:
			b, _ := io.ReadAll(tr)
			os.WriteFile(p, b, os.FileMode(hdr.Mode)&0o777)
		}
	}
}

func TestParseSource(t *testing.T) {
	for _, c := range []struct {
		in, url, host string
		bad           bool
	}{
		{in: "https://example.com/x.git", url: "https://example.com/x.git"},
		{in: "git@example.com:x.git", url: "git@example.com:x.git"},
		{in: "/srv/repo/", url: "/srv/repo", host: "/srv/repo"},
		{in: "file:///srv/repo", url: "/srv/repo", host: "/srv/repo"},
		{in: "", bad: true},
		{in: "relative/path", bad: true},
		{in: "ext::sh -c touch% /tmp/x", bad: true},
		{in: "-uhttps://x", bad: true},
		{in: "ftp://example.com/x", bad: true},
		{in: "file://otherhost/x", bad: true},
	} {
		s, err := ParseSource(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("%q: accepted as %+v", c.in, s)
			}
			continue
		}
		if err != nil || s.URL != c.url || s.HostPath != c.host {
			t.Errorf("%q: %+v, %v", c.in, s, err)
		}
	}
}

func TestParseAuthor(t *testing.T) {
	for in, want := range map[string]string{
		"Ada Lovelace <ada@example.com>": "Ada Lovelace|ada@example.com",
		"  Ada   <ada@example.com>  ":    "Ada|ada@example.com",
		"Zoë Ünicode <z@ex.org>":         "Zoë Ünicode|z@ex.org",
		"den<den@localhost>":             "den|den@localhost",
		"Ada Lovelace":                   "",
		"<ada@example.com>":              "",
		"Ada <ada@example.com> trailing": "",
		"Ada <a b@example.com>":          "",
		"Ada <<ada@example.com>>":        "",
		"Ada\n<ada@example.com>":         "",
		"Ada <ada@example.com>\x00":      "",
		"":                               "",
	} {
		name, email, err := ParseAuthor(in)
		if want == "" {
			if ae, ok := err.(*api.Error); !ok || ae.Field != "git.author" {
				t.Errorf("ParseAuthor(%q) = %q %q %v, want an invalid git.author", in, name, email, err)
			}
			continue
		}
		if err != nil || name+"|"+email != want {
			t.Errorf("ParseAuthor(%q) = %q %q %v, want %s", in, name, email, err, want)
		}
	}
}

// BenchmarkStoreCopy is the cost a git workspace adds to a fork or a
// snapshot: a copy of the daemon's repository (2,000 files of 1 KiB).
func BenchmarkStoreCopy(b *testing.B) {
	files := map[string]string{}
	for i := range 2000 {
		files[fmt.Sprintf("d%02d/f%04d.txt", i%40, i)] = strings.Repeat(fmt.Sprintf("line %d\n", i), 128)
	}
	host := gitwstest.Repo(b, files)
	ctx := context.Background()
	st := &Store{Dir: b.TempDir()}
	src, _ := ParseSource(host)
	repo, err := st.Clone(ctx, src, "")
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Keep(repo, "src"); err != nil {
		b.Fatal(err)
	}
	n := 0
	for b.Loop() {
		n++
		if _, err := st.Copy(ctx, "src", fmt.Sprintf("fork%d", n), fmt.Sprintf("den/fork%d", n)); err != nil {
			b.Fatal(err)
		}
	}
}
