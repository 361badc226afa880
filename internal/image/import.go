package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"
)

const (
	// maxMetaBytes bounds manifests, indexes, configs and manifest.json.
	maxMetaBytes = 16 << 20
	// maxArchiveEntries bounds the entries of an image archive (not of a
	// layer: those are bounded by Store.MaxEntries).
	maxArchiveEntries = 1_000_000
	// maxIndexDepth bounds nested image indexes.
	maxIndexDepth = 4

	annotationRefName        = "org.opencontainers.image.ref.name"
	annotationContainerdName = "io.containerd.image.name"
)

// srcImage is an image found in the input, not yet imported.
type srcImage struct {
	names  []string
	id     v1.Hash
	config *v1.ConfigFile
	layers []srcLayer
}

// Import imports every image of path, which is a `docker save` tarball, an
// OCI archive (a tar of an OCI image layout) or an OCI image layout
// directory; archives may also be gzip or zstd compressed. Every layer is
// verified and unpacked into the store unless already present. One
// NamedImage is returned per name of each image (one with Name "" for an
// unnamed image).
func (s *Store) Import(ctx context.Context, path string, progress Progress) ([]NamedImage, error) {
	out, err := s.importPath(ctx, path, progress)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	return out, nil
}

// ImportReader spools r (e.g. an HTTP upload of any format Import accepts)
// to the store's tmp directory and imports it.
func (s *Store) ImportReader(ctx context.Context, r io.Reader, progress Progress) ([]NamedImage, error) {
	f, err := os.CreateTemp(s.tmp, "upload-")
	if err != nil {
		return nil, fmt.Errorf("import: spooling upload: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	limit := s.maxArchiveBytes()
	cr := &countingReader{ctx: ctx, r: r, limit: limit}
	if _, err := io.Copy(f, cr); err != nil {
		if cr.exceeded {
			return nil, fmt.Errorf("import: upload is more than %d bytes", limit)
		}
		return nil, fmt.Errorf("import: spooling upload: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("import: spooling upload: %w", err)
	}
	out, err := s.importPath(ctx, f.Name(), progress)
	if err != nil {
		return nil, fmt.Errorf("import upload: %w", err)
	}
	return out, nil
}

func (s *Store) importPath(ctx context.Context, p string, progress Progress) ([]NamedImage, error) {
	imgs, cleanup, err := s.readSource(ctx, p)
	if cleanup != nil {
		defer cleanup()
	}
	if err != nil {
		return nil, err
	}
	return s.importImages(ctx, imgs, &progressState{fn: progress}, 1)
}

// importImages makes sure every layer of imgs is in the store, unpacking up
// to parallel layers at a time, and describes the images. On an error,
// the layers that were complete stay in the store.
func (s *Store) importImages(ctx context.Context, imgs []srcImage, prog *progressState, parallel int) ([]NamedImage, error) {
	if len(imgs) == 0 {
		return nil, errors.New("no images found")
	}
	var todo []srcLayer
	planned := map[v1.Hash]bool{}
	for _, im := range imgs {
		for _, l := range im.layers {
			if planned[l.diffID] || s.HasLayer(l.diffID.String()) {
				continue
			}
			planned[l.diffID] = true
			todo = append(todo, l)
			if l.size > 0 {
				prog.total += l.size
			}
		}
	}
	sizes := map[v1.Hash]int64{}
	if parallel <= 1 {
		for _, l := range todo {
			n, err := s.ensureLayer(ctx, l, prog)
			if err != nil {
				return nil, err
			}
			sizes[l.diffID] = n
		}
	} else {
		var mu sync.Mutex
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(parallel)
		for _, l := range todo {
			g.Go(func() error {
				n, err := s.ensureLayer(gctx, l, prog)
				if err != nil {
					return err
				}
				mu.Lock()
				sizes[l.diffID] = n
				mu.Unlock()
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return nil, err
		}
	}
	var out []NamedImage
	for _, im := range imgs {
		img := Image{ID: im.id.String(), Config: convertConfig(im.config.Config), Platform: configPlatform(im.config)}
		counted := map[v1.Hash]bool{}
		for _, l := range im.layers {
			img.Layers = append(img.Layers, l.diffID.String())
			if counted[l.diffID] {
				continue
			}
			counted[l.diffID] = true
			n, ok := sizes[l.diffID]
			if !ok {
				var err error
				if n, err = s.layerSize(l.diffID.Hex); err != nil {
					return nil, fmt.Errorf("layer %s: %w", l.diffID, err)
				}
			}
			img.Size += n
		}
		if len(im.names) == 0 {
			out = append(out, NamedImage{Image: img})
		}
		for _, n := range im.names {
			out = append(out, NamedImage{Name: n, Image: img})
		}
	}
	return out, nil
}

// configPlatform returns "os/architecture[/variant]" of an image config, or
// "" if the config does not say.
func configPlatform(cf *v1.ConfigFile) string {
	if cf.OS == "" || cf.Architecture == "" {
		return ""
	}
	p := cf.OS + "/" + cf.Architecture
	if cf.Variant != "" {
		p += "/" + cf.Variant
	}
	return p
}

func convertConfig(c v1.Config) Config {
	out := Config{
		Env:        append([]string(nil), c.Env...),
		WorkingDir: c.WorkingDir,
		User:       c.User,
		Cmd:        append([]string(nil), c.Cmd...),
		Entrypoint: append([]string(nil), c.Entrypoint...),
	}
	for p := range c.ExposedPorts {
		out.ExposedPorts = append(out.ExposedPorts, p)
	}
	sort.Strings(out.ExposedPorts)
	if len(c.Labels) > 0 {
		out.Labels = make(map[string]string, len(c.Labels))
		for k, v := range c.Labels {
			out.Labels[k] = v
		}
	}
	return out
}

// readSource finds the images of path. cleanup, if not nil, must be called
// once the images' layers have been read.
func (s *Store) readSource(ctx context.Context, p string) (imgs []srcImage, cleanup func(), err error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, nil, err
	}
	if fi.IsDir() {
		imgs, err := s.readLayout(p, nil)
		return imgs, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, errors.New("not a regular file or directory")
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, nil, err
	}
	var cleanups []func()
	cleanup = func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	cleanups = append(cleanups, func() { f.Close() })

	// A compressed archive (docker save | gzip) is decompressed to a spool
	// file first: reading the images needs random access.
	var head [6]byte
	n, _ := io.ReadFull(f, head[:])
	if bytes.HasPrefix(head[:n], magicGzip) || bytes.HasPrefix(head[:n], magicZstd) {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, cleanup, err
		}
		dr, err := decompress(f)
		if err != nil {
			return nil, cleanup, err
		}
		spool, err := os.CreateTemp(s.tmp, "archive-")
		if err != nil {
			dr.Close()
			return nil, cleanup, err
		}
		cleanups = append(cleanups, func() { spool.Close(); os.Remove(spool.Name()) })
		limit := s.maxArchiveBytes()
		cr := &countingReader{ctx: ctx, r: dr, limit: limit}
		_, err = io.Copy(spool, cr)
		dr.Close()
		if cr.exceeded {
			return nil, cleanup, fmt.Errorf("decompressed archive is more than %d bytes", limit)
		}
		if err != nil {
			return nil, cleanup, fmt.Errorf("decompressing archive: %w", err)
		}
		f = spool
	}

	a, err := indexTar(f)
	if err != nil {
		return nil, cleanup, err
	}
	switch {
	case a.entries["manifest.json"] != nil:
		imgs, err = s.readDockerSave(a)
	case a.entries["index.json"] != nil:
		var dir string
		dir, err = s.extractLayoutMeta(a)
		if dir != "" {
			cleanups = append(cleanups, func() { removeAll(dir) })
		}
		if err == nil {
			imgs, err = s.readLayout(dir, a)
		}
	default:
		err = errors.New("not an image archive: no manifest.json (docker save) or index.json (OCI archive) in it")
	}
	return imgs, cleanup, err
}

// tarArchive is an index of a seekable tar file, for random access to its
// regular files.
type tarArchive struct {
	f       *os.File
	entries map[string]*archiveEntry
}

type archiveEntry struct {
	typ       byte
	link      string
	off, size int64
}

// posReader tracks the offset in the underlying file; it is a Seeker so
// that archive/tar skips file contents instead of reading them.
type posReader struct {
	f   *os.File
	pos int64
}

func (r *posReader) Read(p []byte) (int, error) {
	n, err := r.f.Read(p)
	r.pos += int64(n)
	return n, err
}

func (r *posReader) Seek(off int64, whence int) (int64, error) {
	n, err := r.f.Seek(off, whence)
	if err == nil {
		r.pos = n
	}
	return n, err
}

// archiveName normalizes a name inside an image archive; "" means ignore.
func archiveName(name string) string {
	c := path.Clean("/" + name)[1:]
	return c
}

func indexTar(f *os.File) (*tarArchive, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	pr := &posReader{f: f}
	tr := tar.NewReader(pr)
	a := &tarArchive{f: f, entries: map[string]*archiveEntry{}}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading archive: %w", err)
		}
		name := archiveName(hdr.Name)
		if name == "" {
			continue
		}
		e := &archiveEntry{typ: hdr.Typeflag, link: hdr.Linkname, off: pr.pos, size: hdr.Size}
		for k := range hdr.PAXRecords {
			if strings.HasPrefix(k, "GNU.sparse.") {
				e.typ = tar.TypeGNUSparse // data offset is not the file's content
			}
		}
		a.entries[name] = e
		if len(a.entries) > maxArchiveEntries {
			return nil, fmt.Errorf("archive has more than %d entries", maxArchiveEntries)
		}
	}
	return a, nil
}

// lookup resolves name, following links inside the archive (as docker's
// legacy format uses them for shared layers), to a regular file entry and
// its final name.
func (a *tarArchive) lookup(name string) (*archiveEntry, string, error) {
	orig := name
	name = archiveName(name)
	for range 16 {
		e := a.entries[name]
		if e == nil {
			return nil, "", fmt.Errorf("%s: not found in the archive", orig)
		}
		switch e.typ {
		case tar.TypeReg:
			return e, name, nil
		case tar.TypeSymlink:
			name = archiveName(path.Join(path.Dir(name), e.link))
		case tar.TypeLink:
			name = archiveName(e.link)
		default:
			return nil, "", fmt.Errorf("%s: not a regular file in the archive", orig)
		}
	}
	return nil, "", fmt.Errorf("%s: too many links in the archive", orig)
}

type sectionReadCloser struct{ *io.SectionReader }

func (sectionReadCloser) Close() error { return nil }

func (a *tarArchive) openEntry(e *archiveEntry) func(context.Context) (io.ReadCloser, error) {
	return func(context.Context) (io.ReadCloser, error) {
		return sectionReadCloser{io.NewSectionReader(a.f, e.off, e.size)}, nil
	}
}

// readSmall reads a small (metadata) file of the archive.
func (a *tarArchive) readSmall(name string) ([]byte, string, error) {
	e, final, err := a.lookup(name)
	if err != nil {
		return nil, "", err
	}
	if e.size > maxMetaBytes {
		return nil, "", fmt.Errorf("%s: larger than %d bytes", name, maxMetaBytes)
	}
	b := make([]byte, e.size)
	if _, err := a.f.ReadAt(b, e.off); err != nil {
		return nil, "", fmt.Errorf("%s: %w", name, err)
	}
	return b, final, nil
}

var (
	blobNameRE   = lazyRE(`^blobs/sha256/([0-9a-f]{64})$`)
	configNameRE = lazyRE(`^(?:blobs/sha256/|sha256:)?([0-9a-f]{64})(?:\.json)?$`)
)

func sha256Hash(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
}

func checkDiffID(h v1.Hash) error {
	if h.Algorithm != "sha256" || !isHex64(h.Hex) {
		return fmt.Errorf("unsupported diffID %q", h)
	}
	return nil
}

// readDockerSave reads the images of a `docker save` tarball (classic,
// Docker >= 25 and go-containerregistry's flavors).
func (s *Store) readDockerSave(a *tarArchive) ([]srcImage, error) {
	if e := a.entries["manifest.json"]; e.size > maxMetaBytes {
		return nil, fmt.Errorf("manifest.json: larger than %d bytes", maxMetaBytes)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) {
		st, err := a.f.Stat()
		if err != nil {
			return nil, err
		}
		return sectionReadCloser{io.NewSectionReader(a.f, 0, st.Size())}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("manifest.json: %w", err)
	}
	var imgs []srcImage
	for _, d := range m {
		if len(d.Layers) > s.maxImageLayers() {
			return nil, fmt.Errorf("image %s: more than %d layers", d.Config, s.maxImageLayers())
		}
		raw, final, err := a.readSmall(d.Config)
		if err != nil {
			return nil, fmt.Errorf("image config: %w", err)
		}
		id := sha256Hash(raw)
		if mm := configNameRE().FindStringSubmatch(final); mm != nil && mm[1] != id.Hex {
			return nil, fmt.Errorf("image config %s: content digest is %s", d.Config, id)
		}
		cfg, err := v1.ParseConfigFile(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("image %s: config: %w", id, err)
		}
		if len(cfg.RootFS.DiffIDs) != len(d.Layers) {
			return nil, fmt.Errorf("image %s: config has %d diffIDs for %d layers", id, len(cfg.RootFS.DiffIDs), len(d.Layers))
		}
		im := srcImage{names: d.RepoTags, id: id, config: cfg}
		for i, name := range d.Layers {
			diffID := cfg.RootFS.DiffIDs[i]
			if err := checkDiffID(diffID); err != nil {
				return nil, fmt.Errorf("image %s: %w", id, err)
			}
			e, final, err := a.lookup(name)
			if err != nil {
				return nil, fmt.Errorf("image %s: layer %s: %w", id, diffID, err)
			}
			l := srcLayer{diffID: diffID, size: e.size, open: a.openEntry(e)}
			if mm := blobNameRE().FindStringSubmatch(final); mm != nil {
				l.digest = v1.Hash{Algorithm: "sha256", Hex: mm[1]}
			}
			im.layers = append(im.layers, l)
		}
		imgs = append(imgs, im)
	}
	return imgs, nil
}

// extractLayoutMeta copies the OCI layout of an OCI archive, except for
// large blobs (layers, which are read from the archive directly), to a new
// directory under tmp, so that go-containerregistry's layout package can
// read it. Only "oci-layout", "index.json" and "blobs/sha256/<hex>" are
// extracted, as new regular files, so the archive cannot place anything
// elsewhere.
func (s *Store) extractLayoutMeta(a *tarArchive) (string, error) {
	dir, err := os.MkdirTemp(s.tmp, "oci-")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o700); err != nil {
		return dir, err
	}
	for name := range a.entries {
		if name != "oci-layout" && name != "index.json" && !blobNameRE().MatchString(name) {
			continue
		}
		e, _, err := a.lookup(name)
		if err != nil {
			return dir, err
		}
		if e.size > maxMetaBytes {
			continue
		}
		if err := copyEntry(a, e, filepath.Join(dir, filepath.FromSlash(name))); err != nil {
			return dir, fmt.Errorf("extracting %s: %w", name, err)
		}
	}
	return dir, nil
}

func copyEntry(a *tarArchive, e *archiveEntry, dst string) error {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, io.NewSectionReader(a.f, e.off, e.size))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// readLayout reads the images of an OCI layout directory. If a is not nil,
// dir holds the metadata of the OCI archive a and layer blobs are read from
// the archive.
func (s *Store) readLayout(dir string, a *tarArchive) ([]srcImage, error) {
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return nil, fmt.Errorf("not an OCI image layout: %w", err)
	}
	ii, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	im, err := ii.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("index.json: %w", err)
	}
	var imgs []srcImage
	for _, d := range im.Manifests {
		img, desc, err := s.resolveImage(ii, d, 0)
		if err != nil {
			return nil, err
		}
		if img == nil {
			s.logf("image: skipping %s of media type %q", d.Digest, d.MediaType)
			continue
		}
		si, err := s.readLayoutImage(dir, img, desc, a)
		if err != nil {
			return nil, err
		}
		name := d.Annotations[annotationContainerdName]
		if name == "" {
			name = d.Annotations[annotationRefName]
		}
		if name != "" {
			si.names = []string{name}
		}
		imgs = append(imgs, si)
	}
	return imgs, nil
}

// resolveImage returns the image d refers to; for an index, the image for
// this machine's platform. It returns a nil image for descriptors that are
// not images (artifacts etc.).
func (s *Store) resolveImage(ii v1.ImageIndex, d v1.Descriptor, depth int) (v1.Image, v1.Descriptor, error) {
	if d.Size > maxMetaBytes {
		return nil, d, fmt.Errorf("manifest %s: larger than %d bytes", d.Digest, maxMetaBytes)
	}
	switch d.MediaType {
	case types.OCIManifestSchema1, types.DockerManifestSchema2:
		img, err := ii.Image(d.Digest)
		if err != nil {
			return nil, d, fmt.Errorf("manifest %s: %w", d.Digest, err)
		}
		return img, d, nil
	case types.OCIImageIndex, types.DockerManifestList:
		if depth >= maxIndexDepth {
			return nil, d, fmt.Errorf("index %s: nested more than %d deep", d.Digest, maxIndexDepth)
		}
		child, err := ii.ImageIndex(d.Digest)
		if err != nil {
			return nil, d, fmt.Errorf("index %s: %w", d.Digest, err)
		}
		raw, err := child.RawManifest()
		if err != nil {
			return nil, d, fmt.Errorf("index %s: %w", d.Digest, err)
		}
		if got := sha256Hash(raw); got != d.Digest {
			return nil, d, fmt.Errorf("index %s: content digest is %s", d.Digest, got)
		}
		cim, err := child.IndexManifest()
		if err != nil {
			return nil, d, fmt.Errorf("index %s: %w", d.Digest, err)
		}
		pick, ok := choosePlatform(cim.Manifests)
		if !ok {
			return nil, d, fmt.Errorf("index %s: no image for linux/%s", d.Digest, runtime.GOARCH)
		}
		return s.resolveImage(child, pick, depth+1)
	}
	return nil, d, nil
}

// choosePlatform picks the manifest for linux/GOARCH from an index.
func choosePlatform(ms []v1.Descriptor) (v1.Descriptor, bool) {
	var candidates []v1.Descriptor
	for _, m := range ms {
		if m.Annotations["vnd.docker.reference.type"] == "attestation-manifest" {
			continue
		}
		if m.Platform == nil {
			candidates = append(candidates, m)
			continue
		}
		if m.Platform.OS == "linux" && m.Platform.Architecture == runtime.GOARCH {
			return m, true
		}
	}
	if len(candidates) == 1 && len(ms) == 1 {
		return candidates[0], true
	}
	return v1.Descriptor{}, false
}

func (s *Store) readLayoutImage(dir string, img v1.Image, d v1.Descriptor, a *tarArchive) (srcImage, error) {
	raw, err := img.RawManifest()
	if err != nil {
		return srcImage{}, fmt.Errorf("manifest %s: %w", d.Digest, err)
	}
	if got := sha256Hash(raw); got != d.Digest {
		return srcImage{}, fmt.Errorf("manifest %s: content digest is %s", d.Digest, got)
	}
	m, err := img.Manifest()
	if err != nil {
		return srcImage{}, fmt.Errorf("manifest %s: %w", d.Digest, err)
	}
	if len(m.Layers) > s.maxImageLayers() {
		return srcImage{}, fmt.Errorf("image %s: more than %d layers", d.Digest, s.maxImageLayers())
	}
	if m.Config.Size > maxMetaBytes || m.Config.Digest.Algorithm != "sha256" {
		return srcImage{}, fmt.Errorf("image %s: unsupported config %s (%d bytes)", d.Digest, m.Config.Digest, m.Config.Size)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "blobs", "sha256", m.Config.Digest.Hex)); err == nil && fi.Size() > maxMetaBytes {
		return srcImage{}, fmt.Errorf("image %s: config larger than %d bytes", d.Digest, maxMetaBytes)
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		return srcImage{}, fmt.Errorf("image %s: config: %w", d.Digest, err)
	}
	if got := sha256Hash(rawCfg); got != m.Config.Digest {
		return srcImage{}, fmt.Errorf("image %s: config %s: content digest is %s", d.Digest, m.Config.Digest, got)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(rawCfg))
	if err != nil {
		return srcImage{}, fmt.Errorf("image %s: config: %w", d.Digest, err)
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return srcImage{}, fmt.Errorf("image %s: config has %d diffIDs for %d layers", d.Digest, len(cfg.RootFS.DiffIDs), len(m.Layers))
	}
	si := srcImage{id: d.Digest, config: cfg}
	for i, ld := range m.Layers {
		diffID := cfg.RootFS.DiffIDs[i]
		if err := checkDiffID(diffID); err != nil {
			return srcImage{}, fmt.Errorf("image %s: %w", d.Digest, err)
		}
		if ld.Digest.Algorithm != "sha256" || ld.Size < 0 {
			return srcImage{}, fmt.Errorf("image %s: layer %s: unsupported descriptor %s (%d bytes)", d.Digest, diffID, ld.Digest, ld.Size)
		}
		l := srcLayer{diffID: diffID, digest: ld.Digest, size: ld.Size}
		if a != nil {
			e, _, err := a.lookup("blobs/sha256/" + ld.Digest.Hex)
			if err != nil {
				return srcImage{}, fmt.Errorf("image %s: layer %s: %w", d.Digest, diffID, err)
			}
			l.open = a.openEntry(e)
		} else {
			digest := ld.Digest
			l.open = func(context.Context) (io.ReadCloser, error) {
				layer, err := img.LayerByDigest(digest)
				if err != nil {
					return nil, err
				}
				return layer.Compressed()
			}
		}
		si.layers = append(si.layers, l)
	}
	return si, nil
}

// lazyRE compiles a regexp on first use, keeping it out of start-up.
func lazyRE(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
