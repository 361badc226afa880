package agent

import (
	"os"
	"path/filepath"
	"testing"
)

func TestNameInHosts(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "etc", "hosts")
	// Missing (and its directory too): the localhost lines and the name.
	if err := NameInHosts(file, "web.example"); err != nil {
		t.Fatal(err)
	}
	want := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tweb.example web\n"
	if b, _ := os.ReadFile(file); string(b) != want {
		t.Fatalf("new hosts: %q, want %q", b, want)
	}
	// The image's lines stay; an earlier name's line goes.
	os.WriteFile(file, []byte("# image\n10.0.0.1 db\n127.0.1.1 old\n::1 localhost"), 0o644)
	if err := NameInHosts(file, "fork"); err != nil {
		t.Fatal(err)
	}
	want = "# image\n10.0.0.1 db\n::1 localhost\n127.0.1.1\tfork\n"
	if b, _ := os.ReadFile(file); string(b) != want {
		t.Fatalf("renamed hosts: %q, want %q", b, want)
	}
	// A symlink the image manages is left alone.
	link := filepath.Join(dir, "link")
	os.Symlink(file, link)
	if err := NameInHosts(link, "other"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); string(b) != want {
		t.Fatalf("wrote through a symlink: %q", b)
	}
}
