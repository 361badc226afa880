package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func fuzzSeeds(t testing.TB) [][]byte {
	return [][]byte{
		baseLayer(t),
		topLayer(t),
		mkTar(t, ent{name: "../outside/pwned", body: "x"}),
		mkTar(t, ent{name: "/abs", body: "x"}),
		// Relative symlinks that would reach the sibling "outside" directory
		// if they were ever followed.
		mkTar(t,
			ent{name: "esc", typ: tar.TypeSymlink, link: "../outside"},
			ent{name: "esc/pwned", body: "x"},
			ent{name: "esc/sentinel", body: "overwritten"},
			ent{name: "esc/.wh.sentinel"},
			ent{name: "esc/.wh..wh..opq"},
			ent{name: "esc/d/", typ: tar.TypeDir, mode: 0o777},
			ent{name: "esc/l", typ: tar.TypeLink, link: "esc/sentinel"}),
		mkTar(t,
			ent{name: "a/", typ: tar.TypeDir},
			ent{name: "a/b", typ: tar.TypeSymlink, link: "../../outside"},
			ent{name: "a/b/pwned", body: "x"},
			ent{name: "h", typ: tar.TypeLink, link: "a/b/sentinel"},
			ent{name: "h2", typ: tar.TypeLink, link: "../outside/sentinel"}),
		mkTar(t,
			ent{name: "d/", typ: tar.TypeDir, mode: 0o777},
			ent{name: "d", typ: tar.TypeSymlink, link: "../outside"},
			ent{name: "f", typ: tar.TypeSymlink, link: "../outside/sentinel"},
			ent{name: "f", body: "replaced"}),
		mkTar(t,
			ent{name: "dev/sda", typ: tar.TypeBlock, major: 8},
			ent{name: "p", typ: tar.TypeFifo},
			ent{name: "../.wh.outside"},
			ent{name: ".wh.."},
			ent{name: "x/.wh..."}),
	}
}

// FuzzUnpack feeds arbitrary tar streams to the unpacker and checks that
// nothing is ever created or changed outside the destination directory, and
// that no device node other than an overlayfs whiteout is created.
func FuzzUnpack(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		t.Cleanup(func() { removeAll(parent) })
		dest := filepath.Join(parent, "root")
		outside := filepath.Join(parent, "outside")
		sentinel := filepath.Join(outside, "sentinel")
		for _, d := range []string{dest, outside} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(sentinel, []byte("sentinel"), 0o644); err != nil {
			t.Fatal(err)
		}
		before := fileID(t, sentinel)
		outsideBefore := lstat(t, outside)

		_, _ = unpackTar(context.Background(), bytes.NewReader(data), dest, unpackOptions{
			maxBytes:   1 << 20,
			maxEntries: 1000,
			chown:      os.Geteuid() == 0,
		})

		err := filepath.WalkDir(parent, func(p string, d fs.DirEntry, err error) error {
			rel, _ := filepath.Rel(parent, p)
			if err != nil {
				if os.Geteuid() != 0 && strings.HasPrefix(rel, "root") {
					return nil // a 0000 directory we cannot read as non-root
				}
				return err
			}
			switch {
			case rel == ".", rel == "outside", rel == "outside/sentinel":
			case rel == "root", strings.HasPrefix(rel, "root/"):
				st := lstat(t, p)
				switch st.Mode & unix.S_IFMT {
				case unix.S_IFCHR:
					if st.Rdev != 0 {
						t.Errorf("device node %s (rdev %d) created", rel, st.Rdev)
					}
				case unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
					t.Errorf("special file %s (mode %o) created", rel, st.Mode)
				}
			default:
				t.Errorf("%s created outside the destination", rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if after := fileID(t, sentinel); after != before {
			t.Errorf("sentinel outside the destination changed: %s -> %s", before, after)
		}
		if st := lstat(t, outside); st.Mode != outsideBefore.Mode || st.Uid != outsideBefore.Uid {
			t.Errorf("outside dir changed: mode %o owner %d", st.Mode, st.Uid)
		}
		if x, err := getxattr(outside, "trusted.overlay.opaque"); err == nil {
			t.Errorf("outside dir got opaque xattr %q", x)
		}
	})
}
