// Package fuzztest holds what several packages' fuzz targets share: tar
// streams built from a list of entries, escape attempts to seed archive
// extractors with, and a check that an extraction wrote nothing outside its
// destination. Only tests import it.
package fuzztest

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Entry is one tar entry: a regular file unless Type says otherwise.
type Entry struct {
	Name, Body, Link string
	Type             byte
	Mode             int64 // default 0644 (files), 0755 (dirs), 0777 (symlinks)
	Uid, Gid         int
	PAX              map[string]string
	Major            int64     // a device's major number
	ModTime          time.Time // default 2001-09-09
}

// Tar returns a tar stream of the entries.
func Tar(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		typ := e.Type
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.Mode
		if mode == 0 {
			switch typ {
			case tar.TypeDir:
				mode = 0o755
			case tar.TypeSymlink:
				mode = 0o777
			default:
				mode = 0o644
			}
		}
		mtime := e.ModTime
		if mtime.IsZero() {
			mtime = time.Unix(1e9, 0)
		}
		h := &tar.Header{Name: e.Name, Typeflag: typ, Linkname: e.Link, Mode: mode, Uid: e.Uid, Gid: e.Gid,
			ModTime: mtime, PAXRecords: e.PAX, Devmajor: e.Major, Format: tar.FormatPAX}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %q: %v", e.Name, err)
		}
		if typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.Body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// EscapeTars are tar streams that try to write outside the directory they
// are extracted into, each under the root name root (the name a sandbox's
// archive endpoint puts first): "..", absolute names, entries through
// symlinks that point out (relative and absolute, to the sibling
// directory "outside" and its file "sentinel"), hard links out, and a
// symlink replaced by a file.
func EscapeTars(t testing.TB, root string) [][]byte {
	p := func(s string) string { return root + "/" + s }
	dir := Entry{Name: root + "/", Type: tar.TypeDir}
	return [][]byte{
		Tar(t, dir, Entry{Name: p("a"), Body: "a"}, Entry{Name: p("d/"), Type: tar.TypeDir, Mode: 0o700}, Entry{Name: p("d/b"), Body: "b"}),
		Tar(t, dir, Entry{Name: p("../outside/pwned"), Body: "x"}),
		Tar(t, dir, Entry{Name: "../outside/pwned", Body: "x"}),
		Tar(t, Entry{Name: "/outside/pwned", Body: "x"}),
		Tar(t, dir,
			Entry{Name: p("esc"), Type: tar.TypeSymlink, Link: "../../outside"},
			Entry{Name: p("esc/pwned"), Body: "x"},
			Entry{Name: p("esc/sentinel"), Body: "overwritten"}),
		Tar(t, dir,
			Entry{Name: p("up"), Type: tar.TypeSymlink, Link: "../outside"},
			Entry{Name: p("up/sentinel"), Body: "overwritten"},
			Entry{Name: p("f"), Type: tar.TypeSymlink, Link: "../outside/sentinel"},
			Entry{Name: p("f"), Body: "replaced"}),
		Tar(t, dir,
			Entry{Name: p("s"), Type: tar.TypeSymlink, Link: "/"},
			Entry{Name: p("s/tmp/pwned"), Body: "x"}),
		Tar(t, dir,
			Entry{Name: p("h"), Type: tar.TypeLink, Link: "../outside/sentinel"},
			Entry{Name: p("h2"), Type: tar.TypeLink, Link: p("../../outside/sentinel")},
			Entry{Name: p("l"), Type: tar.TypeSymlink, Link: "../../outside/sentinel"},
			Entry{Name: p("h3"), Type: tar.TypeLink, Link: p("l")},
			Entry{Name: p("h3"), Body: "through the link"}),
		Tar(t, dir, Entry{Name: p("p"), Type: tar.TypeFifo}, Entry{Name: p("dev"), Type: tar.TypeChar}),
		[]byte("not a tar"),
		{},
	}
}

// Jail is a directory with a destination inside it and a sibling
// directory "outside" holding a file "sentinel", for checking that an
// extraction into Dest leaves everything else alone.
type Jail struct {
	Parent, Dest, Outside, Sentinel string
	sentinel                        os.FileInfo
}

// NewJail makes the layout in a fresh temporary directory; dest is the
// destination's name in it (created only if mkdest).
func NewJail(t testing.TB, dest string, mkdest bool) *Jail {
	t.Helper()
	parent := t.TempDir()
	j := &Jail{Parent: parent, Dest: filepath.Join(parent, dest), Outside: filepath.Join(parent, "outside")}
	j.Sentinel = filepath.Join(j.Outside, "sentinel")
	if err := os.Mkdir(j.Outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if mkdest {
		if err := os.MkdirAll(j.Dest, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(j.Sentinel, []byte("sentinel"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := os.Lstat(j.Sentinel)
	if err != nil {
		t.Fatal(err)
	}
	j.sentinel = st
	return j
}

// Check fails t if anything but Dest and what is below it was created in
// Parent, or if the sentinel changed (content, mode, links, time). It also
// makes everything under Parent removable again for t's cleanup.
func (j *Jail) Check(t testing.TB) {
	t.Helper()
	err := filepath.WalkDir(j.Parent, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			os.Chmod(p, 0o755) // a 0000 directory must still be walked and removed
		}
		switch {
		case p == j.Parent, p == j.Outside, p == j.Sentinel:
		case p == j.Dest, strings.HasPrefix(p, j.Dest+string(filepath.Separator)):
		default:
			t.Errorf("%s was created outside the destination %s", p, j.Dest)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Lstat(j.Sentinel)
	if err != nil {
		t.Fatalf("sentinel outside the destination: %v", err)
	}
	b, _ := os.ReadFile(j.Sentinel)
	if string(b) != "sentinel" || st.Mode() != j.sentinel.Mode() || !st.ModTime().Equal(j.sentinel.ModTime()) || !os.SameFile(st, j.sentinel) {
		t.Errorf("sentinel outside the destination changed: %q mode %v time %v", b, st.Mode(), st.ModTime())
	}
	if n := nlink(st); n != 1 {
		t.Errorf("sentinel outside the destination got %d hard links", n)
	}
	for _, p := range []string{"/pwned", "/tmp/pwned", "/outside"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s exists: written through an absolute name or link", p)
		}
	}
}
