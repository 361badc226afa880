package agent

import (
	"os"
	"path/filepath"
	"testing"
)

func TestNameInHosts(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "etc", "hosts")
	// Missing (and its directory too): the localhost lines and the name.
	if err := NameInHosts(root, "web.example"); err != nil {
		t.Fatal(err)
	}
	want := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tweb.example web\n"
	if b, _ := os.ReadFile(file); string(b) != want {
		t.Fatalf("new hosts: %q, want %q", b, want)
	}
	// The image's lines stay; an earlier name's line goes.
	os.WriteFile(file, []byte("# image\n10.0.0.1 db\n127.0.1.1 old\n::1 localhost"), 0o644)
	if err := NameInHosts(root, "fork"); err != nil {
		t.Fatal(err)
	}
	want = "# image\n10.0.0.1 db\n::1 localhost\n127.0.1.1\tfork\n"
	if b, _ := os.ReadFile(file); string(b) != want {
		t.Fatalf("renamed hosts: %q, want %q", b, want)
	}
	// A symlinked hosts file is the image's: left alone.
	other := t.TempDir()
	os.MkdirAll(filepath.Join(other, "etc"), 0o755)
	os.Symlink(file, filepath.Join(other, "etc", "hosts"))
	if err := NameInHosts(other, "other"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); string(b) != want {
		t.Fatalf("wrote through a symlink: %q", b)
	}
	// An /etc that is a symlink out of the root is not followed out: the
	// write fails rather than land in the directory it points to.
	out := t.TempDir()
	escape := t.TempDir()
	if err := os.Symlink(out, filepath.Join(escape, "etc")); err != nil {
		t.Fatal(err)
	}
	if err := NameInHosts(escape, "x"); err == nil {
		t.Fatal("NameInHosts followed /etc out of the root")
	}
	if _, err := os.Stat(filepath.Join(out, "hosts")); !os.IsNotExist(err) {
		t.Fatalf("a hosts file appeared outside the root: %v", err)
	}
}
