// Package image is den's layer store and OCI image importer: it reads images
// from `docker save` tarballs, OCI archive tarballs and OCI layout directories
// (through go-containerregistry), verifies every layer against the manifest's
// compressed digest and the config's diffID, and unpacks each layer once into
// dir/layers/<sha256-hex>/ with a hardened tar unpacker (no absolute or ".."
// names, never writes through a symlink, hard links only to regular files of
// the same layer, devices and fifos skipped, whiteouts converted to overlayfs
// form, entry and size limits against tar bombs) so that the sandbox code can
// mount the unpacked layers, shared by every sandbox, as overlayfs lowerdirs.
//
// Images also come from registries (Pull, through go-containerregistry,
// with the same verification), go out as OCI archives (Save, which re-tars
// the unpacked layers with a deterministic tar writer), and layers are made
// of what a sandbox wrote in its overlayfs upper directory
// (AddLayerFromDir, through that tar writer and the same unpacker).
package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Default limits used by NewStore (and whenever a limit field is <= 0).
const (
	DefaultMaxLayerBytes   int64 = 64 << 30 // 64 GiB uncompressed per layer
	DefaultMaxEntries      int64 = 2_000_000
	DefaultMaxImageLayers        = 127 // overlayfs' practical lowerdir limit
	DefaultMaxArchiveBytes int64 = 256 << 30
)

// Store is a directory of unpacked, content-addressed image layers.
//
// Layout of the store directory (all directories at the top are 0700, so the
// layer trees with their setuid binaries are unreachable for unprivileged
// host users):
//
//	dir/layers/<sha256-hex>/  one unpacked layer (an overlayfs lowerdir)
//	dir/meta/<sha256-hex>.json  small sidecar with the layer's unpacked size
//	dir/tmp/                   in-progress unpacks, upload and save spools
//
// A layer is unpacked into dir/tmp and renamed into dir/layers only once it
// is complete and verified, so an interrupted import leaves nothing
// half-made in dir/layers, and importing a layer that is already present is
// skipped.
//
// A Store is safe for concurrent use (concurrent imports of the same layer
// unpack it twice and keep one); use one Store per directory, as NewStore
// clears dir/tmp. The limit fields may be changed after NewStore and before
// use; a value <= 0 means the default.
type Store struct {
	// MaxLayerBytes bounds both the uncompressed tar stream of one layer and
	// the total bytes of file contents it unpacks.
	MaxLayerBytes int64
	// MaxEntries bounds the number of tar entries of one layer.
	MaxEntries int64
	// MaxImageLayers bounds the number of layers of one image.
	MaxImageLayers int
	// MaxArchiveBytes bounds what ImportReader spools to disk and what a
	// compressed archive may decompress to.
	MaxArchiveBytes int64
	// Logf, if set, receives informational messages (skipped device nodes,
	// ignored xattrs, skipped manifests).
	Logf func(format string, args ...any)

	dir      string
	layers   string
	meta     string
	tmp      string
	rootless bool // not running as root: ownership is not applied
}

// NamedImage is an image found in an archive together with its name: a repo
// tag of a `docker save` tarball, or the io.containerd.image.name or
// org.opencontainers.image.ref.name annotation of an OCI index entry. Name is
// "" when the archive does not name the image. For Pull, Name is the
// reference as the caller gave it.
type NamedImage struct {
	Name string
	// Canonical is set by Pull only: the fully qualified reference,
	// "registry/repository:tag" or "registry/repository@sha256:<hex>",
	// with Docker Hub spelled docker.io, e.g. "alpine" gives
	// "docker.io/library/alpine:latest".
	Canonical string
	Image     Image
}

// Image describes an imported image whose layers are all in the store.
type Image struct {
	// ID is the manifest digest for OCI images and the config digest (the
	// Docker image ID) for `docker save` images, "sha256:<hex>".
	ID string
	// Layers are the diffIDs "sha256:<hex>", bottom layer first.
	Layers []string
	Config Config
	// Size is the number of unpacked bytes (file contents) of all layers.
	Size int64
	// Platform is "os/architecture[/variant]" from the image config, e.g.
	// "linux/amd64", or "" if the config does not say.
	Platform string
}

// Config is the part of the image configuration den uses to run a sandbox.
type Config struct {
	Env          []string
	WorkingDir   string
	User         string
	Cmd          []string
	Entrypoint   []string
	ExposedPorts []string // "80/tcp", sorted
	Labels       map[string]string
}

// Progress reports import or pull progress: done and total are bytes of
// (compressed) layer data to read or download, overall; what names the
// layer being unpacked ("layer sha256:<diffID>"). It may be nil, and it is
// never called concurrently.
type Progress func(done, total int64, what string)

// isHex64 reports whether s is 64 lower-case hex digits (a sha256).
// (Not a regexp: a {64} repetition costs start-up time in every den process.)
func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// NewStore opens (creating if needed) the layer store at dir. Leftovers of
// interrupted imports in dir/tmp are removed.
func NewStore(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	s := &Store{
		MaxLayerBytes:   DefaultMaxLayerBytes,
		MaxEntries:      DefaultMaxEntries,
		MaxImageLayers:  DefaultMaxImageLayers,
		MaxArchiveBytes: DefaultMaxArchiveBytes,
		dir:             abs,
		layers:          filepath.Join(abs, "layers"),
		meta:            filepath.Join(abs, "meta"),
		tmp:             filepath.Join(abs, "tmp"),
		rootless:        os.Geteuid() != 0,
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	for _, d := range []string{s.layers, s.meta, s.tmp} {
		if err := privateDir(d); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	// Clear leftovers of interrupted imports and removals.
	ents, err := os.ReadDir(s.tmp)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	for _, e := range ents {
		if err := removeAll(filepath.Join(s.tmp, e.Name())); err != nil {
			return nil, fmt.Errorf("image store: clearing tmp: %w", err)
		}
	}
	return s, nil
}

// privateDir makes sure d is a real directory (not a symlink), mode 0700,
// owned by the current user.
func privateDir(d string) error {
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	fi, err := os.Lstat(d)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", d)
	}
	if os.Geteuid() == 0 {
		if err := os.Lchown(d, 0, 0); err != nil {
			return err
		}
	}
	return os.Chmod(d, 0o700)
}

func (s *Store) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

func (s *Store) maxLayerBytes() int64 {
	if s.MaxLayerBytes > 0 {
		return s.MaxLayerBytes
	}
	return DefaultMaxLayerBytes
}

func (s *Store) maxEntries() int64 {
	if s.MaxEntries > 0 {
		return s.MaxEntries
	}
	return DefaultMaxEntries
}

func (s *Store) maxImageLayers() int {
	if s.MaxImageLayers > 0 {
		return s.MaxImageLayers
	}
	return DefaultMaxImageLayers
}

func (s *Store) maxArchiveBytes() int64 {
	if s.MaxArchiveBytes > 0 {
		return s.MaxArchiveBytes
	}
	return DefaultMaxArchiveBytes
}

// diffIDHex returns the hex part of a "sha256:<hex>" diffID, or "" if the
// string is not a well-formed sha256 digest.
func diffIDHex(diffID string) string {
	h, ok := strings.CutPrefix(diffID, "sha256:")
	if !ok || !isHex64(h) {
		return ""
	}
	return h
}

// LayerPath returns the absolute path of the unpacked layer directory of
// diffID ("sha256:<hex>"), whether or not it exists. It returns "" for a
// malformed diffID.
func (s *Store) LayerPath(diffID string) string {
	h := diffIDHex(diffID)
	if h == "" {
		return ""
	}
	return filepath.Join(s.layers, h)
}

// HasLayer reports whether the layer diffID is unpacked in the store.
func (s *Store) HasLayer(diffID string) bool {
	p := s.LayerPath(diffID)
	if p == "" {
		return false
	}
	fi, err := os.Lstat(p)
	return err == nil && fi.IsDir()
}

// RemoveLayer deletes the layer diffID from the store. Removing a layer that
// is not present is not an error. The caller must make sure no sandbox still
// uses the layer.
func (s *Store) RemoveLayer(diffID string) error {
	h := diffIDHex(diffID)
	if h == "" {
		return fmt.Errorf("remove layer: malformed diffID %q", diffID)
	}
	// Move it out of layers/ first so that it disappears atomically, then
	// delete at leisure.
	trash, err := os.MkdirTemp(s.tmp, "rm-"+h[:12]+"-")
	if err != nil {
		return fmt.Errorf("remove layer %s: %w", diffID, err)
	}
	defer removeAll(trash)
	err = os.Rename(filepath.Join(s.layers, h), filepath.Join(trash, "layer"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove layer %s: %w", diffID, err)
	}
	if err := os.Remove(s.metaPath(h)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove layer %s: %w", diffID, err)
	}
	if err := removeAll(trash); err != nil {
		return fmt.Errorf("remove layer %s: %w", diffID, err)
	}
	return nil
}

// Layers lists the diffIDs of the layers present in the store, sorted.
func (s *Store) Layers() ([]string, error) {
	ents, err := os.ReadDir(s.layers)
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && isHex64(e.Name()) {
			out = append(out, "sha256:"+e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// layerMeta is the sidecar stored in dir/meta/<hex>.json.
type layerMeta struct {
	Size           int64 `json:"size"`
	Entries        int64 `json:"entries"`
	SkippedDevices int64 `json:"skipped_devices,omitempty"`
}

func (s *Store) metaPath(hex string) string {
	return filepath.Join(s.meta, hex+".json")
}

func (s *Store) writeMeta(hex string, m layerMeta) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(s.meta, ".tmp-"+hex[:12]+"-")
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	cerr := f.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(f.Name(), s.metaPath(hex))
	}
	if werr != nil {
		os.Remove(f.Name())
	}
	return werr
}

// layerSize returns the unpacked size of a present layer, from its sidecar
// or, if that is missing, by walking the tree (and then writing the sidecar).
func (s *Store) layerSize(hex string) (int64, error) {
	if b, err := os.ReadFile(s.metaPath(hex)); err == nil {
		var m layerMeta
		if json.Unmarshal(b, &m) == nil {
			return m.Size, nil
		}
	}
	var size int64
	seen := map[uint64]bool{}
	err := filepath.WalkDir(filepath.Join(s.layers, hex), func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
				if seen[st.Ino] {
					return nil // another hard link of a counted file
				}
				seen[st.Ino] = true
			}
			size += fi.Size()
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	_ = s.writeMeta(hex, layerMeta{Size: size})
	return size, nil
}

// removeAll removes a tree that may contain directories without write or
// search permission (which matters only when not running as root).
func removeAll(p string) error {
	err := os.RemoveAll(p)
	if err == nil {
		return nil
	}
	_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, _ error) error {
		if d != nil && d.IsDir() {
			// WalkDir does not follow symlinks and d comes from lstat, so
			// this chmods a directory of our own private tree.
			_ = unix.Fchmodat(unix.AT_FDCWD, q, 0o700, 0)
		}
		return nil
	})
	return os.RemoveAll(p)
}
