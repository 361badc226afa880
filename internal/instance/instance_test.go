package instance

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestCgroupParent(t *testing.T) {
	a, b := CgroupParent("/srv/den-a"), CgroupParent("/srv/den-b")
	if a == b {
		t.Fatalf("two data directories share the cgroup parent %s", a)
	}
	if a != CgroupParent("/srv/den-a") {
		t.Fatal("the cgroup parent of one data directory changes")
	}
	if !strings.HasPrefix(a, "den-") || len(a) != len("den-")+12 || strings.Contains(a, "/") {
		t.Errorf("cgroup parent %q: want den- and 12 hex digits", a)
	}
	if got := CgroupParent(DefaultData); got != "den" {
		t.Errorf("the default data directory's parent is %q, want den (that of earlier releases)", got)
	}
}

func TestCanonicalResolvesSymlinks(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	os.Mkdir(real, 0o700)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	r, err := Canonical(real)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Canonical(link)
	if err != nil {
		t.Fatal(err)
	}
	if r != l || CgroupParent(r) != CgroupParent(l) {
		t.Errorf("one directory, two identities: %s and %s", r, l)
	}
}

func TestLockIsExclusive(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Write(Record{Run: "/run/x", CgroupParent: CgroupParent(dir)}); err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(dir)
	var busy *BusyError
	if !errors.As(err, &busy) {
		t.Fatalf("a second hold of a held data directory: %v, want a BusyError", err)
	}
	if busy.Pid != os.Getpid() || !strings.Contains(err.Error(), "process "+strconv.Itoa(os.Getpid())) {
		t.Errorf("busy error %q does not name the holder %d", err, os.Getpid())
	}
	rec, ok, err := Read(dir)
	if err != nil || !ok || rec.Pid != os.Getpid() || rec.Run != "/run/x" {
		t.Errorf("record %+v %v %v", rec, ok, err)
	}
	l.Release()
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	l2.Release()
}
