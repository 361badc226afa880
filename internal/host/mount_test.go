package host

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A dangling symlink as target is refused rather than followed out.
func TestMkdirInRoot(t *testing.T) {
	root := t.TempDir()
	os.Symlink("../../../../outside", filepath.Join(root, "dangling"))
	os.Symlink("/sub", filepath.Join(root, "abs"))
	os.Mkdir(filepath.Join(root, "sub"), 0o755)
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rfd)
	if fd, err := MkdirInRoot(rfd, "/dangling/x"); err == nil {
		unix.Close(fd)
		t.Error("dangling symlink followed")
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(root), "outside")); err == nil {
		t.Error("created outside the root")
	}
	fd, err := MkdirInRoot(rfd, "/abs/a/b")
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if st, err := os.Stat(filepath.Join(root, "sub/a/b")); err != nil || !st.IsDir() {
		t.Errorf("/abs/a/b not created under /sub: %v", err)
	}
}
