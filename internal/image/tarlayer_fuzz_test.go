package image

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// FuzzLayerTar checks that the deterministic layer tar writer and the
// unpacker agree, which is what AddLayerFromDir relies on (its diffID is
// the tar of the upper directory, its stored copy the unpacked tar, and
// Save re-tars that copy): for any tree the unpacker makes, writing it,
// unpacking that and writing again gives the same bytes.
func FuzzLayerTar(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Add(mkTar(f,
		ent{name: "./", typ: '5', mode: 0o700},
		ent{name: ".wh..wh..opq"},
		ent{name: "a/b/c", body: "c", pax: map[string]string{"SCHILY.xattr.user.x": "\x00\x01"}},
		ent{name: "a/.wh.gone"},
		ent{name: "a/h", typ: '1', link: "a/b/c"},
		ent{name: "z", typ: '2', link: "a/h"}))
	f.Fuzz(fuzzLayerTarBody)
}

// fuzzLayerTarBody: unpack data, write the tree, unpack that, write again.
func fuzzLayerTarBody(t *testing.T, data []byte) {
	ctx := context.Background()
	parent := t.TempDir()
	t.Cleanup(func() { removeAll(parent) })
	opt := unpackOptions{maxBytes: 1 << 20, maxEntries: 1000, chown: os.Geteuid() == 0}
	a := filepath.Join(parent, "a")
	b := filepath.Join(parent, "b")
	os.Mkdir(a, 0o755)
	os.Mkdir(b, 0o755)
	if _, err := unpackTar(ctx, bytes.NewReader(data), a, opt); err != nil {
		return
	}
	var t1, t2 bytes.Buffer
	if _, err := writeLayerTar(ctx, &t1, a, tarOptions{}); err != nil {
		t.Fatalf("writing the unpacked tree: %v", err)
	}
	if _, err := unpackTar(ctx, bytes.NewReader(t1.Bytes()), b, opt); err != nil {
		t.Fatalf("unpacking the written tar: %v", err)
	}
	if _, err := writeLayerTar(ctx, &t2, b, tarOptions{}); err != nil {
		t.Fatalf("writing the second tree: %v", err)
	}
	if !bytes.Equal(t1.Bytes(), t2.Bytes()) {
		t.Fatalf("the tar of the re-unpacked tree differs (%d vs %d bytes)", t1.Len(), t2.Len())
	}
}
