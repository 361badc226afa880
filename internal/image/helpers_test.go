package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/den-dev/den/internal/fuzztest"
)

var testTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// ent is one tar entry of a test layer.
type ent struct {
	name     string
	typ      byte // default TypeReg
	body     string
	link     string
	mode     int64 // default 0644 (files), 0755 (dirs), 0777 (symlinks)
	uid, gid int
	pax      map[string]string
	major    int64
}

func mkTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	out := make([]fuzztest.Entry, len(ents))
	for i, e := range ents {
		out[i] = fuzztest.Entry{Name: e.name, Type: e.typ, Body: e.body, Link: e.link, Mode: e.mode,
			Uid: e.uid, Gid: e.gid, PAX: e.pax, Major: e.major, ModTime: testTime}
	}
	return fuzztest.Tar(t, out...)
}

type layerKind int

const (
	gzipLayer layerKind = iota
	zstdLayer
	rawLayer
)

func (k layerKind) String() string {
	return [...]string{"gzip", "zstd", "uncompressed"}[k]
}

// mkLayer turns tar bytes into a ggcr layer of the given compression.
func mkLayer(t testing.TB, b []byte, kind layerKind) v1.Layer {
	t.Helper()
	opener := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	var (
		l   v1.Layer
		err error
	)
	switch kind {
	case gzipLayer:
		l, err = tarball.LayerFromOpener(opener, tarball.WithMediaType(types.OCILayer))
	case zstdLayer:
		l, err = tarball.LayerFromOpener(opener, tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	case rawLayer:
		l = static.NewLayer(b, types.OCIUncompressedLayer)
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// mkImage builds an image from layers on top of empty.Image.
func mkImage(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func imgDigest(t testing.TB, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func configDigest(t testing.TB, img v1.Image) string {
	t.Helper()
	d, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func diffIDs(t testing.TB, img v1.Image) []string {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range cf.RootFS.DiffIDs {
		out = append(out, d.String())
	}
	return out
}

// writeDockerSave writes a `docker save` tarball of the tagged images.
func writeDockerSave(t testing.TB, p string, imgs map[string]v1.Image) {
	t.Helper()
	m := map[name.Tag]v1.Image{}
	for tag, img := range imgs {
		tg, err := name.NewTag(tag)
		if err != nil {
			t.Fatal(err)
		}
		m[tg] = img
	}
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(m) == 1 {
		for tg, img := range m {
			err = tarball.Write(tg, img, f)
		}
	} else {
		err = tarball.MultiWrite(m, f)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// writeLayout writes an OCI layout directory holding img (annotated with
// the ref name, if not empty).
func writeLayout(t testing.TB, dir string, img v1.Image, ref string) {
	t.Helper()
	lp, err := layout.FromPath(dir)
	if err != nil {
		lp, err = layout.Write(dir, empty.Index)
	}
	if err != nil {
		t.Fatal(err)
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{annotationRefName: ref}))
	}
	if err := lp.AppendImage(img, opts...); err != nil {
		t.Fatal(err)
	}
}

// tarDir writes an OCI archive: a tar of the layout directory dir.
func tarDir(t testing.TB, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func newStore(t testing.TB) *Store {
	t.Helper()
	s, err := NewStore(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: ownership, whiteout device nodes and trusted.* xattrs")
	}
}

// importLayer imports a one-layer image with the given tar bytes through an
// OCI layout directory.
func importLayer(t testing.TB, s *Store, tarBytes []byte) ([]NamedImage, error) {
	t.Helper()
	img := mkImage(t, v1.Config{}, mkLayer(t, tarBytes, gzipLayer))
	dir := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, dir, img, "")
	return s.Import(context.Background(), dir, nil)
}

// assertStoreEmpty checks that a failed import left nothing in layers/ and
// tmp/.
func assertStoreEmpty(t testing.TB, s *Store) {
	t.Helper()
	for _, d := range []string{s.layers, s.tmp} {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 0 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("%s not empty after a failed import: %s", d, strings.Join(names, ", "))
		}
	}
}

func mustErrContain(t testing.TB, err error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("expected an error containing %q, got none", subs)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
}
