package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/store"
)

func validImageName(s string) bool { return wordOK(s, 255, "._/:@-", true) }

func hostImageRecord() *api.Image {
	return &api.Image{Name: HostImage, ID: "builtin:host", CreatedAt: time.Unix(0, 0).UTC()}
}

// Image returns one image; "host" is built in.
func (m *Manager) Image(ctx context.Context, name string) (*api.Image, error) {
	if name == HostImage {
		return hostImageRecord(), nil
	}
	img, err := m.db.GetImage(ctx, name)
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
	return &out, nil
}

// Images lists every image, the built-in one first.
func (m *Manager) Images(ctx context.Context) ([]*api.Image, error) {
	all, err := m.db.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	out := []*api.Image{hostImageRecord()}
	for _, i := range all {
		var img api.Image
		if json.Unmarshal(i.Doc, &img) == nil {
			out = append(out, &img)
		}
	}
	return out, nil
}

// ImportImage unpacks an OCI archive or docker-save tarball. name names
// the image when the archive has one image; otherwise the archive's own
// names are used.
func (m *Manager) ImportImage(ctx context.Context, name string, r io.Reader, progress image.Progress) ([]*api.Image, error) {
	if name != "" && (!validImageName(name) || name == HostImage) {
		return nil, api.FieldError("name", "%q is not a usable image name (lower case letters, digits, ._/:@-; not \"host\")", name)
	}
	imgs, err := m.images.ImportReader(ctx, r, progress)
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
		if !validImageName(n) || n == HostImage {
			return nil, api.Errorf(api.KindInvalid, "import: the archive names an image %q, which is not usable here; pass a name", n)
		}
		c := ni.Image.Config
		rec := &api.Image{
			Name: n, ID: ni.Image.ID, Layers: ni.Image.Layers, Size: ni.Image.Size, CreatedAt: time.Now().UTC(),
			Config: api.ImageConfig{
				Env: c.Env, Workdir: c.WorkingDir, User: c.User, Cmd: c.Cmd, Entrypoint: c.Entrypoint,
				ExposedPorts: c.ExposedPorts, Labels: c.Labels,
			},
		}
		doc, _ := json.Marshal(rec)
		if err := m.db.PutImage(ctx, &store.Image{Name: n, ID: rec.ID, Layers: rec.Layers, Size: rec.Size, CreatedAt: rec.CreatedAt, Doc: doc}); err != nil {
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
	users, err := m.db.ImageInUse(ctx, name)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return api.Errorf(api.KindConflict, "image %q is used by %d sandbox(es), first %s: remove them first", name, len(users), users[0][:12])
	}
	if err := m.db.DeleteImage(ctx, name); err != nil {
		return err
	}
	refs, err := m.db.LayerRefs(ctx)
	if err != nil {
		return err
	}
	present, err := m.images.Layers()
	if err != nil {
		return err
	}
	for _, l := range present {
		if refs[l] == 0 {
			if err := m.images.RemoveLayer(l); err != nil {
				m.log.Warn("remove layer", "layer", l, "err", err)
			}
		}
	}
	m.event("", "image.remove", map[string]any{"name": name})
	return nil
}
