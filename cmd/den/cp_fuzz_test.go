package main

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/den-dev/den/internal/fuzztest"
)

// FuzzCpExtract feeds arbitrary tar streams, as a sandbox's archive
// endpoint could send them, to den cp's extraction for each kind of local
// destination (an existing directory, its contents, a new name, a new
// directory) and checks that nothing is created or changed outside it.
func FuzzCpExtract(f *testing.F) {
	for _, s := range fuzztest.EscapeTars(f, "d") {
		for kind := range byte(4) {
			f.Add(s, kind)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, kind byte) {
		j := fuzztest.NewJail(t, "dest", kind%4 < 2)
		dst, contents := j.Dest, false
		switch kind % 4 {
		case 1:
			contents = true
		case 3:
			dst += string(filepath.Separator)
		}
		archive := kind&4 != 0
		extract(bytes.NewReader(data), dst, contents, archive, io.Discard)
		j.Check(t)
		if !archive { // without -a, no copy keeps setuid or setgid
			filepath.WalkDir(j.Dest, func(p string, d fs.DirEntry, err error) error {
				if fi, err := os.Lstat(p); err == nil && fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
					t.Errorf("%s came out %v without --archive", p, fi.Mode())
				}
				return nil
			})
		}
	})
}
