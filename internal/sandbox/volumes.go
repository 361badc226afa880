package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/store"
)

// Volumes are directories (btrfs subvolumes, with their own quota) under
// the storage root that sandboxes mount by name. Their files are kept with
// the ids a sandbox sees (root inside = 0 on disk) and id-mapped into each
// sandbox that mounts them, so several sandboxes share them as the same
// users. Snapshots and forks never include volumes: a fork mounts the same
// volumes as its source.

const kindVolume = "volume"

// MaxMounts bounds the volumes plus bind mounts of one sandbox.
const MaxMounts = 32

// volumeStore is the daemon's volumes: their records in the store and
// their trees under the storage root. It has no lock of its own (it keeps
// no state in memory): the manager serialises a volume's create and
// remove under the lifecycle lock "volume:NAME".
type volumeStore struct {
	trees
	db  *store.DB
	log *slog.Logger
}

func (v *volumeStore) root() string           { return filepath.Join(v.storeRoot(), "volumes") }
func (v *volumeStore) dir(name string) string { return filepath.Join(v.root(), name) }

func (m *Manager) volumesDir() string { return m.vols.root() }

// CreateVolume makes a volume.
func (m *Manager) CreateVolume(ctx context.Context, req api.VolumeRequest) (*api.Volume, error) {
	if !validName(req.Name) {
		return nil, api.FieldError("name", "%q: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit", req.Name)
	}
	if req.Size < 0 {
		return nil, api.FieldError("size", "must not be negative")
	}
	if err := ScopeFrom(ctx).capDisk("size", &req.Size); err != nil {
		return nil, err
	}
	if req.Size == 0 {
		req.Size = m.defaultDisk()
	}
	if req.Size > 0 && !m.cfg.Storage.Quotas() {
		return nil, api.FieldError("size", "volume quotas need den's managed filesystem (btrfs), which this daemon does not have: see den info")
	}
	if err := m.room(); err != nil {
		return nil, err
	}
	admitted, err := m.admitN(ctx, boundVolumes, 1)
	if err != nil {
		return nil, err
	}
	defer admitted()
	unlock := m.lock("volume:" + req.Name)
	defer unlock()
	v, err := m.vols.create(ctx, req.Name, req.Size, ScopeFrom(ctx).owner())
	if err != nil {
		return nil, err
	}
	m.event("", "volume.create", map[string]any{"volume": v.Name, "size": v.Size})
	return v, nil
}

// create makes volume name's tree, with a quota of size, and records it.
// Call with the volume locked.
func (v *volumeStore) create(ctx context.Context, name string, size api.Size, owner string) (*api.Volume, error) {
	if _, err := v.db.GetObject(ctx, kindVolume, name); err == nil {
		return nil, api.Errorf(api.KindExists, "a volume named %q already exists", name)
	}
	if err := os.MkdirAll(v.root(), 0o700); err != nil {
		return nil, err
	}
	dir := v.dir(name)
	v.deleteTree(dir) // a volume whose record a crash lost
	if err := v.newTree(dir); err != nil {
		return nil, fmt.Errorf("create volume: %w", err)
	}
	os.Chmod(dir, 0o755)
	if err := v.setQuota(dir, size); err != nil {
		v.deleteTree(dir)
		return nil, err
	}
	vol := &api.Volume{Name: name, Size: size, CreatedAt: time.Now().UTC(), Owner: owner}
	doc, _ := json.Marshal(vol)
	if err := v.db.PutObject(ctx, &store.Object{Kind: kindVolume, ID: vol.Name, Name: vol.Name, Owner: vol.Owner, CreatedAt: vol.CreatedAt, Doc: doc}); err != nil {
		v.deleteTree(dir)
		return nil, err
	}
	return vol, nil
}

// getVolume finds a volume the request's scope sees.
func (m *Manager) getVolume(ctx context.Context, name string) (*api.Volume, error) {
	return m.vols.get(ctx, ScopeFrom(ctx), name)
}

// get finds a volume sc sees (nil: the daemon, which sees all).
func (v *volumeStore) get(ctx context.Context, sc *Scope, name string) (*api.Volume, error) {
	o, err := v.db.GetObject(ctx, kindVolume, name)
	if errors.Is(err, store.ErrNotFound) || (err == nil && o.ID != name) {
		return nil, api.Errorf(api.KindNotFound, "no volume %q: create it with den volume create %s", name, name)
	}
	if err != nil {
		return nil, err
	}
	var vol api.Volume
	if err := json.Unmarshal(o.Doc, &vol); err != nil {
		return nil, fmt.Errorf("volume %s: %w", name, err)
	}
	if !sc.seesOwned(vol.Owner, "") {
		return nil, api.Errorf(api.KindNotFound, "no volume %q: create it with den volume create %s", name, name)
	}
	return &vol, nil
}

// volumeUsers maps each volume name to the sandboxes that mount it (of
// those the request's scope sees).
func (m *Manager) volumeUsers(ctx context.Context) (map[string][]string, error) {
	sc := ScopeFrom(ctx)
	all, err := m.db.ListSandboxes(ctx, nil)
	if err != nil {
		return nil, err
	}
	users := map[string][]string{}
	for _, s := range all {
		rec, err := decodeRecord(s)
		if err != nil || !sc.Sees(rec.ID, rec.Owner) {
			continue
		}
		for _, v := range rec.Volumes {
			users[v.Name] = append(users[v.Name], rec.ID)
		}
	}
	return users, nil
}

// GetVolume returns a volume with its use.
func (m *Manager) GetVolume(ctx context.Context, name string) (*api.Volume, error) {
	v, err := m.getVolume(ctx, name)
	if err != nil {
		return nil, err
	}
	users, err := m.volumeUsers(ctx)
	if err != nil {
		return nil, err
	}
	v.UsedBy = users[v.Name]
	v.Used = api.Size(m.diskUsed(m.vols.dir(v.Name)))
	return v, nil
}

// Volumes lists every volume.
func (m *Manager) Volumes(ctx context.Context) ([]*api.Volume, error) {
	out, err := m.vols.list(ctx, ScopeFrom(ctx))
	if err != nil {
		return nil, err
	}
	users, err := m.volumeUsers(ctx)
	if err != nil {
		return nil, err
	}
	for _, v := range out {
		v.UsedBy = users[v.Name]
	}
	return out, nil
}

// list is the volumes sc sees, with their disk use.
func (v *volumeStore) list(ctx context.Context, sc *Scope) ([]*api.Volume, error) {
	objs, err := v.db.ListObjects(ctx, kindVolume, "")
	if err != nil {
		return nil, err
	}
	out := []*api.Volume{}
	for _, o := range objs {
		var vol api.Volume
		if json.Unmarshal(o.Doc, &vol) != nil || !sc.seesOwned(vol.Owner, "") {
			continue
		}
		vol.Used = api.Size(v.diskUsed(v.dir(vol.Name)))
		out = append(out, &vol)
	}
	return out, nil
}

// RemoveVolume deletes a volume and its files; one a sandbox mounts is a
// conflict.
func (m *Manager) RemoveVolume(ctx context.Context, name string) error {
	v, err := m.getVolume(ctx, name)
	if err != nil {
		return err
	}
	unlock := m.lock("volume:" + v.Name)
	defer unlock()
	users, err := m.volumeUsers(WithScope(ctx, nil)) // in use by anyone: keep it
	if err != nil {
		return err
	}
	if u := users[v.Name]; len(u) > 0 {
		return api.Errorf(api.KindConflict, "volume %q is used by sandbox %s: remove the sandboxes that mount it first", v.Name, short(u[0]))
	}
	if err := m.vols.remove(ctx, v.Name); err != nil {
		return err
	}
	m.event("", "volume.remove", map[string]any{"volume": v.Name})
	return nil
}

// remove deletes volume name's record, then its tree. Call with the
// volume locked.
func (v *volumeStore) remove(ctx context.Context, name string) error {
	if err := v.db.DeleteObject(ctx, kindVolume, name); err != nil {
		return err
	}
	if err := v.deleteTree(v.dir(name)); err != nil {
		v.log.Warn("remove volume files", "volume", name, "err", err)
	}
	return nil
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// checkTarget validates a mount point inside a sandbox.
func checkTarget(field, p string, seen map[string]bool) error {
	if !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) || len(p) > 1024 {
		return api.FieldError(field, "%q is not an absolute path", p)
	}
	clean := path.Clean(p)
	if clean != p && clean+"/" != p {
		return api.FieldError(field, "%q is not a clean path (use %q)", p, clean)
	}
	if clean == "/" {
		return api.FieldError(field, "cannot mount over /")
	}
	for _, bad := range []string{"/proc", "/sys", "/dev"} {
		if clean == bad || strings.HasPrefix(clean, bad+"/") {
			return api.FieldError(field, "cannot mount at %s (under %s)", clean, bad)
		}
	}
	if seen[clean] {
		return api.FieldError(field, "two mounts at %s", clean)
	}
	seen[clean] = true
	return nil
}

// checkMounts validates a create request's volumes and bind mounts.
func (m *Manager) checkMounts(ctx context.Context, vols []api.VolumeMount, binds []api.BindMount) error {
	if len(vols)+len(binds) > MaxMounts {
		return api.FieldError("volumes", "more than %d volumes and mounts", MaxMounts)
	}
	seen := map[string]bool{}
	for i, v := range vols {
		field := fmt.Sprintf("volumes[%d]", i)
		if !validName(v.Name) {
			return api.FieldError(field+".name", "%q is not a volume name", v.Name)
		}
		if _, err := m.getVolume(ctx, v.Name); err != nil {
			return err
		}
		if err := checkTarget(field+".path", v.Path, seen); err != nil {
			return err
		}
	}
	for i, b := range binds {
		field := fmt.Sprintf("mounts[%d]", i)
		if _, err := m.allowedSource(b.Source); err != nil {
			return api.FieldError(field+".source", "%v", err)
		}
		if err := checkTarget(field+".target", b.Target, seen); err != nil {
			return err
		}
	}
	return nil
}

// allowedSource resolves a bind mount's host directory and checks it is
// one the daemon allows (or beneath one).
func (m *Manager) allowedSource(src string) (string, error) {
	if len(m.cfg.AllowMounts) == 0 {
		return "", errors.New("this daemon allows no host directories: start it with den serve --allow-mount DIR")
	}
	if !filepath.IsAbs(src) || strings.ContainsRune(src, 0) {
		return "", fmt.Errorf("%q is not an absolute path", src)
	}
	real, err := filepath.EvalSymlinks(src)
	if err != nil {
		return "", fmt.Errorf("%q: %v", src, err)
	}
	if st, err := os.Stat(real); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%q is not a directory", src)
	}
	for _, a := range m.cfg.AllowMounts {
		ra, err := filepath.EvalSymlinks(a)
		if err != nil {
			continue
		}
		if real == ra || strings.HasPrefix(real, strings.TrimSuffix(ra, "/")+"/") {
			return real, nil
		}
	}
	return "", fmt.Errorf("%q is not under a directory the daemon allows (%s)", src, strings.Join(m.cfg.AllowMounts, ", "))
}

// mounts turns a sandbox's volumes and bind mounts into the runtime's.
func (m *Manager) mounts(ctx context.Context, rec *record) ([]isolate.Mount, error) {
	var out []isolate.Mount
	for _, v := range rec.Volumes {
		// Checked against the creator's scope at create; whoever boots
		// the sandbox later (a request narrowed to it) need not see it.
		if _, err := m.vols.get(ctx, nil, v.Name); err != nil {
			return nil, err
		}
		out = append(out, isolate.Mount{Source: m.vols.dir(v.Name), Target: v.Path, ReadOnly: v.ReadOnly, IDMapped: true})
	}
	for _, b := range rec.Mounts {
		src, err := m.allowedSource(b.Source)
		if err != nil {
			return nil, api.Errorf(api.KindConflict, "mount %s: %v", b.Target, err)
		}
		out = append(out, isolate.Mount{Source: src, Target: b.Target, ReadOnly: b.ReadOnly, IDMapped: true})
	}
	return out, nil
}
