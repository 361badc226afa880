package image

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/den-dev/den/internal/fuzztest"
)

// FuzzImportArchive uploads arbitrary archives (docker save and OCI
// archives, plain or gzipped, as POST /v1/images/import takes them) and
// checks that an import writes nothing outside the store, leaves nothing
// in its tmp directory, fails with an error that says it is an import,
// and that every image it reports has its layers in the store under
// names that are digests.
func FuzzImportArchive(f *testing.F) {
	requireRoot(f)
	img := mkImage(f, testConfig, mkLayer(f, baseLayer(f), gzipLayer))
	dir := f.TempDir()
	save := filepath.Join(dir, "save.tar")
	writeDockerSave(f, save, map[string]v1.Image{"fuzz:v1": img})
	writeLayout(f, filepath.Join(dir, "layout"), img, "fuzz:oci")
	oci := filepath.Join(dir, "oci.tar")
	tarDir(f, filepath.Join(dir, "layout"), oci)
	for _, p := range []string{save, oci} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if got, err := newStore(f).ImportReader(context.Background(), bytes.NewReader(b), nil); err != nil || len(got) != 1 {
			f.Fatalf("import the seed %s: %+v, %v", filepath.Base(p), got, err)
		}
		f.Add(b)
	}
	f.Add(mkTar(f, ent{name: "manifest.json", body: `[{"Config":"../../etc/passwd","RepoTags":["x:y"],"Layers":["/etc/shadow","a/../../b"]}]`}))
	f.Add(mkTar(f, ent{name: "oci-layout", body: `{"imageLayoutVersion":"1.0.0"}`}, ent{name: "index.json", body: `{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:../../x","size":2}]}`}))
	for _, s := range fuzztest.EscapeTars(f, "blobs") {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		jail := fuzztest.NewJail(t, "store", false)
		s, err := NewStore(jail.Dest)
		if err != nil {
			t.Fatal(err)
		}
		s.MaxArchiveBytes = 64 << 20
		got, err := s.ImportReader(context.Background(), bytes.NewReader(data), nil)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "import") {
				t.Fatalf("error %q does not say it is an import", err)
			}
		}
		for _, ni := range got {
			for _, l := range ni.Image.Layers {
				if !strings.HasPrefix(l, "sha256:") || len(l) != 71 || !s.HasLayer(l) {
					t.Fatalf("image %s: layer %q is not a digest in the store", ni.Name, l)
				}
			}
		}
		assertTmpEmpty(t, s)
		jail.Check(t)
	})
}
