package sandbox

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/storage"
)

// A snapshot archive moves a snapshot between hosts. It is a tar of:
//
//	den-snapshot.json   the api.Snapshot record
//	manifest.json       its checksum manifest
//	image.tar           the OCI archive of its image (absent for the host image)
//	upper/NAME.tar      each writable layer, as a deterministic layer tar
//
// Loading verifies every layer against the manifest before the snapshot
// is recorded, so a damaged or edited archive is refused whole.

const snapshotArchiveVersion = 1

type archiveMeta struct {
	Version  int          `json:"version"`
	Snapshot api.Snapshot `json:"snapshot"`
}

// SaveSnapshot writes a snapshot archive to w.
func (m *Manager) SaveSnapshot(ctx context.Context, idOrName string, w io.Writer) error {
	s, err := m.snaps.get(ctx, idOrName)
	if err != nil {
		return err
	}
	img, err := m.Image(ctx, s.Image)
	if err != nil {
		return api.Errorf(api.KindConflict, "the snapshot's image %q is gone", s.Image)
	}
	if img.Name != HostImage && img.Base == HostImage {
		return api.Errorf(api.KindUnsupported, "image %q is built on this host's own files and cannot leave it; snapshots of the host image itself can", img.Name)
	}
	if err := m.snaps.verified(ctx, s); err != nil {
		return err
	}
	man, err := os.ReadFile(m.snaps.manifestPath(s.ID))
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(m.cfg.DataDir, "save-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	tw := tar.NewWriter(w)
	meta, _ := json.Marshal(archiveMeta{Version: snapshotArchiveVersion, Snapshot: *s})
	if err := tarBytes(tw, "den-snapshot.json", meta); err != nil {
		return err
	}
	if err := tarBytes(tw, "manifest.json", man); err != nil {
		return err
	}
	if img.Name != HostImage {
		err := tarSpooled(tw, filepath.Join(tmp, "image.tar"), "image.tar", func(f io.Writer) error {
			return m.SaveImages(ctx, []string{img.Name}, f)
		})
		if err != nil {
			return fmt.Errorf("save the image: %w", err)
		}
	}
	ents, err := os.ReadDir(filepath.Join(m.snaps.dir(s.ID), "upper"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		dir := filepath.Join(m.snaps.dir(s.ID), "upper", e.Name())
		err := tarSpooled(tw, filepath.Join(tmp, "layer.tar"), "upper/"+e.Name()+".tar", func(f io.Writer) error {
			return image.WriteTree(ctx, f, dir)
		})
		if err != nil {
			return fmt.Errorf("save layer %s: %w", e.Name(), err)
		}
	}
	return tw.Close()
}

func tarBytes(tw *tar.Writer, name string, b []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := tw.Write(b)
	return err
}

// tarSpooled writes what fill produces to a temporary file (a tar entry
// needs its size first), then copies it into the archive as name.
func tarSpooled(tw *tar.Writer, path, name string, fill func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	defer f.Close()
	if err := fill(f); err != nil {
		return err
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// maxLoadLayerBytes bounds the file contents of one loaded layer.
const maxLoadLayerBytes = 1 << 40

// LoadSnapshot reads a snapshot archive and records the snapshot (with a
// new id; its name if that is free).
func (m *Manager) LoadSnapshot(ctx context.Context, r io.Reader) (*api.Snapshot, error) {
	bad := func(format string, args ...any) error {
		return api.Errorf(api.KindInvalid, "snapshot archive: "+format, args...)
	}
	tr := tar.NewReader(r)
	next := func(want string) (*tar.Header, error) {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, io.EOF
		}
		if err != nil {
			return nil, bad("%v", err)
		}
		if want != "" && h.Name != want {
			return nil, bad("entry %q where %s belongs", h.Name, want)
		}
		if h.Typeflag != tar.TypeReg {
			return nil, bad("entry %q is not a regular file", h.Name)
		}
		return h, nil
	}
	readJSON := func(name string, v any) error {
		h, err := next(name)
		if err != nil {
			if err == io.EOF {
				return bad("no %s", name)
			}
			return err
		}
		if h.Size > 256<<20 {
			return bad("%s is too large", name)
		}
		dec := json.NewDecoder(io.LimitReader(tr, h.Size))
		if err := dec.Decode(v); err != nil {
			return bad("%s: %v", name, err)
		}
		return nil
	}
	var meta archiveMeta
	if err := readJSON("den-snapshot.json", &meta); err != nil {
		return nil, err
	}
	if meta.Version != snapshotArchiveVersion {
		return nil, bad("version %d (this den reads %d)", meta.Version, snapshotArchiveVersion)
	}
	snap := meta.Snapshot
	if snap.Image == "" || (snap.Name != "" && !validName(snap.Name)) {
		return nil, bad("bad image or name in den-snapshot.json")
	}
	if err := validateLimits(snap.Limits); err != nil {
		return nil, bad("%v", err)
	}
	if err := validateEnv("env", snap.Env); err != nil {
		return nil, bad("%v", err)
	}
	snap.Owner = ScopeFrom(ctx).owner() // the loader's, whoever saved it
	if _, err := m.policyFor(ctx, snap.Owner, snap.Network); err != nil {
		return nil, bad("network policy: %v", err)
	}
	var want storage.Manifest
	if err := readJSON("manifest.json", &want); err != nil {
		return nil, err
	}
	admitted, err := m.admitN(ctx, boundSnapshots, 1)
	if err != nil {
		return nil, err
	}
	defer admitted()
	newID := newID()
	if err := os.MkdirAll(m.snaps.root(), 0o700); err != nil {
		return nil, err
	}
	work := filepath.Join(m.snaps.root(), newID+".load")
	if err := m.newTree(work); err != nil {
		return nil, err
	}
	defer m.deleteTree(work)
	// A token loads no more than one of its sandboxes may hold.
	if sc := ScopeFrom(ctx); sc != nil && sc.Caps.Disk > 0 {
		if err := m.setQuota(work, sc.Caps.Disk); err != nil {
			return nil, err
		}
	}
	upper := filepath.Join(work, "upper")
	if err := os.Mkdir(upper, 0o755); err != nil {
		return nil, err
	}
	sawImage := false
	for {
		h, err := next("")
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		switch {
		case h.Name == "image.tar" && !sawImage && snap.Image != HostImage:
			sawImage = true
			if err := m.loadImage(ctx, snap.Image, tr); err != nil {
				return nil, err
			}
		case strings.HasPrefix(h.Name, "upper/") && strings.HasSuffix(h.Name, ".tar"):
			name := strings.TrimSuffix(strings.TrimPrefix(h.Name, "upper/"), ".tar")
			if !validName(name) {
				return nil, bad("bad layer name %q", name)
			}
			dir := filepath.Join(upper, name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				return nil, bad("layer %s twice", name)
			}
			if err := m.imgs.layers.UnpackTree(ctx, tr, dir, maxLoadLayerBytes); err != nil {
				return nil, bad("layer %s: %v", name, err)
			}
		default:
			return nil, bad("unexpected entry %q", h.Name)
		}
	}
	if snap.Image != HostImage && !sawImage {
		if _, err := m.Image(ctx, snap.Image); err != nil {
			return nil, bad("no image.tar, and this host has no image %q", snap.Image)
		}
	}
	got, err := storage.BuildManifest(ctx, upper)
	if err != nil {
		return nil, err
	}
	if diff := manifestDiff(&want, got); diff != "" {
		return nil, api.Errorf(api.KindInvalid, "snapshot archive failed verification against its manifest: %s", diff)
	}
	if snap.Name != "" {
		if _, err := m.db.GetObject(ctx, kindSnapshot, snap.Name); err == nil {
			snap.Name = "" // taken here; the loaded one goes by its id
		}
	}
	snap.ID, snap.CreatedAt, snap.Digest, snap.Files = newID, time.Now().UTC(), "", 0
	// An archive carries files only, never saved memory.
	snap.Memory, snap.MemorySize = false, 0
	if err := m.copyTree(work, m.snaps.dir(newID), true); err != nil {
		return nil, err
	}
	snap.Size = api.Size(m.diskUsed(m.snaps.dir(newID)))
	if err := m.snaps.put(ctx, &snap); err != nil {
		m.deleteTree(m.snaps.dir(newID))
		return nil, err
	}
	m.event(snap.Sandbox, "snapshot.load", map[string]any{"snapshot": snap.ID})
	m.sealAsync(snap.ID)
	return &snap, nil
}

// loadImage imports the snapshot's image unless this host has the same one.
func (m *Manager) loadImage(ctx context.Context, name string, r io.Reader) error {
	spool, err := os.CreateTemp(m.cfg.DataDir, "load-image-")
	if err != nil {
		return err
	}
	defer os.Remove(spool.Name())
	defer spool.Close()
	if _, err := io.Copy(spool, r); err != nil {
		return err
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if have, err := m.Image(ctx, name); err == nil {
		// Same name here: fine if it is the same image, else refuse.
		tmpName := "den-snapshot-load-" + newID()[:12]
		imgs, err := m.ImportImage(ctx, tmpName, spool, nil)
		if err != nil {
			return api.Errorf(api.KindInvalid, "snapshot archive: image: %v", err)
		}
		same := len(imgs) == 1 && imgs[0].ID == have.ID
		for _, i := range imgs {
			m.RemoveImage(context.WithoutCancel(ctx), i.Name)
		}
		if !same {
			return api.Errorf(api.KindConflict, "this host's image %q differs from the snapshot's: remove or rename it (den image rm), then load again", name)
		}
		return nil
	}
	imgs, err := m.ImportImage(ctx, name, spool, nil)
	if err != nil {
		return api.Errorf(api.KindInvalid, "snapshot archive: image: %v", err)
	}
	if len(imgs) != 1 || imgs[0].Name != name {
		return api.Errorf(api.KindInvalid, "snapshot archive: image.tar holds %d images, want %q", len(imgs), name)
	}
	return nil
}

// manifestDiff compares the manifest of a loaded tree with the one it came
// with, on what a layer tar carries (xattrs other than user.* and
// security.capability, and overlayfs's bookkeeping, do not travel).
func manifestDiff(want, got *storage.Manifest) string {
	norm := func(m *storage.Manifest) []storage.Entry {
		out := make([]storage.Entry, 0, len(m.Entries))
		for _, e := range m.Entries {
			switch {
			case e.Type == "fifo", e.Type == "socket", e.Type == "block", e.Type == "char" && e.Rdev != 0:
				continue // a layer tar skips them
			case e.Type == "char": // a whiteout: only its name matters
				e.Mode, e.UID, e.GID = 0, 0, 0
			case e.Type == "dir" && !strings.Contains(e.Path, "/"):
				e.Mode, e.UID, e.GID = 0, 0, 0 // the layer roots: no tar entry
			}
			x := map[string]string{}
			for k, v := range e.Xattrs {
				if (strings.HasPrefix(k, "user.") && !strings.HasPrefix(k, "user.overlay.")) || k == "security.capability" || k == "trusted.overlay.opaque" {
					x[k] = v
				}
			}
			e.Xattrs = nil
			if len(x) > 0 {
				e.Xattrs = x
			}
			out = append(out, e)
		}
		return out
	}
	a, b := norm(want), norm(got)
	for i := 0; i < len(a) && i < len(b); i++ {
		if !reflect.DeepEqual(a[i], b[i]) {
			return fmt.Sprintf("%s: want %+v, got %+v", a[i].Path, a[i], b[i])
		}
	}
	switch {
	case len(a) > len(b):
		return fmt.Sprintf("%s is missing", a[len(b)].Path)
	case len(b) > len(a):
		return fmt.Sprintf("%s is extra", b[len(a)].Path)
	}
	return ""
}
