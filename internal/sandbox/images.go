package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/store"
)

// newImageName checks the name an image is to be stored under (field
// names it in the error): a valid reference (image.CheckName), not the
// built-in host image.
func newImageName(field, name string) error {
	if err := image.CheckName(name); err != nil {
		return api.FieldError(field, "%q is not a usable image name: %v (names look like app, team/app:v2 or registry.example.com/app:1.0)", name, err)
	}
	if name == HostImage {
		return api.FieldError(field, "%q is the built-in host image: pick another name", name)
	}
	return nil
}

// imageStore is the daemon's images: their records in the store, their
// layers in the layer store, and the built-in host image, whose small
// private layer is generated under DataDir/images/host. It has no lock of
// its own (it keeps no state in memory): the store and the layer store
// serialise their own writes, and quotas on images are the manager's
// admission (putImage).
type imageStore struct {
	db      *store.DB
	layers  *image.Store
	dataDir string
	log     *slog.Logger
}

// hostDir is where the host image's generated layer is kept.
func (s *imageStore) hostDir() string { return filepath.Join(s.dataDir, "images", "host") }

func hostImageRecord() *api.Image {
	return &api.Image{Name: HostImage, ID: "builtin:host", CreatedAt: time.Unix(0, 0).UTC(),
		Config: api.ImageConfig{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}}
}

// Image returns one image; "host" is built in.
func (m *Manager) Image(ctx context.Context, name string) (*api.Image, error) {
	return m.imgs.get(ctx, name)
}

// get is one image, its owner hidden from a scope that is not it.
func (s *imageStore) get(ctx context.Context, name string) (*api.Image, error) {
	if name == HostImage {
		return hostImageRecord(), nil
	}
	if err := image.CheckName(name); err != nil {
		return nil, api.FieldError("image", "%q is not an image name: %v", name, err)
	}
	img, err := s.db.GetImage(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.Errorf(api.KindNotFound, "no image %q: see `den image ls`, or import one with `den image import`", name)
	}
	if err != nil {
		return nil, err
	}
	var out api.Image
	if err := json.Unmarshal(img.Doc, &out); err != nil {
		return nil, err
	}
	hideOwner(ctx, &out)
	return &out, nil
}

// hideOwner clears an image's owner for a scoped request that is not its
// owner: images are shared, other tokens' ids are not.
func hideOwner(ctx context.Context, img *api.Image) {
	if sc := ScopeFrom(ctx); !sc.IsAdmin() && img.Owner != sc.owner() {
		img.Owner = ""
	}
}

// Images lists every image, the built-in one first.
func (m *Manager) Images(ctx context.Context) ([]*api.Image, error) { return m.imgs.list(ctx) }

// list is every image but the build cache, the built-in one first.
func (s *imageStore) list(ctx context.Context) ([]*api.Image, error) {
	all, err := s.db.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	out := []*api.Image{hostImageRecord()}
	for _, i := range all {
		var img api.Image
		if json.Unmarshal(i.Doc, &img) == nil && !strings.HasPrefix(img.Name, cachePrefix) {
			hideOwner(ctx, &img)
			out = append(out, &img)
		}
	}
	return out, nil
}

// ImportImage unpacks an OCI archive or docker-save tarball. name names
// the image when the archive has one image; otherwise the archive's own
// names are used.
func (m *Manager) ImportImage(ctx context.Context, name string, r io.Reader, progress image.Progress) ([]*api.Image, error) {
	if name != "" {
		if err := newImageName("name", name); err != nil {
			return nil, err
		}
	}
	if err := m.mayAdd(ctx, boundImages); err != nil {
		return nil, err
	}
	if err := m.room(); err != nil {
		return nil, err
	}
	imgs, err := m.imgs.layers.ImportReader(ctx, r, progress)
	if err != nil {
		return nil, api.Errorf(api.KindInvalid, "import: %v", err)
	}
	if len(imgs) == 0 {
		return nil, api.Errorf(api.KindInvalid, "import: the archive holds no image")
	}
	if name != "" && len(imgs) > 1 {
		return nil, api.FieldError("name", "the archive holds %d images; import without a name to keep theirs", len(imgs))
	}
	var out []*api.Image
	for i, ni := range imgs {
		n := ni.Name
		if name != "" {
			n = name
		}
		if n == "" {
			n = fmt.Sprintf("imported-%s", shortDigest(ni.Image.ID))
			if len(imgs) > 1 {
				n = fmt.Sprintf("%s-%d", n, i)
			}
		}
		if err := newImageName("name", n); err != nil {
			return nil, api.Errorf(api.KindInvalid, "import: the archive names an image %q, which is not usable here (%v); pass a name", n, err)
		}
		rec := fromStore(n, ni.Image)
		if err := m.putImage(ctx, rec); err != nil {
			return nil, err
		}
		m.event("", "image.import", map[string]any{"name": n, "id": rec.ID})
		out = append(out, rec)
	}
	return out, nil
}

func shortDigest(d string) string {
	if len(d) > 7 && d[:7] == "sha256:" {
		d = d[7:]
	}
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}

// RemoveImage deletes an image that no sandbox uses, and the layers no
// other image uses.
func (m *Manager) RemoveImage(ctx context.Context, name string) error {
	if name == HostImage {
		return api.Errorf(api.KindConflict, "the host image is built in and cannot be removed")
	}
	if _, err := m.Image(ctx, name); err != nil {
		return err
	}
	if err := m.imgs.remove(ctx, name); err != nil {
		return err
	}
	m.event("", "image.remove", map[string]any{"name": name})
	return nil
}

// remove deletes the record of an image no sandbox uses, then the layers
// no image uses any more.
func (s *imageStore) remove(ctx context.Context, name string) error {
	users, err := s.db.ImageInUse(ctx, name)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return api.Errorf(api.KindConflict, "image %q is used by %d sandbox(es), first %s: remove them first", name, len(users), users[0][:12])
	}
	if err := s.db.DeleteImage(ctx, name); err != nil {
		return err
	}
	_, err = s.gc(ctx)
	return err
}

// rootfs is the root filesystem of an image as overlays.
func (s *imageStore) rootfs(img *api.Image) ([]isolate.Overlay, error) {
	if img.Name == HostImage || img.Base == HostImage {
		layers, err := hostLayers(s.hostDir())
		if err != nil {
			return nil, err
		}
		for i := range layers {
			above := img.MountLayers[layers[i].Target]
			if layers[i].Target == "/" {
				above = img.Layers
			}
			for _, l := range above {
				layers[i].Lowers = append(layers[i].Lowers, s.layers.LayerPath(l))
			}
		}
		return layers, nil
	}
	var lowers []string
	for _, l := range img.Layers {
		lowers = append(lowers, s.layers.LayerPath(l))
	}
	if len(lowers) == 0 {
		dir := filepath.Join(s.dataDir, "images", "empty")
		os.MkdirAll(dir, 0o755)
		lowers = []string{dir}
	}
	return []isolate.Overlay{{Target: "/", Lowers: lowers, Name: "root"}}, nil
}

// putImage records an image under its name. A name that sandboxes use is
// not replaced: their writable layers sit on that image's files.
func (m *Manager) putImage(ctx context.Context, img *api.Image) error {
	if img.Name == HostImage {
		return api.FieldError("name", "\"host\" is the built-in image")
	}
	sc := ScopeFrom(ctx)
	if !strings.HasPrefix(img.Name, cachePrefix) {
		img.Owner = sc.owner()
		admitted, err := m.admitN(ctx, boundImages, 1)
		if err != nil {
			return err
		}
		defer admitted()
	}
	return m.imgs.put(ctx, img)
}

// put records img under its name, unless the name is another's that the
// request's scope may not replace or one that sandboxes use.
func (s *imageStore) put(ctx context.Context, img *api.Image) error {
	sc := ScopeFrom(ctx)
	if !sc.IsAdmin() && !strings.HasPrefix(img.Name, cachePrefix+sc.owner()+"-") {
		// Images are shared: a token adds new ones but never replaces
		// one that others may run.
		if _, err := s.db.GetImage(ctx, img.Name); err == nil {
			return api.Errorf(api.KindConflict, "image %q already exists and only the admin replaces images: pick another name", img.Name)
		}
	}
	if users, err := s.db.ImageInUse(ctx, img.Name); err != nil {
		return err
	} else if len(users) > 0 {
		return api.Errorf(api.KindConflict, "image %q is used by %d sandbox(es), first %s: remove them or pick another name", img.Name, len(users), users[0][:12])
	}
	all := append([]string{}, img.Layers...)
	for _, ls := range img.MountLayers {
		all = append(all, ls...)
	}
	doc, _ := json.Marshal(img)
	return s.db.PutImage(ctx, &store.Image{Name: img.Name, ID: img.ID, Layers: all, Size: img.Size, CreatedAt: img.CreatedAt, Doc: doc})
}

// Commit makes an image of a sandbox's files as they are: each writable
// layer becomes a read-only layer on top of the sandbox's image.
func (m *Manager) Commit(ctx context.Context, id string, req api.CommitRequest) (*api.Image, error) {
	if err := newImageName("name", req.Name); err != nil {
		return nil, err
	}
	rec, err := m.get(ctx, id)
	if err != nil {
		return nil, err
	}
	unlock := m.lock(rec.ID)
	defer unlock()
	parent, err := m.Image(ctx, rec.Image)
	if err != nil {
		return nil, err
	}
	spec, err := m.spec(ctx, rec)
	if err != nil {
		return nil, err
	}
	if err := m.canonical(rec, spec); err != nil {
		return nil, err
	}
	img := &api.Image{
		Name: req.Name, Base: parent.Base, Layers: append([]string{}, parent.Layers...),
		CreatedAt: time.Now().UTC(), Config: parent.Config, Size: parent.Size,
	}
	if parent.Name == HostImage {
		img.Base = HostImage
	}
	for t, ls := range parent.MountLayers {
		if img.MountLayers == nil {
			img.MountLayers = map[string][]string{}
		}
		img.MountLayers[t] = append([]string{}, ls...)
	}
	for _, l := range spec.Layers {
		upper := filepath.Join(spec.Dir, "upper", l.Name)
		if empty, _ := dirEmpty(upper); empty {
			continue
		}
		// The upper dir stores the ids as the sandbox saw them (the linux
		// tier id-maps it), and the layer keeps them.
		diffID, size, err := m.imgs.layers.AddLayerFromDirOptions(ctx, upper, image.DirOptions{IDBase: 0})
		if err != nil {
			return nil, fmt.Errorf("commit %s: %w", l.Target, err)
		}
		img.Size += size
		if l.Target == "/" {
			img.Layers = append(img.Layers, diffID)
		} else {
			if img.MountLayers == nil {
				img.MountLayers = map[string][]string{}
			}
			img.MountLayers[l.Target] = append(img.MountLayers[l.Target], diffID)
		}
	}
	if req.Config != nil {
		img.Config = *req.Config
	} else {
		img.Config.Env = append(append([]string{}, img.Config.Env...), rec.Env...)
		if rec.Workdir != "" {
			img.Config.Workdir = rec.Workdir
		}
		if rec.User != "" {
			img.Config.User = rec.User
		}
	}
	img.ID = imageID(img)
	if err := m.putImage(ctx, img); err != nil {
		return nil, err
	}
	m.event(rec.ID, "image.commit", map[string]any{"name": img.Name, "id": img.ID})
	return img, nil
}

// imageID is a digest of what makes an image: base, layers and config.
func imageID(img *api.Image) string {
	b, _ := json.Marshal(struct {
		Base        string
		Layers      []string
		MountLayers map[string][]string
		Config      api.ImageConfig
	}{img.Base, img.Layers, img.MountLayers, img.Config})
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func dirEmpty(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return true, err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	return len(names) == 0, err
}

// PullImage fetches an image from a registry into the layer store.
func (m *Manager) PullImage(ctx context.Context, ref string, opts image.PullOptions, name string, progress image.Progress) (*api.Image, error) {
	if ref == "" {
		return nil, api.FieldError("ref", "missing: name the image to pull, like docker.io/library/alpine:3.20")
	}
	if err := image.CheckName(ref); err != nil {
		return nil, api.FieldError("ref", "%q is not an image reference: %v (like docker.io/library/alpine:3.20)", ref, err)
	}
	if name != "" {
		if err := newImageName("name", strings.ToLower(name)); err != nil {
			return nil, err // before pulling anything
		}
	}
	ni, err := m.imgs.layers.Pull(ctx, ref, opts, progress)
	if err != nil {
		return nil, api.Errorf(api.KindInvalid, "%v", err)
	}
	if name == "" {
		name = ni.Name
	}
	if name == "" {
		name = ref
	}
	name = strings.ToLower(name)
	if err := newImageName("name", name); err != nil {
		return nil, err
	}
	img := fromStore(name, ni.Image)
	if err := m.putImage(ctx, img); err != nil {
		return nil, err
	}
	m.event("", "image.pull", map[string]any{"name": name, "ref": ref, "id": img.ID})
	return img, nil
}

func fromStore(name string, si image.Image) *api.Image {
	c := si.Config
	return &api.Image{
		Name: name, ID: si.ID, Layers: si.Layers, Size: si.Size, CreatedAt: time.Now().UTC(),
		Config: api.ImageConfig{
			Env: c.Env, Workdir: c.WorkingDir, User: c.User, Cmd: c.Cmd, Entrypoint: c.Entrypoint,
			ExposedPorts: c.ExposedPorts, Labels: c.Labels,
		},
	}
}

// SaveImages writes images as one OCI archive that den image import (or
// docker load) reads on another host. Images on the host base cannot be
// saved: their lower layers are this host's own files.
func (m *Manager) SaveImages(ctx context.Context, names []string, w io.Writer) error {
	return m.imgs.save(ctx, names, w)
}

// save writes the named images as one OCI archive.
func (s *imageStore) save(ctx context.Context, names []string, w io.Writer) error {
	var imgs []image.SaveImage
	for _, n := range names {
		img, err := s.get(ctx, n)
		if err != nil {
			return err
		}
		if img.Name == HostImage || img.Base == HostImage {
			return api.Errorf(api.KindUnsupported, "image %q is built on this host's own files (the host image) and cannot be saved; build from a base image instead", n)
		}
		imgs = append(imgs, image.SaveImage{Name: img.Name, Image: image.Image{
			ID: img.ID, Layers: img.Layers, Size: img.Size,
			Config: image.Config{Env: img.Config.Env, WorkingDir: img.Config.Workdir, User: img.Config.User, Cmd: img.Config.Cmd,
				Entrypoint: img.Config.Entrypoint, ExposedPorts: img.Config.ExposedPorts, Labels: img.Config.Labels},
		}})
	}
	return s.layers.Save(ctx, w, imgs)
}

// PruneResult says what a prune removed.
type PruneResult struct {
	Images []string `json:"images"`
	Layers int      `json:"layers"`
}

// PruneImages removes the build cache not used by any sandbox, and every
// layer no image uses.
func (m *Manager) PruneImages(ctx context.Context) (*PruneResult, error) { return m.imgs.prune(ctx) }

// prune removes the build cache no sandbox uses, then unused layers.
func (s *imageStore) prune(ctx context.Context) (*PruneResult, error) {
	all, err := s.db.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	res := &PruneResult{Images: []string{}}
	for _, i := range all {
		if !strings.HasPrefix(i.Name, cachePrefix) {
			continue
		}
		if users, _ := s.db.ImageInUse(ctx, i.Name); len(users) > 0 {
			continue
		}
		if err := s.db.DeleteImage(ctx, i.Name); err == nil {
			res.Images = append(res.Images, i.Name)
		}
	}
	n, err := s.gc(ctx)
	res.Layers = n
	return res, err
}

// gc removes layers no image refers to.
func (s *imageStore) gc(ctx context.Context) (int, error) {
	refs, err := s.db.LayerRefs(ctx)
	if err != nil {
		return 0, err
	}
	present, err := s.layers.Layers()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range present {
		if refs[l] == 0 {
			if err := s.layers.RemoveLayer(l); err != nil {
				s.log.Warn("remove layer", "layer", l, "err", err)
				continue
			}
			n++
		}
	}
	return n, nil
}
