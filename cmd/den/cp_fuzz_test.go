package main

import (
	"bytes"
	"io"
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
		extract(bytes.NewReader(data), dst, contents, io.Discard)
		j.Check(t)
	})
}
