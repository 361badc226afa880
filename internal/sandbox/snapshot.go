package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/storage"
	"github.com/den-dev/den/internal/store"
)

// Snapshots are read-only copies of a sandbox's state directory (its
// writable layers and its egress CA; never the image layers beneath, never
// its volumes) taken by the storage backend: a btrfs snapshot when den
// manages a btrfs filesystem (constant time, files shared until changed),
// a full copy otherwise. A sandbox that runs is frozen for the instant of
// the capture. The checksum manifest of the files is computed after the
// capture, off the request path, and verified whenever the snapshot is used.

const kindSnapshot = "snapshot"

// MaxForks bounds one fork request.
const MaxForks = 64

// snapshotStore is the daemon's snapshots as kept: their records in the
// store, their trees under the storage root, their checksum manifests and
// saved memory under DataDir. It has no lock of its own (it keeps no state
// in memory): the manager serialises changes to one snapshot's record
// under the lifecycle lock "snapshot:ID". Taking, restoring and forking
// snapshots are the manager's (they stop, copy and boot sandboxes).
type snapshotStore struct {
	trees
	db      *store.DB
	dataDir string
	log     *slog.Logger
}

func (ss *snapshotStore) root() string         { return filepath.Join(ss.storeRoot(), "snapshots") }
func (ss *snapshotStore) dir(id string) string { return filepath.Join(ss.root(), id) }
func (ss *snapshotStore) manifestsDir() string { return filepath.Join(ss.dataDir, "manifests") }
func (ss *snapshotStore) manifestPath(id string) string {
	return filepath.Join(ss.manifestsDir(), id+".json")
}

// memoryDir keeps a snapshot's saved processes and memory.
func (ss *snapshotStore) memoryDir(snapID string) string {
	return filepath.Join(ss.dataDir, "memory", snapID)
}

// DiskQuotas reports whether this daemon's storage enforces disk quotas.
func (m *Manager) DiskQuotas() bool { return m.cfg.Storage.Quotas() }

// SandboxesDir, SnapshotsDir and VolumesDir are where the trees live.
func (m *Manager) SandboxesDir() string { return m.sandboxesDir() }
func (m *Manager) SnapshotsDir() string { return m.snaps.root() }
func (m *Manager) VolumesDir() string   { return m.volumesDir() }

// ImageStore is the manager's image store.
func (m *Manager) ImageStore() *image.Store { return m.imgs.layers }

// put records s.
func (ss *snapshotStore) put(ctx context.Context, s *api.Snapshot) error {
	doc, err := json.Marshal(s)
	if err != nil {
		return err
	}
	err = ss.db.PutObject(ctx, &store.Object{Kind: kindSnapshot, ID: s.ID, Name: s.Name, Owner: s.Sandbox, CreatedAt: s.CreatedAt, Doc: doc})
	if errors.Is(err, store.ErrExists) {
		return api.Errorf(api.KindExists, "a snapshot named %q already exists", s.Name)
	}
	return err
}

// get finds a snapshot by id, unique id prefix or name among those the
// request's scope sees.
func (ss *snapshotStore) get(ctx context.Context, idOrName string) (*api.Snapshot, error) {
	if idOrName == "" {
		return nil, api.FieldError("snapshot", "missing snapshot id or name")
	}
	o, err := ss.db.GetObject(ctx, kindSnapshot, idOrName)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, api.Errorf(api.KindNotFound, "no snapshot %q", idOrName)
	case errors.Is(err, store.ErrConflict):
		return nil, api.Errorf(api.KindConflict, "%v: use more of the id", err)
	case err != nil:
		return nil, err
	}
	var s api.Snapshot
	if err := json.Unmarshal(o.Doc, &s); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", o.ID, err)
	}
	if !ScopeFrom(ctx).seesOwned(s.Owner, s.Sandbox) {
		return nil, api.Errorf(api.KindNotFound, "no snapshot %q", idOrName)
	}
	return &s, nil
}

// Snapshots lists snapshots, of one sandbox when sandbox is not empty.
func (m *Manager) Snapshots(ctx context.Context, sandbox string) ([]*api.Snapshot, error) {
	owner := ""
	if sandbox != "" {
		rec, err := m.get(ctx, sandbox)
		if err != nil {
			return nil, err
		}
		owner = rec.ID
	}
	return m.snaps.list(ctx, owner)
}

// list is the snapshots the request's scope sees, of sandbox only when it
// is not empty.
func (ss *snapshotStore) list(ctx context.Context, sandbox string) ([]*api.Snapshot, error) {
	objs, err := ss.db.ListObjects(ctx, kindSnapshot, sandbox)
	if err != nil {
		return nil, err
	}
	out := []*api.Snapshot{}
	sc := ScopeFrom(ctx)
	for _, o := range objs {
		var s api.Snapshot
		if json.Unmarshal(o.Doc, &s) == nil && sc.seesOwned(s.Owner, s.Sandbox) {
			out = append(out, &s)
		}
	}
	return out, nil
}

// GetSnapshot returns one snapshot.
func (m *Manager) GetSnapshot(ctx context.Context, idOrName string) (*api.Snapshot, error) {
	return m.snaps.get(ctx, idOrName)
}

// RemoveSnapshot deletes a snapshot. Sandboxes made from it keep their files.
func (m *Manager) RemoveSnapshot(ctx context.Context, idOrName string) error {
	s, err := m.snaps.get(ctx, idOrName)
	if err != nil {
		return err
	}
	unlock := m.lock("snapshot:" + s.ID)
	defer unlock()
	if err := m.snaps.remove(ctx, s.ID); err != nil {
		return err
	}
	m.event(s.Sandbox, "snapshot.remove", map[string]any{"snapshot": s.ID})
	return nil
}

// remove deletes snapshot id's record, then its manifest, saved memory
// and tree. Call with the snapshot locked.
func (ss *snapshotStore) remove(ctx context.Context, id string) error {
	if err := ss.db.DeleteObject(ctx, kindSnapshot, id); err != nil {
		return err
	}
	os.Remove(ss.manifestPath(id))
	storage.RemoveTree(ss.memoryDir(id))
	if err := ss.deleteTree(ss.dir(id)); err != nil {
		ss.log.Warn("remove snapshot files", "id", id, "err", err)
	}
	return nil
}

// canonical converts a stopped sandbox's files before they are copied
// (commit, snapshot, fork). A running sandbox was converted when it started.
func (m *Manager) canonical(rec *record, spec *isolate.Spec) error {
	if rec.State == api.StateRunning || rec.State == api.StatePaused {
		return nil
	}
	rt, _ := m.tier(rec)
	c, ok := rt.(isolate.Canonicalizer)
	if !ok {
		return nil
	}
	if spec == nil {
		var err error
		if spec, err = m.spec(context.Background(), rec); err != nil {
			return err
		}
	}
	if err := c.Canonicalize(spec); err != nil {
		return fmt.Errorf("convert the sandbox's files to the current layout: %w", err)
	}
	return nil
}

// frozen runs fn with the sandbox's processes frozen if it is running, so
// that what fn copies is one instant of the sandbox's files. Call with the
// sandbox locked. It reports whether a freeze happened.
func (m *Manager) frozen(ctx context.Context, rec *record, fn func() error) (bool, error) {
	if rec.State != api.StateRunning {
		return rec.State == api.StatePaused, fn()
	}
	p, ok := m.box(rec.ID).(isolate.Pauser)
	if !ok {
		return false, api.Errorf(api.KindUnsupported, "the %s runtime cannot freeze a sandbox for a consistent copy: stop it first", rec.Runtime)
	}
	// gVisor and a microVM's kernel keep written data in their own page
	// cache: have it written out to the files den copies first.
	if rec.Runtime != "linux" {
		if err := m.box(rec.ID).Agent().JSON(ctx, "POST", agent.PathSync, nil, nil, nil); err != nil {
			return false, fmt.Errorf("sync the sandbox's files before the capture: %w", err)
		}
	}
	if err := p.Pause(ctx); err != nil {
		return false, fmt.Errorf("freeze for the capture: %w", err)
	}
	err := fn()
	isolate.TestStall("frozen", rec.ID)
	if rerr := p.Resume(context.Background()); rerr != nil && err == nil {
		err = fmt.Errorf("thaw after the capture: %w", rerr)
	}
	return true, err
}

// Snapshot captures a sandbox's files.
func (m *Manager) Snapshot(ctx context.Context, id string, req api.SnapshotRequest) (*api.Snapshot, error) {
	if req.Name != "" && !validName(req.Name) {
		return nil, api.FieldError("name", "%q: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit", req.Name)
	}
	rec, unlock, err := m.lockRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if req.Name != "" {
		if _, err := m.db.GetObject(ctx, kindSnapshot, req.Name); err == nil {
			return nil, api.Errorf(api.KindExists, "a snapshot named %q already exists", req.Name)
		}
	}
	if req.Memory {
		if _, err := m.checkpointer(rec); err != nil {
			return nil, err
		}
	}
	admitted, err := m.admitN(ctx, boundSnapshots, 1)
	if err != nil {
		return nil, err
	}
	defer admitted()
	snap := &api.Snapshot{
		ID: newID(), Name: req.Name, Sandbox: rec.ID, Owner: rec.Owner, Image: rec.Image, CreatedAt: time.Now().UTC(),
		Runtime: rec.Runtime, Env: rec.Env, Workdir: rec.Workdir, User: rec.User, Limits: rec.Limits, Network: rec.Network,
	}
	if err := os.MkdirAll(m.snaps.root(), 0o700); err != nil {
		return nil, err
	}
	if err := m.canonical(rec, nil); err != nil {
		return nil, err
	}
	dir := m.snaps.dir(snap.ID)
	start := time.Now()
	capture := func() error { return m.copyTree(filepath.Join(m.sandboxesDir(), rec.ID), dir, true) }
	mem := m.snaps.memoryDir(snap.ID)
	if req.Memory {
		err = m.withCheckpoint(ctx, rec, mem, capture)
		snap.Paused, snap.Memory = true, true
	} else {
		snap.Paused, err = m.frozen(ctx, rec, capture)
	}
	if err != nil {
		m.deleteTree(dir)
		storage.RemoveTree(mem)
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	took := time.Since(start)
	snap.Size = api.Size(m.diskUsed(dir))
	if snap.Memory {
		snap.MemorySize = api.Size(dirSize(mem))
	}
	if err := m.snaps.put(ctx, snap); err != nil {
		m.deleteTree(dir)
		storage.RemoveTree(mem)
		return nil, err
	}
	m.event(rec.ID, "snapshot.create", map[string]any{"snapshot": snap.ID, "name": snap.Name, "memory": snap.Memory, "ms": float64(took.Microseconds()) / 1000})
	m.sealAsync(snap.ID)
	return snap, nil
}

// sealing tracks manifests being computed: snapshot id → done channel.
var sealing sync.Map

// sealMu runs one manifest at a time (they read every byte of a snapshot;
// several at once would starve the sandboxes of disk and CPU), and
// hashCache keeps, per sandbox, the hashes of its last snapshot's files,
// so the next snapshot hashes only files that changed.
var (
	sealMu    sync.Mutex
	hashMu    sync.Mutex
	hashCache = map[string]storage.HashCache{}
)

func cachedHashes(sandbox string) storage.HashCache {
	hashMu.Lock()
	defer hashMu.Unlock()
	return hashCache[sandbox]
}

func setCachedHashes(sandbox string, c storage.HashCache) {
	hashMu.Lock()
	defer hashMu.Unlock()
	if c == nil {
		delete(hashCache, sandbox)
	} else {
		hashCache[sandbox] = c
	}
}

// manifestRoot is the tree a snapshot's manifest covers: its overlay
// upper directories, or all of it when it has none (a microVM's files are
// one disk image).
func (ss *snapshotStore) manifestRoot(id string) string {
	upper := filepath.Join(ss.dir(id), "upper")
	if _, err := os.Lstat(upper); err == nil {
		return upper
	}
	return ss.dir(id)
}

// sealAsync computes a snapshot's checksum manifest in the background.
func (m *Manager) sealAsync(id string) {
	done := make(chan struct{})
	if _, loaded := sealing.LoadOrStore(id, done); loaded {
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() { sealing.Delete(id); close(done) }()
		if err := m.seal(context.Background(), id); err != nil {
			m.log.Warn("snapshot manifest", "id", id, "err", err)
		}
	}()
}

func (m *Manager) seal(ctx context.Context, id string) error {
	sealMu.Lock()
	defer sealMu.Unlock()
	s, err := m.snaps.get(ctx, id)
	if err != nil {
		return nil // removed meanwhile
	}
	man, cache, err := storage.BuildManifestCached(ctx, m.snaps.manifestRoot(id), cachedHashes(s.Sandbox))
	if err != nil {
		return err
	}
	if _, err := m.get(ctx, s.Sandbox); err == nil {
		setCachedHashes(s.Sandbox, cache)
	}
	b, err := json.Marshal(man)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(m.snaps.manifestsDir(), 0o700); err != nil {
		return err
	}
	tmp := m.snaps.manifestPath(id) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, m.snaps.manifestPath(id)); err != nil {
		return err
	}
	unlock := m.lock("snapshot:" + id)
	defer unlock()
	if s, err = m.snaps.get(ctx, id); err != nil {
		return nil // removed meanwhile
	}
	s.Digest, s.Files = man.Digest, len(man.Entries)
	return m.snaps.put(ctx, s)
}

// verified waits for a snapshot's manifest and checks its files against it.
func (ss *snapshotStore) verified(ctx context.Context, s *api.Snapshot) error {
	if ch, ok := sealing.Load(s.ID); ok {
		select {
		case <-ch.(chan struct{}):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b, err := os.ReadFile(ss.manifestPath(s.ID))
	if err != nil {
		return api.Errorf(api.KindConflict, "snapshot %s has no checksum manifest yet (%v): try again shortly", s.ID[:12], err)
	}
	var man storage.Manifest
	if err := json.Unmarshal(b, &man); err != nil {
		return fmt.Errorf("snapshot %s manifest: %w", s.ID[:12], err)
	}
	if s.Digest != "" && man.Digest != s.Digest {
		return api.Errorf(api.KindConflict, "snapshot %s: manifest digest %s does not match the recorded %s", s.ID[:12], man.Digest, s.Digest)
	}
	if err := man.Verify(ctx, ss.manifestRoot(s.ID)); err != nil {
		return api.Errorf(api.KindConflict, "snapshot %s failed verification: %v", s.ID[:12], err)
	}
	return nil
}

// Restore rolls a sandbox back to a snapshot of its image, in place: its
// processes are stopped, its files replaced, and it is started again if it
// was running.
func (m *Manager) Restore(ctx context.Context, id string, req api.RestoreRequest) (*api.Sandbox, error) {
	snap, err := m.snaps.get(ctx, req.Snapshot)
	if err != nil {
		return nil, err
	}
	rec, err := m.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if snap.Image != rec.Image {
		return nil, api.Errorf(api.KindConflict, "snapshot %s is of image %q and sandbox %s runs %q: create a new sandbox with den create --from %s", snap.ID[:12], snap.Image, rec.ID[:12], rec.Image, snap.ID[:12])
	}
	if err := m.snaps.verified(ctx, snap); err != nil {
		return nil, err
	}
	unlock := m.lock(rec.ID)
	defer unlock()
	if rec, err = m.get(ctx, rec.ID); err != nil {
		return nil, err
	}
	wasUp := rec.State == api.StateRunning || rec.State == api.StatePaused
	if wasUp {
		// No grace: the files the processes would save are replaced.
		if err := m.haltLocked(ctx, rec, api.StateStopped, 0); err != nil {
			return nil, err
		}
	}
	dir := filepath.Join(m.sandboxesDir(), rec.ID)
	if err := m.replaceTree(dir, m.snaps.dir(snap.ID), rec.Limits.Disk); err != nil {
		return nil, err
	}
	m.event(rec.ID, "snapshot.restore", map[string]any{"snapshot": snap.ID, "memory": snap.Memory})
	// A snapshot with memory brings its processes back, running.
	if snap.Memory && m.memoryUsable(rec, snap) && m.restoreFrom(ctx, rec, m.snaps.memoryDir(snap.ID)) {
		return &rec.Sandbox, nil
	}
	if wasUp {
		rec.Resumed = ""
		if err := m.boot(ctx, rec); err != nil {
			return nil, err
		}
	}
	return &rec.Sandbox, nil
}

// replaceTree swaps dir for a writable copy of snapshot src: the copy is
// made beside it first, so a failure leaves dir as it was.
func (m *Manager) replaceTree(dir, src string, quota api.Size) error {
	next, old := dir+".next", dir+".old"
	m.deleteTree(next)
	if err := m.copyTree(src, next, false); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	storage.RemoveTree(filepath.Join(next, "work"))
	if err := m.setQuota(next, quota); err != nil {
		m.deleteTree(next)
		return err
	}
	m.deleteTree(old)
	if err := os.Rename(dir, old); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.deleteTree(next)
		return fmt.Errorf("restore: %w", err)
	}
	if err := os.Rename(next, dir); err != nil {
		os.Rename(old, dir)
		return fmt.Errorf("restore: %w", err)
	}
	if err := m.deleteTree(old); err != nil {
		m.log.Warn("remove replaced files", "dir", old, "err", err)
	}
	return nil
}

// Fork makes count new sandboxes from a sandbox's current files, each
// independent of the others and of the source, which keeps running. They
// start with the source's image, settings, services and volumes.
func (m *Manager) Fork(ctx context.Context, id string, req api.ForkRequest) ([]*api.Sandbox, error) {
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Count < 1 || req.Count > MaxForks {
		return nil, api.FieldError("count", "%d is out of range 1-%d", req.Count, MaxForks)
	}
	if err := validateCreate(&api.CreateRequest{Labels: req.Labels}); err != nil {
		return nil, err
	}
	if err := mayCreate(ctx); err != nil {
		return nil, err
	}
	src, unlock, err := m.lockRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	if req.Memory {
		if _, err := m.checkpointer(src); err != nil {
			unlock()
			return nil, err
		}
	}
	if err := m.room(); err != nil {
		unlock()
		return nil, err
	}
	// Forks belong to the source's owner; the quota lock is held until
	// they are recorded (or failed).
	admitted, err := m.admit(ctx, req.Count)
	if err != nil {
		unlock()
		return nil, err
	}
	defer admitted()
	var recs []*record
	release := func() {
		for _, r := range recs {
			m.deleteTree(filepath.Join(m.sandboxesDir(), r.ID))
			m.net.free(slotOf(r.UIDBase))
		}
	}
	for i := 0; i < req.Count; i++ {
		nid := newID()
		slot, err := m.net.alloc(nid)
		if err != nil {
			unlock()
			release()
			return nil, err
		}
		r := &record{Sandbox: src.Sandbox, UIDBase: uidStart + slot*65536, Services: src.Services}
		r.ID, r.Name, r.Labels, r.ForkOf, r.From = nid, "", req.Labels, src.ID, ""
		r.Hostname, r.Address, r.Pid, r.Usage, r.Resumed = nid[:12], "", 0, api.Usage{}, ""
		r.CreatedAt = time.Now().UTC()
		r.ExpiresAt = time.Time{}
		if r.TTL > 0 {
			r.ExpiresAt = r.CreatedAt.Add(r.TTL.D())
		}
		recs = append(recs, r)
	}
	if err := m.canonical(src, nil); err != nil {
		unlock()
		release()
		return nil, err
	}
	srcDir := filepath.Join(m.sandboxesDir(), src.ID)
	start := time.Now()
	copyAll := func() error {
		// All at once: btrfs makes snapshots queued together in one
		// transaction commit, which is most of a snapshot's cost.
		errs := make([]error, len(recs))
		var wg sync.WaitGroup
		for i, r := range recs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = m.copyTree(srcDir, filepath.Join(m.sandboxesDir(), r.ID), false)
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	// Boot the forks side by side (a few at a time).
	mem := ""
	var copied time.Duration
	errs := make([]error, len(recs))
	bootAll := func() {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 4)
		for i, r := range recs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				dir := filepath.Join(m.sandboxesDir(), r.ID)
				storage.RemoveTree(filepath.Join(dir, "work"))
				errs[i] = m.setQuota(dir, r.Limits.Disk)
				if errs[i] == nil {
					errs[i] = m.createFrom(ctx, r, mem)
				}
			}()
		}
		wg.Wait()
	}
	booted := false
	if req.Memory {
		// One checkpoint of the source, its files copied while it is
		// stopped, boots every fork; the forks are restored while the
		// source is, and the checkpoint is removed once they run.
		mem = filepath.Join(m.cfg.DataDir, "memory", "fork-"+recs[0].ID)
		defer storage.RemoveTree(mem)
		done := make(chan struct{})
		err = m.withCheckpoint(ctx, src, mem, func() error {
			if err := copyAll(); err != nil {
				return err
			}
			copied = time.Since(start)
			booted = true
			go func() { bootAll(); close(done) }()
			return nil
		})
		unlock()
		if booted {
			<-done
		}
	} else {
		_, err = m.frozen(ctx, src, copyAll)
		unlock()
		copied = time.Since(start)
	}
	if err != nil && !booted {
		release()
		return nil, fmt.Errorf("fork: %w", err)
	}
	if !booted {
		bootAll()
	}
	if err != nil {
		// The forks were made but the source could not be restored.
		for i := range errs {
			if errs[i] == nil {
				errs[i] = fmt.Errorf("fork: %w", err)
				m.Remove(context.Background(), recs[i].ID, true)
			}
		}
		return nil, fmt.Errorf("fork: %w", err)
	}
	if err := errors.Join(errs...); err != nil {
		for i, r := range recs {
			if errs[i] == nil {
				m.Remove(context.Background(), r.ID, true)
			} else {
				m.deleteTree(filepath.Join(m.sandboxesDir(), r.ID))
				m.net.free(slotOf(r.UIDBase))
			}
		}
		return nil, err
	}
	out := make([]*api.Sandbox, 0, len(recs))
	for _, r := range recs {
		m.event(r.ID, "sandbox.create", map[string]any{"image": r.Image, "fork_of": src.ID})
		out = append(out, &r.Sandbox)
	}
	m.event(src.ID, "sandbox.fork", map[string]any{"count": len(out), "memory": req.Memory, "copy_ms": float64(copied.Microseconds()) / 1000})
	return out, nil
}

// createFrom records and boots a sandbox whose state directory is ready:
// from the checkpoint in mem if it is set (its processes run on), else
// afresh (also when the checkpoint cannot be restored: Resumed then says
// "restarted" and an event says why).
func (m *Manager) createFrom(ctx context.Context, rec *record, mem string) error {
	unlock := m.lock(rec.ID)
	defer unlock()
	rec.State = api.StateCreating
	if err := m.put(ctx, rec); err != nil {
		return err
	}
	if mem != "" {
		if m.restoreFrom(ctx, rec, mem) {
			return nil
		}
		rec.Resumed = api.ResumedRestarted
	}
	if err := m.boot(ctx, rec); err != nil {
		m.db.DeleteSandbox(context.Background(), rec.ID)
		return err
	}
	return nil
}

// fromSnapshot fills a create request's unset fields from a snapshot and
// returns the snapshot.
func (m *Manager) fromSnapshot(ctx context.Context, req *api.CreateRequest) (*api.Snapshot, error) {
	snap, err := m.snaps.get(ctx, req.From)
	if err != nil {
		return nil, err
	}
	if req.Image != "" && req.Image != snap.Image {
		return nil, api.FieldError("image", "snapshot %s is of image %q, not %q (a snapshot holds only the changes above its image)", snap.ID[:12], snap.Image, req.Image)
	}
	req.Image = snap.Image
	if req.Runtime == "" {
		req.Runtime = snap.Runtime
	}
	if req.Env == nil {
		req.Env = snap.Env
	}
	if req.Workdir == "" {
		req.Workdir = snap.Workdir
	}
	if req.User == "" {
		req.User = snap.User
	}
	if req.Limits == (api.Limits{}) {
		req.Limits = snap.Limits
	}
	if req.Network == nil {
		n := snap.Network
		req.Network = &n
	}
	if err := m.snaps.verified(ctx, snap); err != nil {
		return nil, err
	}
	return snap, nil
}

// recoverSnapshots removes snapshot trees whose record is missing (a
// capture the previous daemon did not finish) and finishes manifests.
func (m *Manager) recoverSnapshots(ctx context.Context) {
	objs, err := m.db.ListObjects(ctx, kindSnapshot, "")
	if err != nil {
		return
	}
	known := map[string]bool{}
	for _, o := range objs {
		known[o.ID] = true
		if _, err := os.Stat(m.snaps.manifestPath(o.ID)); err != nil {
			m.sealAsync(o.ID)
		}
	}
	ents, _ := os.ReadDir(m.snaps.root())
	for _, e := range ents {
		if !known[e.Name()] {
			err := m.deleteTree(filepath.Join(m.snaps.root(), e.Name()))
			m.log.Warn("removed the files of a snapshot without a record (a capture cut short)", "snapshot", e.Name(), "err", err)
			m.event("", "snapshot.interrupted", map[string]any{"snapshot": e.Name(), "cleaned": []string{"files"}, "error": errString(err)})
		}
	}
	// Saved memory of a snapshot never recorded, or of a fork cut short.
	ents, _ = os.ReadDir(filepath.Dir(m.snaps.memoryDir("x")))
	for _, e := range ents {
		if !known[e.Name()] {
			storage.RemoveTree(m.snaps.memoryDir(e.Name()))
		}
	}
	// A restore cut short: finish or undo the swap.
	ents, _ = os.ReadDir(m.sandboxesDir())
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, ".next"):
			m.deleteTree(filepath.Join(m.sandboxesDir(), name))
		case strings.HasSuffix(name, ".old"):
			dir := filepath.Join(m.sandboxesDir(), strings.TrimSuffix(name, ".old"))
			if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
				os.Rename(filepath.Join(m.sandboxesDir(), name), dir)
			} else {
				m.deleteTree(filepath.Join(m.sandboxesDir(), name))
			}
		}
	}
}
