package image

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
)

// SaveImage is an image to Save, under Name ("" for none).
type SaveImage struct {
	Name  string
	Image Image
}

// Save writes images as an OCI archive to w: an uncompressed tar of an OCI
// image layout (oci-layout, index.json, blobs/sha256/...) that also holds a
// docker-compatible manifest.json, so that both `docker load` and OCI tools
// (and Import) read it.
//
// Every layer is re-tarred from its unpacked directory by the
// deterministic layer tar writer (sorted names, numeric owners, mtimes
// kept, whiteouts as .wh.NAME and opaque directories as .wh..wh..opq) and
// gzip-compressed; the same tree always gives the same layer, but usually
// not the tar it was imported from, so the saved config carries the new
// diffIDs (and a layer made by AddLayerFromDir keeps its own). The config
// carries Image.Config and Image.Platform (default linux/GOARCH).
//
// In index.json each image's manifest is annotated with
// org.opencontainers.image.ref.name = Name, and, if Name parses as an image
// reference, io.containerd.image.name = its canonical form. In
// manifest.json, RepoTags holds Name if it is a tag reference (":latest"
// added when it has no tag); a digest reference is left out there.
//
// Layers are compressed into the store's tmp directory one at a time
// before they are written; the output is the same for the same images.
func (s *Store) Save(ctx context.Context, w io.Writer, images []SaveImage) error {
	if err := s.save(ctx, w, images); err != nil {
		return fmt.Errorf("save: %w", err)
	}
	return nil
}

// savedLayer is a layer blob written to the archive.
type savedLayer struct {
	digest, diffID v1.Hash
	size           int64
}

// archiveWriter writes the outer tar of an OCI archive.
type archiveWriter struct {
	tw    *tar.Writer
	blobs map[v1.Hash]bool
}

func (a *archiveWriter) header(name string, typ byte, size int64) error {
	mode := int64(0o644)
	if typ == tar.TypeDir {
		mode = 0o755
	}
	return a.tw.WriteHeader(&tar.Header{
		Typeflag: typ, Name: name, Size: size, Mode: mode,
		ModTime: markerTime, Format: tar.FormatPAX,
	})
}

func (a *archiveWriter) file(name string, b []byte) error {
	if err := a.header(name, tar.TypeReg, int64(len(b))); err != nil {
		return err
	}
	_, err := a.tw.Write(b)
	return err
}

// blob writes b as blobs/sha256/<hex> (once) and returns its descriptor.
func (a *archiveWriter) blob(mt types.MediaType, b []byte) (v1.Descriptor, error) {
	d := v1.Descriptor{MediaType: mt, Size: int64(len(b)), Digest: sha256Hash(b)}
	if a.blobs[d.Digest] {
		return d, nil
	}
	a.blobs[d.Digest] = true
	return d, a.file("blobs/sha256/"+d.Digest.Hex, b)
}

func (s *Store) save(ctx context.Context, w io.Writer, images []SaveImage) error {
	if len(images) == 0 {
		return fmt.Errorf("no images to save")
	}
	for _, im := range images {
		for _, l := range im.Image.Layers {
			if !s.HasLayer(l) {
				return fmt.Errorf("image %s: layer %s is not in the store", imageLabel(im), l)
			}
		}
		if len(im.Image.Layers) > s.maxImageLayers() {
			return fmt.Errorf("image %s: more than %d layers", imageLabel(im), s.maxImageLayers())
		}
	}
	spool, err := os.MkdirTemp(s.tmp, "save-")
	if err != nil {
		return err
	}
	defer removeAll(spool)

	bw := bufio.NewWriterSize(w, 1<<20)
	a := &archiveWriter{tw: tar.NewWriter(bw), blobs: map[v1.Hash]bool{}}
	if err := a.file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := a.header(d, tar.TypeDir, 0); err != nil {
			return err
		}
	}

	layers := map[string]savedLayer{}
	for _, im := range images {
		for _, l := range im.Image.Layers {
			if _, ok := layers[l]; ok {
				continue
			}
			sl, err := s.saveLayer(ctx, a, spool, l)
			if err != nil {
				return fmt.Errorf("image %s: layer %s: %w", imageLabel(im), l, err)
			}
			layers[l] = sl
		}
	}

	index := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{}}
	type dockerEntry struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	var docker []dockerEntry
	for _, im := range images {
		plat, err := savePlatform(im.Image.Platform)
		if err != nil {
			return fmt.Errorf("image %s: %w", imageLabel(im), err)
		}
		cfg := saveConfig{
			Architecture: plat.Architecture, OS: plat.OS, Variant: plat.Variant,
			Config: unconvertConfig(im.Image.Config),
			RootFS: v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{}},
		}
		m := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, Layers: []v1.Descriptor{}}
		de := dockerEntry{Layers: []string{}, RepoTags: []string{}}
		for _, l := range im.Image.Layers {
			sl := layers[l]
			cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, sl.diffID)
			m.Layers = append(m.Layers, v1.Descriptor{MediaType: types.OCILayer, Size: sl.size, Digest: sl.digest})
			de.Layers = append(de.Layers, "blobs/sha256/"+sl.digest.Hex)
		}
		cb, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		if m.Config, err = a.blob(types.OCIConfigJSON, cb); err != nil {
			return err
		}
		de.Config = "blobs/sha256/" + m.Config.Digest.Hex
		mb, err := json.Marshal(m)
		if err != nil {
			return err
		}
		md, err := a.blob(types.OCIManifestSchema1, mb)
		if err != nil {
			return err
		}
		md.Platform = plat
		if im.Name != "" {
			md.Annotations = map[string]string{annotationRefName: im.Name}
			if r, err := name.ParseReference(im.Name); err == nil {
				md.Annotations[annotationContainerdName] = canonicalRef(r)
			}
			if tag, ok := repoTag(im.Name); ok {
				de.RepoTags = append(de.RepoTags, tag)
			}
		}
		index.Manifests = append(index.Manifests, md)
		docker = append(docker, de)
	}
	ib, err := json.Marshal(index)
	if err != nil {
		return err
	}
	if err := a.file("index.json", ib); err != nil {
		return err
	}
	db, err := json.Marshal(docker)
	if err != nil {
		return err
	}
	if err := a.file("manifest.json", db); err != nil {
		return err
	}
	if err := a.tw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

// saveLayer re-tars and compresses the layer diffID into a spool file, and
// copies that into the archive as a blob.
func (s *Store) saveLayer(ctx context.Context, a *archiveWriter, spool, diffID string) (savedLayer, error) {
	f, err := os.CreateTemp(spool, "layer-")
	if err != nil {
		return savedLayer{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	ch, dh := sha256.New(), sha256.New()
	fw := bufio.NewWriterSize(io.MultiWriter(f, ch), 1<<20)
	zw, err := gzip.NewWriterLevel(fw, gzip.DefaultCompression)
	if err != nil {
		return savedLayer{}, err
	}
	if _, err := writeLayerTar(ctx, io.MultiWriter(dh, zw), s.LayerPath(diffID), tarOptions{}); err != nil {
		return savedLayer{}, err
	}
	if err := zw.Close(); err != nil {
		return savedLayer{}, err
	}
	if err := fw.Flush(); err != nil {
		return savedLayer{}, err
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return savedLayer{}, err
	}
	sl := savedLayer{
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(ch.Sum(nil))},
		diffID: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(dh.Sum(nil))},
		size:   size,
	}
	if a.blobs[sl.digest] {
		return sl, nil // another diffID with the same tree
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return savedLayer{}, err
	}
	if err := a.header("blobs/sha256/"+sl.digest.Hex, tar.TypeReg, size); err != nil {
		return savedLayer{}, err
	}
	if _, err := io.Copy(a.tw, ctxReader{ctx, f}); err != nil {
		return savedLayer{}, err
	}
	a.blobs[sl.digest] = true
	return sl, nil
}

// saveConfig is the image config Save writes.
type saveConfig struct {
	Architecture string    `json:"architecture"`
	OS           string    `json:"os"`
	Variant      string    `json:"variant,omitempty"`
	Config       v1.Config `json:"config"`
	RootFS       v1.RootFS `json:"rootfs"`
}

func unconvertConfig(c Config) v1.Config {
	out := v1.Config{
		Env:        c.Env,
		WorkingDir: c.WorkingDir,
		User:       c.User,
		Cmd:        c.Cmd,
		Entrypoint: c.Entrypoint,
		Labels:     c.Labels,
	}
	if len(c.ExposedPorts) > 0 {
		out.ExposedPorts = map[string]struct{}{}
		for _, p := range c.ExposedPorts {
			out.ExposedPorts[p] = struct{}{}
		}
	}
	return out
}

func savePlatform(p string) (*v1.Platform, error) {
	if p == "" {
		p = "linux/" + runtime.GOARCH
	}
	plat, err := v1.ParsePlatform(p)
	if err != nil {
		return nil, fmt.Errorf("platform %q: %w", p, err)
	}
	return plat, nil
}

func imageLabel(im SaveImage) string {
	if im.Name != "" {
		return im.Name
	}
	return im.Image.ID
}

// repoTag returns the name for manifest.json's RepoTags (which docker
// wants as repository:tag) of an image name, if it is a tag reference.
func repoTag(n string) (string, bool) {
	t, err := name.NewTag(n)
	if err != nil {
		return "", false
	}
	if strings.LastIndex(n, ":") <= strings.LastIndex(n, "/") {
		return n + ":" + t.TagStr(), true
	}
	return n, true
}

// canonicalRef spells a reference fully: registry/repository:tag or
// registry/repository@digest, with Docker Hub as docker.io.
func canonicalRef(r name.Reference) string {
	reg := r.Context().RegistryStr()
	if reg == name.DefaultRegistry {
		reg = "docker.io"
	}
	repo := reg + "/" + r.Context().RepositoryStr()
	if d, ok := r.(name.Digest); ok {
		return repo + "@" + d.DigestStr()
	}
	return repo + ":" + r.Identifier()
}
