package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"
)

// nodeInfo is what compareTrees compares of one tree entry.
type nodeInfo struct {
	Mode     uint32 // full st_mode
	UID, GID uint32
	Mtime    int64 // ns; 0 for whiteouts
	Rdev     uint64
	Size     int64
	Content  string // sha256 of a regular file
	Link     string // symlink target
	Xattrs   string // kept xattrs, sorted, "k=v;"
	Opaque   bool
}

// layerXattr: the xattrs a layer keeps, as compared by the tests.
func layerXattr(name string) bool {
	return allowedXattr(name, true)
}

// treeInfo describes every entry of the tree root (not root itself) except
// those in skip, and returns its hard link groups.
func treeInfo(t *testing.T, root string, skip map[string]bool) (map[string]nodeInfo, [][]string) {
	t.Helper()
	out := map[string]nodeInfo{}
	inodes := map[uint64][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		if skip[rel] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		st := lstat(t, p)
		n := nodeInfo{Mode: st.Mode, UID: st.Uid, GID: st.Gid, Mtime: st.Mtim.Nano(), Rdev: st.Rdev}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			n.Size = int64(len(b))
			n.Content = fmt.Sprintf("%x", sha256.Sum256(b))
			if st.Nlink > 1 {
				inodes[st.Ino] = append(inodes[st.Ino], rel)
			}
		case unix.S_IFLNK:
			n.Link, err = os.Readlink(p)
			if err != nil {
				return err
			}
		case unix.S_IFCHR:
			n.Mtime = 0 // whiteouts carry no mtime
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			names := listXattrs(t, p)
			var kept []string
			for _, x := range names {
				v, _ := getxattr(p, x)
				if x == "trusted.overlay.opaque" {
					n.Opaque = v == "y"
				} else if layerXattr(x) {
					kept = append(kept, x+"="+v+";")
				}
			}
			n.Xattrs = strings.Join(kept, "")
		}
		out[rel] = n
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var groups [][]string
	for _, g := range inodes {
		if len(g) > 1 {
			sort.Strings(g)
			groups = append(groups, g)
		}
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i][0] < groups[j][0] })
	return out, groups
}

func listXattrs(t *testing.T, p string) []string {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		return nil
	}
	var out []string
	for _, x := range strings.Split(string(buf[:n]), "\x00") {
		if x != "" {
			out = append(out, x)
		}
	}
	sort.Strings(out)
	return out
}

// compareTrees checks that the trees a and b hold the same entries with the
// same types, modes, owners, mtimes, contents, symlink targets, kept
// xattrs, opaque markers, whiteouts and hard link groups. Entries of a in
// skipA are left out.
func compareTrees(t *testing.T, a, b string, skipA map[string]bool) {
	t.Helper()
	ia, ga := treeInfo(t, a, skipA)
	ib, gb := treeInfo(t, b, nil)
	for p, x := range ia {
		y, ok := ib[p]
		if !ok {
			t.Errorf("%s: missing in %s", p, b)
			continue
		}
		if x != y {
			t.Errorf("%s differs:\n  %+v\n  %+v", p, x, y)
		}
	}
	for p := range ib {
		if _, ok := ia[p]; !ok {
			t.Errorf("%s: unexpected in %s", p, b)
		}
	}
	if !reflect.DeepEqual(ga, gb) {
		t.Errorf("hard links differ: %v vs %v", ga, gb)
	}
	if len(ia) == 0 {
		t.Error("compared empty trees")
	}
}

// readArchive returns the regular files of a tar.
func readArchive(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			c, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if _, dup := out[h.Name]; dup {
				t.Errorf("archive has %s twice", h.Name)
			}
			out[h.Name] = c
		}
	}
}

// writeArchive writes the given files as a tar to a new file.
func writeArchive(t *testing.T, files map[string][]byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "archive.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	var names []string
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[n]))})
		tw.Write(files[n])
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return p
}

func saveToFile(t *testing.T, s *Store, imgs ...SaveImage) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	if err := s.Save(context.Background(), &buf, imgs); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "saved.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p, buf.Bytes()
}

func TestSaveRoundTrip(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	s1 := newStore(t)
	img := mkImage(t, testConfig, mkLayer(t, baseLayer(t), gzipLayer), mkLayer(t, topLayer(t), zstdLayer))
	dir := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, dir, img, "")
	first, err := s1.Import(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	orig := first[0].Image
	const ref = "example.com/den/rt:v1"
	arc, raw := saveToFile(t, s1, SaveImage{Name: ref, Image: orig})

	s2 := newStore(t)
	got, err := s2.Import(ctx, arc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != ref {
		t.Fatalf("imported %+v", got)
	}
	im := got[0].Image
	if !reflect.DeepEqual(im.Config, wantConfig()) {
		t.Errorf("config %+v\nwant %+v", im.Config, wantConfig())
	}
	if im.Platform != "linux/"+runtime.GOARCH {
		t.Errorf("platform %q", im.Platform)
	}
	if len(im.Layers) != 2 || im.Size != orig.Size {
		t.Fatalf("layers %v size %d, want 2 layers of %d bytes", im.Layers, im.Size, orig.Size)
	}
	for i := range im.Layers {
		compareTrees(t, s1.LayerPath(orig.Layers[i]), s2.LayerPath(im.Layers[i]), nil)
	}
	checkBaseLayer(t, s2.LayerPath(im.Layers[0]))
	checkTopLayer(t, s2.LayerPath(im.Layers[1]))
	checkOverlay(t, s2, im.Layers)

	// The re-tarred layers are a fixed point: saving the imported image
	// gives the same archive, byte for byte.
	_, raw2 := saveToFile(t, s2, SaveImage{Name: ref, Image: im})
	if !bytes.Equal(raw, raw2) {
		t.Error("saving the re-imported image gives a different archive")
	}

	// Importing the archive again is a no-op.
	ino := lstat(t, s2.LayerPath(im.Layers[0])).Ino
	calls := 0
	again, err := s2.Import(ctx, arc, func(int64, int64, string) { calls++ })
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, got) || calls != 0 || lstat(t, s2.LayerPath(im.Layers[0])).Ino != ino {
		t.Errorf("re-import: %+v (%d progress calls)", again, calls)
	}
	assertTmpEmpty(t, s1)
	assertTmpEmpty(t, s2)

	// The archive's structure.
	files := readArchive(t, raw)
	var index v1.IndexManifest
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations[annotationRefName] != ref ||
		index.Manifests[0].Annotations[annotationContainerdName] != ref ||
		index.Manifests[0].Platform == nil || index.Manifests[0].Platform.Architecture != runtime.GOARCH {
		t.Errorf("index.json: %s", files["index.json"])
	}
	var docker []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &docker); err != nil {
		t.Fatal(err)
	}
	if len(docker) != 1 || !reflect.DeepEqual(docker[0].RepoTags, []string{ref}) || len(docker[0].Layers) != 2 {
		t.Errorf("manifest.json: %s", files["manifest.json"])
	}
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout: %s", files["oci-layout"])
	}
	// Layer tars: sorted, numeric owners, whiteouts and opaque markers.
	var top []string
	zr, err := gzip.NewReader(bytes.NewReader(files[docker[0].Layers[1]]))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: user/group names %q/%q", h.Name, h.Uname, h.Gname)
		}
		top = append(top, fmt.Sprintf("%s %c %o %d:%d", h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid))
	}
	wantTop := []string{
		"app/ 5 755 1000:1000",
		"app/main 0 2755 1000:1000",
		"etc/ 5 755 0:0",
		"etc/.wh.gone 0 600 0:0",
		"etc/hosts 0 644 0:0",
		"opaque/ 5 755 0:0",
		"opaque/.wh..wh..opq 0 600 0:0",
		"opaque/new 0 644 0:0",
	}
	if !reflect.DeepEqual(top, wantTop) {
		t.Errorf("top layer tar:\n%s\nwant\n%s", strings.Join(top, "\n"), strings.Join(wantTop, "\n"))
	}

	// ggcr validates both views of the archive: the OCI layout...
	ldir := t.TempDir()
	for n, b := range files {
		p := filepath.Join(ldir, filepath.FromSlash(n))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ii, err := layout.ImageIndexFromPath(ldir)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(ii); err != nil {
		t.Errorf("OCI layout: %v", err)
	}
	// ... and the docker tarball.
	tag, _ := name.NewTag(ref)
	dimg, err := tarball.ImageFromPath(arc, &tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(dimg); err != nil {
		t.Errorf("docker tarball: %v", err)
	}

	// Import reads the OCI side too (without manifest.json), with the name
	// from the annotation.
	delete(files, "manifest.json")
	s3 := newStore(t)
	oci, err := s3.Import(ctx, writeArchive(t, files), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(oci) != 1 || oci[0].Name != ref || !reflect.DeepEqual(oci[0].Image.Layers, im.Layers) ||
		!reflect.DeepEqual(oci[0].Image.Config, im.Config) {
		t.Errorf("OCI import: %+v", oci)
	}
}

func TestSaveSeveralImages(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	s := newStore(t)
	base := mkLayer(t, baseLayer(t), gzipLayer)
	a := mkImage(t, testConfig, base, mkLayer(t, topLayer(t), gzipLayer))
	b := mkImage(t, v1.Config{Cmd: []string{"sh"}}, base, mkLayer(t, mkTar(t, ent{name: "b", body: "b"}), gzipLayer))
	p := filepath.Join(t.TempDir(), "in.tar")
	writeDockerSave(t, p, map[string]v1.Image{"a:1": a, "b:2": b})
	in, err := s.Import(ctx, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Image{}
	for _, ni := range in {
		byName[ni.Name] = ni.Image
	}
	digest := "example.com/x@sha256:" + strings.Repeat("ab", 32)
	arc, raw := saveToFile(t, s,
		SaveImage{Name: "alpine", Image: byName["a:1"]},
		SaveImage{Name: digest, Image: byName["b:2"]},
		SaveImage{Image: byName["a:1"]})
	files := readArchive(t, raw) // also checks that no blob is written twice
	var docker []struct{ RepoTags []string }
	json.Unmarshal(files["manifest.json"], &docker)
	if len(docker) != 3 || !reflect.DeepEqual(docker[0].RepoTags, []string{"alpine:latest"}) ||
		len(docker[1].RepoTags) != 0 || len(docker[2].RepoTags) != 0 {
		t.Errorf("manifest.json: %s", files["manifest.json"])
	}
	var index v1.IndexManifest
	json.Unmarshal(files["index.json"], &index)
	if len(index.Manifests) != 3 ||
		index.Manifests[0].Annotations[annotationContainerdName] != "docker.io/library/alpine:latest" ||
		index.Manifests[0].Annotations[annotationRefName] != "alpine" ||
		index.Manifests[1].Annotations[annotationRefName] != digest ||
		index.Manifests[2].Annotations != nil {
		t.Errorf("index.json: %s", files["index.json"])
	}
	s2 := newStore(t)
	got, err := s2.Import(ctx, arc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Name != "alpine:latest" || got[1].Name != "" || got[2].Name != "" {
		t.Fatalf("imported %+v", got)
	}
	if got[0].Image.Layers[0] != got[1].Image.Layers[0] || !reflect.DeepEqual(got[1].Image.Config.Cmd, []string{"sh"}) {
		t.Errorf("imported %+v", got)
	}
	if b, err := os.ReadFile(filepath.Join(s2.LayerPath(got[1].Image.Layers[1]), "b")); err != nil || string(b) != "b" {
		t.Errorf("b = %q, %v", b, err)
	}

	// Errors: a missing layer, no images.
	err = s.Save(ctx, io.Discard, []SaveImage{{Name: "x:1", Image: Image{Layers: []string{"sha256:" + strings.Repeat("0", 64)}}}})
	mustErrContain(t, err, "save: image x:1: layer sha256:000", "not in the store")
	mustErrContain(t, s.Save(ctx, io.Discard, nil), "no images")
	// Canceled.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Save(cctx, io.Discard, []SaveImage{{Image: byName["a:1"]}}); err == nil {
		t.Error("canceled save succeeded")
	}
	assertTmpEmpty(t, s)
}

func TestCanonicalRef(t *testing.T) {
	for in, want := range map[string]string{
		"alpine":                    "docker.io/library/alpine:latest",
		"alpine:3.20":               "docker.io/library/alpine:3.20",
		"docker.io/library/alpine":  "docker.io/library/alpine:latest",
		"index.docker.io/me/app:v1": "docker.io/me/app:v1",
		"ghcr.io/org/app:v2":        "ghcr.io/org/app:v2",
		"localhost:5000/app":        "localhost:5000/app:latest",
		"example.com/a/b/c@sha256:" + strings.Repeat("1", 64): "example.com/a/b/c@sha256:" + strings.Repeat("1", 64),
	} {
		r, err := name.ParseReference(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := canonicalRef(r); got != want {
			t.Errorf("canonicalRef(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"alpine":                              "alpine:latest",
		"alpine:3":                            "alpine:3",
		"localhost:5000/app":                  "localhost:5000/app:latest",
		"localhost:5000/app:1":                "localhost:5000/app:1",
		"x@sha256:" + strings.Repeat("1", 64): "",
		"Not Valid":                           "",
	} {
		got, ok := repoTag(in)
		if got != want || ok != (want != "") {
			t.Errorf("repoTag(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}
