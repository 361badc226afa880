package tarball

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

type entry struct {
	hdr  *tar.Header
	body string
}

func readAll(t *testing.T, b []byte) []entry {
	t.Helper()
	var out []entry
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, entry{hdr, string(body)})
	}
}

func add(t *testing.T, w *Writer, dir, name string) error {
	t.Helper()
	p := filepath.Join(dir, name)
	info, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	target, _ := os.Readlink(p)
	return w.Add(name, info, target, func() (io.ReadCloser, error) { return os.Open(p) })
}

func TestAddKindsLinksAndOwners(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), []byte("hello"), 0o640)
	os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b"))
	os.Symlink("a", filepath.Join(dir, "s"))
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	if err := syscall.Mkfifo(filepath.Join(dir, "f"), 0o644); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2024, 1, 2, 3, 4, 5, 900_000_000, time.UTC)
	os.Chtimes(filepath.Join(dir, "a"), mtime, mtime)
	os.Lchown(filepath.Join(dir, "a"), 1234, 5678)

	for _, keep := range []bool{false, true} {
		var buf bytes.Buffer
		w := NewWriter(&buf)
		w.KeepOwner, w.Seconds, w.HardLinks = keep, true, true
		for _, n := range []string{"a", "b", "s", "d"} {
			if err := add(t, w, dir, n); err != nil {
				t.Fatal(n, err)
			}
		}
		if err := add(t, w, dir, "f"); !errors.Is(err, ErrSkipped) {
			t.Fatalf("fifo: %v, want ErrSkipped", err)
		}
		if err := w.AddBytes("x", []byte("xyz")); err != nil {
			t.Fatal(err)
		}
		w.Close()
		got := readAll(t, buf.Bytes())
		if len(got) != 5 {
			t.Fatalf("%d entries, want 5 (the fifo left out)", len(got))
		}
		a, b, s, d, x := got[0], got[1], got[2], got[3], got[4]
		if a.body != "hello" || a.hdr.Mode&0o777 != 0o640 || !a.hdr.ModTime.Equal(mtime.Truncate(time.Second)) || a.hdr.Uname != "" {
			t.Errorf("a: %+v %q", a.hdr, a.body)
		}
		wantUID := 0
		if keep && os.Geteuid() == 0 {
			wantUID = 1234
		}
		if !keep || os.Geteuid() == 0 {
			if a.hdr.Uid != wantUID {
				t.Errorf("keep=%v: uid %d, want %d", keep, a.hdr.Uid, wantUID)
			}
		}
		if b.hdr.Typeflag != tar.TypeLink || b.hdr.Linkname != "a" || b.body != "" {
			t.Errorf("b: %+v, want a hard link to a", b.hdr)
		}
		if s.hdr.Typeflag != tar.TypeSymlink || s.hdr.Linkname != "a" {
			t.Errorf("s: %+v", s.hdr)
		}
		if d.hdr.Typeflag != tar.TypeDir || d.hdr.Name != "d/" {
			t.Errorf("d: %+v", d.hdr)
		}
		if x.body != "xyz" || x.hdr.Mode != 0o644 {
			t.Errorf("x: %+v %q", x.hdr, x.body)
		}
	}
}

// A file that shrinks after its header is built is padded with zeros to
// the header's size, so the stream stays readable.
func TestAddPadsShrunkFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a")
	os.WriteFile(p, []byte("hello world"), 0o644)
	info, _ := os.Lstat(p)
	var buf bytes.Buffer
	w := NewWriter(&buf)
	err := w.Add("a", info, "", func() (io.ReadCloser, error) {
		os.WriteFile(p, []byte("hi"), 0o644)
		return os.Open(p)
	})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	got := readAll(t, buf.Bytes())
	if len(got) != 1 || got[0].body != "hi"+string(make([]byte, 9)) {
		t.Fatalf("got %+v", got)
	}
}

// Without HardLinks every name of a file carries its body; an open error
// wrapped by Skip leaves the entry out.
func TestAddNoHardLinksAndSkip(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), []byte("hello"), 0o644)
	os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b"))
	var buf bytes.Buffer
	w := NewWriter(&buf)
	add(t, w, dir, "a")
	add(t, w, dir, "b")
	info, _ := os.Lstat(filepath.Join(dir, "a"))
	err := w.Add("c", info, "", func() (io.ReadCloser, error) { return nil, Skip(os.ErrPermission) })
	if !errors.Is(err, ErrSkipped) || !errors.Is(err, os.ErrPermission) {
		t.Fatalf("err %v, want ErrSkipped wrapping the open error", err)
	}
	w.Close()
	got := readAll(t, buf.Bytes())
	if len(got) != 2 || got[1].hdr.Typeflag != tar.TypeReg || got[1].body != "hello" {
		t.Fatalf("got %+v", got)
	}
}
