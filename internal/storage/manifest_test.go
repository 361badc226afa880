package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeAt writes data at each offset of a new file of size bytes (sparse
// where nothing is written) or, dense, with every byte written.
func writeAt(t *testing.T, path string, size int64, dense bool, parts map[int64]string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if dense {
		zero := make([]byte, 1<<20)
		for off := int64(0); off < size; off += int64(len(zero)) {
			if _, err := f.WriteAt(zero[:min(int64(len(zero)), size-off)], off); err != nil {
				t.Fatal(err)
			}
		}
	} else if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for off, s := range parts {
		if _, err := f.WriteAt([]byte(s), off); err != nil {
			t.Fatal(err)
		}
	}
}

// Big files (a microVM's disk image) are hashed by their non-zero blocks:
// the sum depends on the content, not on which parts are holes, and any
// changed byte changes it.
func TestBigFileHash(t *testing.T) {
	dir := t.TempDir()
	const size = 64<<20 + 123 // not a whole number of blocks
	parts := map[int64]string{0: "head", 5 << 20: "middle", 9<<20 + 4095: "across a block boundary", size - 3: "end"}
	sparse, dense := filepath.Join(dir, "sparse"), filepath.Join(dir, "dense")
	writeAt(t, sparse, size, false, parts)
	writeAt(t, dense, size, true, parts)
	sum := func(p string) string {
		t.Helper()
		s, err := hashFile(p, make([]byte, hashBuf))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := sum(sparse), sum(dense)
	if !strings.HasPrefix(a, zsPrefix) || a != b {
		t.Fatalf("sparse %s, dense %s: want the same zs1 sum", a, b)
	}
	parts[5<<20] = "middlE"
	writeAt(t, dense, size, true, parts)
	if c := sum(dense); c == a {
		t.Fatal("a changed byte did not change the sum")
	}
	// The same content one byte longer differs too.
	writeAt(t, dense, size+1, false, map[int64]string{0: "head", 5 << 20: "middle", 9<<20 + 4095: "across a block boundary", size - 3: "end"})
	if c := sum(dense); c == a {
		t.Fatal("a longer file has the same sum")
	}
	// Small files keep the plain SHA-256 of their content.
	small := filepath.Join(dir, "small")
	os.WriteFile(small, []byte("abc"), 0o644)
	if s := sum(small); s != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("small file: %s", s)
	}
}

// A manifest recorded with the plain SHA-256 of a big file (before big
// files were hashed by blocks) still verifies, and still catches a change.
func TestVerifyOldBigFileSums(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "disk.img")
	writeAt(t, p, 32<<20, false, map[int64]string{1 << 20: "data"})
	m, err := BuildManifest(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(p)
	plain, err := hashAll(f, make([]byte, hashBuf))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	for i := range m.Entries {
		if m.Entries[i].Path == "disk.img" {
			m.Entries[i].SHA256 = plain
		}
	}
	m.Digest = m.digest()
	if err := m.Verify(context.Background(), dir); err != nil {
		t.Fatalf("old-style manifest: %v", err)
	}
	writeAt(t, p, 32<<20, false, map[int64]string{1 << 20: "dAta"})
	if err := m.Verify(context.Background(), dir); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "disk.img") {
		t.Fatalf("changed big file against an old-style manifest: %v", err)
	}
}
