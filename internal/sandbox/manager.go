// Package sandbox is den's lifecycle manager: it validates requests, keeps
// sandbox records in the store, picks each sandbox's image layers and id
// range, boots and stops boxes through an isolate.Runtime, runs commands
// through the box's agent, and expires sandboxes whose TTL has passed.
package sandbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
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

// Config wires a Manager.
type Config struct {
	DataDir string
	// Runtime is the default isolation tier; Tiers are all the tiers this
	// daemon runs, by name (the default among them; nil: the default only).
	Runtime isolate.Runtime
	Tiers   map[string]isolate.Runtime
	// Unavailable says, for each known tier this host cannot run, why.
	Unavailable map[string]string
	Store       *store.DB
	Images      *image.Store
	Defaults    api.Limits // applied where a create request leaves a limit zero
	// PreviewDomain, if set, is the domain of host-name previews,
	// PORT-ID.DOMAIN (Preview.Host): --preview-domain, or localhost when
	// the daemon listens on TCP on this host's loopback.
	PreviewDomain string
	// Egress, if set, lets sandboxes have networked modes (allow, open).
	Egress *Egress
	// WarmPool is how many fresh host-image sandboxes are kept booted and
	// unclaimed, so a create only has to name one (0 = none).
	WarmPool int
	// Storage keeps sandbox, snapshot and volume trees (btrfs subvolumes
	// with quotas, or plain directories). Nil: plain directories under
	// DataDir, no snapshots or quotas.
	Storage *storage.Store
	// AllowMounts are the host directories (and what is beneath them) that
	// sandboxes may bind-mount with --mount.
	AllowMounts []string
	Log         *slog.Logger
}

// stateWarm marks a pooled, unclaimed sandbox; it is never shown to clients.
const stateWarm = "warm"

// First host id of the ranges given to sandboxes, and how many there are.
const (
	uidStart = 1 << 20
	maxSlots = 16000
)

// Manager owns every sandbox of one daemon.
type Manager struct {
	cfg   Config
	db    *store.DB
	rt    isolate.Runtime
	imgs  *imageStore    // images, their layers and the host image (images.go)
	vols  *volumeStore   // volumes (volumes.go)
	snaps *snapshotStore // snapshots as kept: records, trees, manifests, saved memory (snapshot.go)
	trees                // sandbox, snapshot and volume trees (trees.go)
	log   *slog.Logger

	// The registry. mu guards boxes, the box of each running sandbox; a
	// sandbox's record (its state) is in the store, changed under its
	// lifecycle lock (locks).
	mu    sync.Mutex
	boxes map[string]isolate.Box

	// Each feature's state is a type of its own, whose mutex guards it:
	locks  keyedLocks  // lifecycle locks: one operation at a time per sandbox (and per snapshot:ID, volume:NAME)
	act    activity    // last use and requests in flight per sandbox (idle timeout, active time)
	idling idSet       // sandboxes whose idle action runs (stop.go: a graceful stop may wait minutes)
	stops  stopWaits   // graceful stops' waits, which den rm -f cuts short (stop.go)
	meters meterSet    // usage accounting of running sandboxes (usage.go)
	net    netTable    // id-range slots and egress policies (network.go)
	procs  procCache   // agents' recent process lists (procs.go; attribution, sleeping processes)
	attr   attrRations // attribution rations (attribute.go)
	// adm serialises, per owner and kind of thing ("owner/sandboxes"), the
	// count of what an owner has and the recording of a new one, so
	// parallel requests cannot pass a quota together (scope.go).
	adm     keyedLocks
	denials denialWatches // the egress denials of the execs running (denials.go)

	// Lock order: the lifecycle lock of an existing sandbox (Snapshot,
	// Fork and Commit hold their source's) → an admission lock (adm's,
	// held from the count to the record) → the lifecycle lock of what is
	// being made (a fresh sandbox id, a pooled one only its claimer
	// knows, volume:NAME) → at most one of the leaf mutexes: mu, and the
	// mutex inside each of locks, act, meters, net, procs, attr and adm.
	// Nothing waits for an existing sandbox's lifecycle lock while it
	// holds an admission lock. A leaf is held only to read or write its own
	// fields: never across a call that takes another lock, waits on a box
	// or its agent, or touches the store. So a feature type's methods
	// never call out of their type, and code that needs two features'
	// state (sample: activity then meters) takes them one after the other.

	pool     chan *pooled // booted, unclaimed sandboxes of the host image
	poolWake chan struct{}

	stop      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// record is a sandbox as stored: the API record plus what only the daemon needs.
type record struct {
	api.Sandbox
	UIDBase int `json:"uid_base"`
	// Checkpoint is set while a hibernated sandbox's memory is kept in
	// its checkpoint directory (tiers with memory checkpoints).
	Checkpoint bool      `json:"checkpoint,omitempty"`
	Services   []service `json:"services,omitempty"`
	Ports      []share   `json:"ports,omitempty"` // ports shared through the preview proxy
}

// New loads the sandboxes in the store, reattaching to those still running.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	m := &Manager{
		cfg: cfg, db: cfg.Store, rt: cfg.Runtime, log: cfg.Log,
		imgs:  &imageStore{db: cfg.Store, layers: cfg.Images, dataDir: cfg.DataDir, log: cfg.Log},
		boxes: map[string]isolate.Box{},
		stop:  make(chan struct{}), poolWake: make(chan struct{}, 1),
	}
	if cfg.WarmPool > 0 {
		m.pool = make(chan *pooled, cfg.WarmPool)
	}
	if cfg.Storage == nil {
		st, err := storage.Open(storage.Config{Dir: cfg.DataDir, Mode: "dir"})
		if err != nil {
			return nil, err
		}
		m.cfg.Storage = st
	}
	m.trees = trees{m.cfg.Storage}
	m.vols = &volumeStore{trees: m.trees, db: cfg.Store, log: cfg.Log}
	m.snaps = &snapshotStore{trees: m.trees, db: cfg.Store, dataDir: cfg.DataDir, log: cfg.Log}
	for _, d := range []string{m.sandboxesDir(), m.imgs.hostDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := m.recover(ctx); err != nil {
		return nil, err
	}
	m.wg.Add(1)
	go m.expireLoop()
	if m.pool != nil {
		m.wg.Add(1)
		go m.fillPool()
	}
	return m, nil
}

func (m *Manager) sandboxesDir() string { return filepath.Join(m.storeRoot(), "sandboxes") }

// Close stops background work and removes the unclaimed pool. Running
// sandboxes keep running; the next daemon reattaches to them.
func (m *Manager) Close() {
	m.closeOnce.Do(m.close)
}

func (m *Manager) close() {
	close(m.stop)
	m.wg.Wait()
	if m.pool != nil {
		for {
			select {
			case p := <-m.pool:
				m.teardown(p.rec, p.box)
			default:
				m.wg.Wait()
				return
			}
		}
	}
}

// DataDir is the daemon's data directory (git workspaces keep their
// repositories in DataDir/git).
func (m *Manager) DataDir() string { return m.cfg.DataDir }

// lock takes a sandbox's lifecycle lock (or a snapshot's, "snapshot:ID",
// or a volume's, "volume:NAME") and returns what releases it.
func (m *Manager) lock(id string) func() { return m.locks.lock(id) }

// lockRecord finds a sandbox, locks it for one lifecycle operation and
// reads its record again under the lock (another operation may have
// changed it meanwhile). Call unlock when done.
func (m *Manager) lockRecord(ctx context.Context, id string) (rec *record, unlock func(), err error) {
	if rec, err = m.get(ctx, id); err != nil {
		return nil, nil, err
	}
	unlock = m.lock(rec.ID)
	if rec, err = m.get(ctx, rec.ID); err != nil {
		unlock()
		return nil, nil, err
	}
	return rec, unlock, nil
}

// recover rebuilds the in-memory state after a (re)start.
func (m *Manager) recover(ctx context.Context) error {
	all, err := m.db.ListSandboxes(ctx, nil)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, s := range all {
		rec, err := decodeRecord(s)
		if err != nil {
			m.log.Warn("skip unreadable sandbox record", "id", s.ID, "err", err)
			continue
		}
		known[rec.ID] = true
		m.net.take(slotOf(rec.UIDBase), rec.ID)
		m.setNetPolicy(rec.ID, rec.Owner, rec.Network)
		if rec.State == stateWarm { // a pool left by a daemon that died
			m.db.DeleteSandbox(ctx, rec.ID)
			m.teardown(rec, nil)
			continue
		}
		if rec.State != api.StateRunning && rec.State != api.StateCreating && rec.State != api.StatePaused {
			continue
		}
		rt, _ := m.tier(rec)
		if l, ok := rt.(isolate.Loader); ok && rec.Pid > 0 && rec.State != api.StateCreating {
			spec, err := m.spec(ctx, rec)
			if err == nil {
				if b, err := l.Load(ctx, spec, rec.Pid); err == nil {
					m.thawCapture(ctx, rec, b)
					m.boxes[rec.ID] = b
					m.meters.start(rec.ID, rec.Usage, time.Time{})
					m.watch(rec.ID, b)
					m.settleExecs(ctx, rec.ID, b.Agent())
					continue
				}
			}
		}
		if err := m.interrupted(ctx, rec); err != nil {
			return err
		}
	}
	m.recoverSnapshots(ctx)
	// Storage whose record is gone: a removal the previous daemon did not
	// finish, or a create or fork it died in before recording the sandbox.
	ents, _ := os.ReadDir(m.sandboxesDir())
	for _, e := range ents {
		if !known[e.Name()] {
			unmounted := m.cleanAll(ctx, &isolate.Spec{ID: e.Name()})
			err := m.deleteTree(filepath.Join(m.sandboxesDir(), e.Name()))
			m.log.Warn("removed the files of a sandbox without a record (an operation cut short)", "id", e.Name(), "unmounted", unmounted, "err", err)
			m.event(e.Name(), "sandbox.interrupted", interruption{Operation: "unrecorded", Cleaned: cleaned(unmounted, "files"), Error: errString(err)})
		}
	}
	m.wg.Wait()
	return nil
}

// interruption is the data of a sandbox.interrupted event: what a daemon
// that died in the middle of an operation on the sandbox left, and what
// the next daemon did about it.
type interruption struct {
	Operation string   `json:"operation"`         // create, fork, restore, start...
	ForkOf    string   `json:"fork_of,omitempty"` // the source of an interrupted fork
	State     string   `json:"state,omitempty"`   // the sandbox's state now
	Cleaned   []string `json:"cleaned,omitempty"` // what was removed: mount points detached, "files", "processes"
	Error     string   `json:"error,omitempty"`   // what could not be cleaned
}

// interrupted settles a sandbox whose box did not outlive the previous
// daemon (or was being created when it died): whatever its runtime left
// (processes, mounts, run directory) is removed and it is recorded
// stopped. A create or fork that was in flight gets a sandbox.interrupted
// event saying so and what was cleaned.
func (m *Manager) interrupted(ctx context.Context, rec *record) error {
	was := rec.State
	unmounted, cerr := m.cleanBox(ctx, rec)
	rec.State, rec.Pid = api.StateStopped, 0
	if was == api.StateCreating {
		op := "create"
		if rec.ForkOf != "" {
			op = "fork"
		}
		rec.Error = fmt.Sprintf("the daemon stopped during this sandbox's %s: it was never started; its files are kept (den start boots it, den rm removes it)", op)
		m.log.Warn("sandbox operation interrupted by the daemon's end", "id", rec.ID, "operation", op, "unmounted", unmounted, "err", cerr)
		m.event(rec.ID, "sandbox.interrupted", interruption{Operation: op, ForkOf: rec.ForkOf, State: rec.State, Cleaned: cleaned(unmounted, "processes"), Error: errString(cerr)})
	} else if len(unmounted) > 0 || cerr != nil {
		m.log.Warn("cleaned up after a sandbox whose box is gone", "id", rec.ID, "unmounted", unmounted, "err", cerr)
	}
	return m.put(ctx, rec)
}

// cleanBox removes what rec's tier keeps of its box outside its storage
// (in every tier if its tier is unknown) and returns the mount points it
// detached. The storage stays: the storage backend removes it (a
// subvolume, maybe).
func (m *Manager) cleanBox(ctx context.Context, rec *record) ([]string, error) {
	spec, err := m.spec(ctx, rec)
	if err != nil {
		spec = &isolate.Spec{ID: rec.ID, Net: networked(rec.Network) && m.cfg.Egress != nil, NetSlot: slotOf(rec.UIDBase)}
	}
	spec.Dir = ""
	rt, err := m.tier(rec)
	if err != nil {
		return m.cleanAll(ctx, spec), nil
	}
	return clean(ctx, rt, spec)
}

// thawCapture resumes a running (not paused) sandbox that the previous
// daemon left frozen: it died during a snapshot's or fork's capture, and
// every request to the sandbox would hang on its frozen agent.
func (m *Manager) thawCapture(ctx context.Context, rec *record, b isolate.Box) {
	f, ok := b.(isolate.FrozenReporter)
	p, ok2 := b.(isolate.Pauser)
	if rec.State != api.StateRunning || !ok || !ok2 || !f.Frozen() {
		return
	}
	err := p.Resume(ctx)
	m.log.Warn("thawed a sandbox a snapshot or fork cut short had left frozen", "id", rec.ID, "err", err)
	m.event(rec.ID, "sandbox.interrupted", interruption{Operation: "snapshot or fork", State: rec.State, Cleaned: []string{"thawed"}, Error: errString(err)})
}

// clean removes what rt keeps of a box outside its storage (spec.Dir must
// be empty) and returns the mount points it detached.
func clean(ctx context.Context, rt isolate.Runtime, spec *isolate.Spec) ([]string, error) {
	if c, ok := rt.(isolate.Cleaner); ok {
		return c.Clean(ctx, spec)
	}
	return nil, rt.Destroy(ctx, spec)
}

// cleanAll cleans up after a box whose tier is unknown, in every tier.
func (m *Manager) cleanAll(ctx context.Context, spec *isolate.Spec) []string {
	unmounted, _ := clean(ctx, m.rt, spec)
	for name, rt := range m.cfg.Tiers {
		if name != m.rt.Name() {
			u, _ := clean(ctx, rt, spec)
			unmounted = append(unmounted, u...)
		}
	}
	return unmounted
}

func cleaned(unmounted []string, what string) []string {
	return append(append([]string{}, unmounted...), what)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func decodeRecord(s *store.Sandbox) (*record, error) {
	var rec record
	if err := json.Unmarshal(s.Doc, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

func (m *Manager) put(ctx context.Context, rec *record) error {
	if u, ok := m.usageOf(rec.ID); ok {
		rec.Usage = u
	}
	doc, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	err = m.db.PutSandbox(ctx, &store.Sandbox{
		ID: rec.ID, Name: rec.Name, Image: rec.Image, State: rec.State, Runtime: rec.Runtime,
		Labels: rec.Labels, CreatedAt: rec.CreatedAt, ExpiresAt: rec.ExpiresAt, Doc: doc,
	})
	if errors.Is(err, store.ErrExists) {
		return api.Errorf(api.KindExists, "a sandbox named %q already exists", rec.Name)
	}
	return err
}

// get finds a sandbox by id, unique id prefix or name among those the
// request's scope sees: any other is not_found, as if it did not exist.
func (m *Manager) get(ctx context.Context, id string) (*record, error) {
	if id == "" {
		return nil, api.FieldError("id", "missing sandbox id")
	}
	sc := ScopeFrom(ctx)
	s, err := m.db.GetSandbox(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, api.Errorf(api.KindNotFound, "no sandbox %q", id)
	case errors.Is(err, store.ErrConflict) && !sc.IsAdmin():
		return m.getPrefix(ctx, sc, id)
	case errors.Is(err, store.ErrConflict):
		return nil, api.Errorf(api.KindConflict, "%v: use more of the id", err)
	case err != nil:
		return nil, err
	}
	rec, err := decodeRecord(s)
	if err == nil && (rec.State == stateWarm || !sc.Sees(rec.ID, rec.Owner)) {
		return nil, api.Errorf(api.KindNotFound, "no sandbox %q", id)
	}
	return rec, err
}

// getPrefix resolves an id prefix that matches several sandboxes among
// those sc sees only, so a scoped request learns nothing of the others.
func (m *Manager) getPrefix(ctx context.Context, sc *Scope, prefix string) (*record, error) {
	all, err := m.db.ListSandboxes(ctx, nil)
	if err != nil {
		return nil, err
	}
	var found []*record
	for _, s := range all {
		if rec, err := decodeRecord(s); err == nil && rec.State != stateWarm && strings.HasPrefix(rec.ID, prefix) && sc.Sees(rec.ID, rec.Owner) {
			found = append(found, rec)
		}
	}
	switch len(found) {
	case 0:
		return nil, api.Errorf(api.KindNotFound, "no sandbox %q", prefix)
	case 1:
		return found[0], nil
	}
	return nil, api.Errorf(api.KindConflict, "sandbox id prefix %q is ambiguous: use more of the id", prefix)
}

func (m *Manager) event(sandbox, typ string, data any) {
	b, _ := json.Marshal(data)
	if err := m.db.AddEvent(context.Background(), &store.Event{Sandbox: sandbox, Type: typ, Data: b}); err != nil {
		m.log.Warn("event log", "type", typ, "err", err)
	}
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Create makes and starts a sandbox.
func (m *Manager) Create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	sc := ScopeFrom(ctx)
	if err := mayCreate(ctx); err != nil {
		return nil, err
	}
	if err := validateCreate(&req); err != nil {
		return nil, err
	}
	var snap *api.Snapshot
	if req.From != "" {
		var err error
		if snap, err = m.fromSnapshot(ctx, &req); err != nil {
			return nil, err
		}
	}
	if err := sc.applyCaps(&req.Limits); err != nil {
		return nil, err
	}
	if err := checkShmSize(req.ShmSize, m.limits(req.Limits).Memory); err != nil {
		return nil, err
	}
	if len(req.Mounts) > 0 && !sc.IsAdmin() {
		return nil, api.FieldError("mounts", "host directories are mounted for the admin only: use a volume (den volume create)")
	}
	if req.Image == "" {
		req.Image = HostImage
	}
	if req.Limits.Disk > 0 {
		if !m.cfg.Storage.Quotas() {
			return nil, api.FieldError("limits.disk", "disk quotas need den's managed filesystem (btrfs), which this daemon does not have: see den info")
		}
	}
	if err := m.checkMounts(ctx, req.Volumes, req.Mounts); err != nil {
		return nil, err
	}
	img, err := m.Image(ctx, req.Image)
	if err != nil {
		return nil, err
	}
	if req.Network != nil {
		if err := m.checkNetwork(ctx, sc.owner(), *req.Network); err != nil {
			return nil, err
		}
	}
	rt, err := m.tierByName(req.Runtime)
	if err != nil {
		return nil, err
	}
	if err := m.room(); err != nil {
		return nil, err
	}
	admitted, err := m.admit(ctx, 1)
	if err != nil {
		return nil, err
	}
	defer admitted()
	if img.Name == HostImage && rt == m.rt && snap == nil && req.Limits.Disk == 0 && req.ShmSize == 0 && len(req.Volumes) == 0 && len(req.Mounts) == 0 && (req.Network == nil || !networked(*req.Network)) {
		if sb, err, ok := m.claim(ctx, &req); ok {
			return sb, err
		}
	}
	id := newID()
	slot, err := m.net.alloc(id)
	if err != nil {
		return nil, err
	}
	rec := &record{Sandbox: api.Sandbox{ID: id, Image: img.Name, Runtime: rt.Name(), State: api.StateCreating}, UIDBase: uidStart + slot*65536}
	m.applyRequest(rec, &req, sc.owner())
	unlock := m.lock(id)
	defer unlock()
	if snap != nil {
		rec.From = snap.ID
	}
	if err := m.put(ctx, rec); err != nil {
		m.net.free(slotOf(rec.UIDBase))
		return nil, err
	}
	admitted()
	dir := filepath.Join(m.sandboxesDir(), id)
	err = func() error {
		if snap != nil {
			if err := m.copyTree(m.snaps.dir(snap.ID), dir, false); err != nil {
				return fmt.Errorf("copy snapshot: %w", err)
			}
			storage.RemoveTree(filepath.Join(dir, "work"))
		} else if err := m.newTree(dir); err != nil {
			return fmt.Errorf("sandbox storage: %w", err)
		}
		if err := m.setQuota(dir, rec.Limits.Disk); err != nil {
			return err
		}
		if snap != nil && m.memoryUsable(rec, snap) {
			if m.restoreFrom(ctx, rec, m.snaps.memoryDir(snap.ID)) {
				return nil
			}
			rec.Resumed = api.ResumedRestarted
		}
		return m.boot(ctx, rec)
	}()
	if err != nil {
		rt.Destroy(context.Background(), &isolate.Spec{ID: id, Net: networked(rec.Network) && m.cfg.Egress != nil, NetSlot: slot})
		m.deleteTree(dir)
		m.db.DeleteSandbox(context.Background(), id)
		m.net.free(slotOf(rec.UIDBase))
		return nil, err
	}
	m.event(id, "sandbox.create", map[string]any{"name": rec.Name, "image": rec.Image, "from": rec.From})
	return &rec.Sandbox, nil
}

// spec builds the runtime's view of a sandbox.
func (m *Manager) spec(ctx context.Context, rec *record) (*isolate.Spec, error) {
	img, err := m.Image(ctx, rec.Image)
	if err != nil {
		return nil, api.Errorf(api.KindNotFound, "image %q of sandbox %s is gone", rec.Image, rec.ID)
	}
	layers, err := m.imgs.rootfs(img)
	if err != nil {
		return nil, err
	}
	mounts, err := m.mounts(ctx, rec)
	if err != nil {
		return nil, err
	}
	return &isolate.Spec{
		ID: rec.ID, Hostname: rec.Hostname, Dir: filepath.Join(m.sandboxesDir(), rec.ID),
		Layers: layers, UIDBase: rec.UIDBase, Mounts: mounts, ShmSize: int64(rec.ShmSize),
		Net: networked(rec.Network) && m.cfg.Egress != nil, NetSlot: slotOf(rec.UIDBase),
		NetBandwidth: int64(rec.Network.Bandwidth),
		Limits:       isolate.Limits{CPUs: rec.Limits.CPUs, Memory: int64(rec.Limits.Memory), Pids: rec.Limits.Pids, Disk: int64(rec.Limits.Disk)},
	}, nil
}

// boot starts rec's box and records it running. Call with the sandbox locked.
func (m *Manager) boot(ctx context.Context, rec *record) error {
	spec, err := m.spec(ctx, rec)
	if err != nil {
		return err
	}
	rt, err := m.tier(rec)
	if err != nil {
		return err
	}
	b, err := rt.Start(ctx, spec)
	if err != nil {
		return fmt.Errorf("start sandbox: %w", err)
	}
	return m.booted(ctx, rec, spec, b, false)
}

// booted records a box that just started (or was restored) as rec's.
// A restored box's services run already: they are not started again.
func (m *Manager) booted(ctx context.Context, rec *record, spec *isolate.Spec, b isolate.Box, restored bool) error {
	rec.Error = ""
	rec.State, rec.Pid, rec.StartedAt = api.StateRunning, b.Pid(), time.Now().UTC()
	m.setNetPolicy(rec.ID, rec.Owner, rec.Network)
	rec.Address = ""
	if spec.Net {
		if a, err := m.cfg.Egress.SlotAddr(spec.NetSlot); err == nil {
			rec.Address = a.String()
		}
		if err := m.netReady(ctx, rec.ID, rec.Network, b); err != nil {
			b.Stop(context.Background())
			return fmt.Errorf("sandbox network: %w", err)
		}
	}
	if err := m.put(ctx, rec); err != nil {
		b.Stop(context.Background())
		return err
	}
	m.mu.Lock()
	m.boxes[rec.ID] = b
	m.mu.Unlock()
	m.startMeter(rec)
	m.watch(rec.ID, b)
	if !restored {
		m.startServices(ctx, rec, b.Agent())
	}
	return nil
}

// watch marks the sandbox failed, with the reason, if its box dies on its
// own.
func (m *Manager) watch(id string, b isolate.Box) {
	go func() {
		<-b.Done()
		select {
		case <-m.stop:
			return // the daemon is going away: the next one looks at it
		default:
		}
		m.mu.Lock()
		cur := m.boxes[id]
		m.mu.Unlock()
		if cur != b {
			return // stopped or removed on purpose
		}
		unlock := m.lock(id)
		defer unlock()
		m.mu.Lock()
		if m.boxes[id] != b {
			m.mu.Unlock()
			return
		}
		delete(m.boxes, id)
		m.mu.Unlock()
		retire(b, id, api.StateFailed)
		b.Stop(context.Background())
		reason := "its init process ended"
		if rec, err := m.get(context.Background(), id); err == nil {
			rec.State, rec.Pid, rec.Error = api.StateFailed, 0, reason
			m.put(context.Background(), rec)
		}
		m.log.Warn("sandbox failed", "id", id, "reason", reason)
		m.event(id, "sandbox.died", map[string]any{"reason": reason})
	}()
}

// retire marks the agent of b, a box the manager just took out of its
// view, as going away before it is stopped: a request that got the agent
// before and fails on its connection now answers conflict ("sandbox X
// stopped while the request ran") rather than internal. what is the
// sandbox's new state (stopped, hibernated, failed) or "removed".
func retire(b isolate.Box, id, what string) {
	if ag := b.Agent(); ag != nil {
		ag.Gone(api.Errorf(api.KindConflict, "sandbox %s %s while the request ran", id[:min(12, len(id))], what))
	}
}

// Get returns one sandbox, with its disk use as of now.
func (m *Manager) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	rec, err := m.get(ctx, id)
	if err != nil {
		return nil, err
	}
	rec.DiskUsed = api.Size(m.diskUsed(filepath.Join(m.sandboxesDir(), rec.ID)))
	return &rec.Sandbox, nil
}

// List returns the sandboxes carrying all of labels.
func (m *Manager) List(ctx context.Context, labels map[string]string) ([]*api.Sandbox, error) {
	all, err := m.db.ListSandboxes(ctx, labels)
	if err != nil {
		return nil, err
	}
	out := make([]*api.Sandbox, 0, len(all))
	sc := ScopeFrom(ctx)
	for _, s := range all {
		if rec, err := decodeRecord(s); err == nil && rec.State != stateWarm && sc.Sees(rec.ID, rec.Owner) {
			out = append(out, &rec.Sandbox)
		}
	}
	return out, nil
}

// Stop stops a sandbox's processes (gracefully: see StopWithin) and keeps
// its files. Idempotent.
func (m *Manager) Stop(ctx context.Context, id string) (*api.Sandbox, error) {
	return m.StopWithin(ctx, id, nil)
}

// haltLocked ends every process of a sandbox, keeps its files and records
// it in state (stopped or hibernated). A running sandbox's processes get
// its stop signal and up to grace to end before they are killed.
func (m *Manager) haltLocked(ctx context.Context, rec *record, state string, grace time.Duration) error {
	if b := m.box(rec.ID); b != nil && grace > 0 && rec.State == api.StateRunning {
		// Until the box is stopped, a command that ends answers as one cut
		// off by the stop (stopWaits.stopping).
		defer m.stops.set(rec.ID, "", nil)
		m.signalStop(ctx, rec, b, state, grace)
	}
	m.mu.Lock()
	b := m.boxes[rec.ID]
	delete(m.boxes, rec.ID)
	m.mu.Unlock()
	m.act.forget(rec.ID)
	m.sampleOne(rec.ID, b) // the last reading, while the cgroup still counts
	if b != nil {
		retire(b, rec.ID, state)
		if err := b.Stop(ctx); err != nil {
			return fmt.Errorf("stop sandbox: %w", err)
		}
	}
	if rec.State == state {
		return nil
	}
	wasUp := rec.State == api.StateRunning || rec.State == api.StatePaused
	if rec.Checkpoint && state != api.StateHibernated {
		// A hibernated sandbox stopped for good: its memory is dropped.
		rec.Checkpoint = false
		storage.RemoveTree(m.checkpointDir(rec.ID))
	}
	rec.State, rec.Pid = state, 0
	if err := m.put(ctx, rec); err != nil {
		return err
	}
	m.meters.drop(rec.ID)
	if state == api.StateStopped && wasUp {
		m.event(rec.ID, "sandbox.stop", nil)
	}
	return nil
}

// Start boots a stopped sandbox again with its files as they were.
func (m *Manager) Start(ctx context.Context, id string) (*api.Sandbox, error) {
	rec, unlock, err := m.lockRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	switch rec.State {
	case api.StateRunning:
		return &rec.Sandbox, nil
	case api.StatePaused, api.StateHibernated:
		if err := m.resumeLocked(ctx, rec); err != nil {
			return nil, err
		}
		return &rec.Sandbox, nil
	}
	rec.Resumed = ""
	if err := m.boot(ctx, rec); err != nil {
		return nil, err
	}
	m.event(rec.ID, "sandbox.start", nil)
	return &rec.Sandbox, nil
}

// Remove deletes a sandbox and its files. A running sandbox needs force.
func (m *Manager) Remove(ctx context.Context, id string, force bool) error {
	if force {
		m.cutStopWait(ctx, id)
	}
	rec, unlock, err := m.lockRecord(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	if (rec.State == api.StateRunning || rec.State == api.StatePaused) && !force {
		return api.Errorf(api.KindConflict, "sandbox %s is %s: stop it first or remove with force (den rm -f)", rec.ID[:12], rec.State)
	}
	m.mu.Lock()
	b := m.boxes[rec.ID]
	delete(m.boxes, rec.ID)
	m.mu.Unlock()
	m.meters.drop(rec.ID)
	m.net.drop(rec.ID)
	m.procs.drop(rec.ID)
	m.attr.drop(rec.ID)
	m.locks.forget(rec.ID)
	m.act.forget(rec.ID)
	if b != nil {
		retire(b, rec.ID, "removed")
	}
	setCachedHashes(rec.ID, nil)
	if err := m.db.DeleteSandbox(ctx, rec.ID); err != nil {
		return err
	}
	// The record is gone, so the id and name are free now; the processes
	// and files go in the background (a restarted daemon finishes the job).
	m.teardownAsync(rec, b)
	m.event(rec.ID, "sandbox.remove", nil)
	return nil
}

func (m *Manager) expireLoop() {
	defer m.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var lastSample time.Time
	for {
		select {
		case <-m.stop:
			return
		case now := <-t.C:
			m.stopIdle(now)
			if now.Sub(lastSample) >= UsageInterval {
				m.sampleUsage(now)
				lastSample = now
			}
			exp, err := m.db.ExpiredSandboxes(context.Background(), now)
			if err != nil {
				continue
			}
			for _, s := range exp {
				if err := m.Remove(context.Background(), s.ID, true); err != nil {
					m.log.Warn("expire sandbox", "id", s.ID, "err", err)
					continue
				}
				m.event(s.ID, "sandbox.expire", nil)
			}
		}
	}
}

// Agent returns the agent client of a running sandbox, resuming it first
// if it is paused or hibernated. Every use of a sandbox's agent counts as
// activity for its idle timeout.
func (m *Manager) Agent(ctx context.Context, id string) (*agent.Client, *api.Sandbox, error) {
	return m.agent(ctx, id, true)
}

// ReadAgent is Agent for read-only calls (process list, logs, sessions):
// a paused or hibernated sandbox is left asleep, and the call is a
// conflict saying how to wake it.
func (m *Manager) ReadAgent(ctx context.Context, id string) (*agent.Client, *api.Sandbox, error) {
	return m.agent(ctx, id, false)
}

// asleep is the error of a read-only call that needs the processes of a
// paused or hibernated sandbox.
func asleep(rec *record) error {
	why := "its processes are frozen"
	if rec.State == api.StateHibernated {
		why = "its processes are saved to disk"
	}
	return api.Errorf(api.KindConflict, "sandbox %s is %s (%s) and read-only calls leave it so: den resume %s (or any exec) wakes it", rec.ID[:12], rec.State, why, rec.ID[:12])
}

// notRunning is the error of a call that needs a sandbox's processes when
// it has none.
func notRunning(sb *api.Sandbox) error {
	return api.Errorf(api.KindConflict, "sandbox %s is %s: start it with `den start %s`", sb.ID[:12], sb.State, sb.ID[:12])
}

func (m *Manager) agent(ctx context.Context, id string, wake bool) (*agent.Client, *api.Sandbox, error) {
	rec, err := m.get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if rec.State == api.StatePaused || rec.State == api.StateHibernated {
		if !wake {
			return nil, nil, asleep(rec)
		}
		locked, unlock, err := m.lockRecord(ctx, rec.ID)
		if err != nil {
			return nil, nil, err
		}
		err = m.resumeLocked(ctx, locked)
		unlock()
		if err != nil {
			return nil, nil, err
		}
		rec = locked
	}
	b := m.box(rec.ID)
	if b == nil {
		return nil, nil, notRunning(&rec.Sandbox)
	}
	m.act.touch(rec.ID, time.Now())
	return b.Agent(), &rec.Sandbox, nil
}

func (m *Manager) box(id string) isolate.Box {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.boxes[id]
}

// running is the boxes of the running sandboxes, as of now.
func (m *Manager) running() map[string]isolate.Box {
	m.mu.Lock()
	defer m.mu.Unlock()
	boxes := make(map[string]isolate.Box, len(m.boxes))
	for id, b := range m.boxes {
		boxes[id] = b
	}
	return boxes
}

func (m *Manager) limits(l api.Limits) api.Limits {
	if l.CPUs == 0 {
		l.CPUs = m.cfg.Defaults.CPUs
	}
	if l.Memory == 0 {
		l.Memory = m.cfg.Defaults.Memory
	}
	if l.Pids == 0 {
		l.Pids = m.cfg.Defaults.Pids
	}
	if l.Disk == 0 {
		l.Disk = m.defaultDisk()
	}
	return l
}

// defaultDisk is the disk quota of a sandbox or volume that asks for none:
// the configured default where the storage has quotas, else none.
func (m *Manager) defaultDisk() api.Size {
	if !m.cfg.Storage.Quotas() {
		return 0
	}
	return m.cfg.Defaults.Disk
}

// room refuses new sandboxes, forks and volumes while den's storage, or the
// host filesystem under it, is too full for them.
func (m *Manager) room() error {
	if err := m.cfg.Storage.Room(); err != nil {
		return api.Errorf(api.KindConflict, "%v: remove sandboxes, snapshots, volumes or images to make room (den rm, den snapshot rm, den volume rm, den image prune)", err)
	}
	return nil
}

// applyRequest fills rec from a create request.
func (m *Manager) applyRequest(rec *record, req *api.CreateRequest, owner string) {
	now := time.Now().UTC()
	rec.Owner = owner
	rec.Name, rec.Labels, rec.Env, rec.Workdir, rec.User = req.Name, req.Labels, req.Env, req.Workdir, req.User
	rec.Limits, rec.TTL, rec.CreatedAt = m.limits(req.Limits), req.TTL, now
	rec.IdleTimeout, rec.IdleAction = req.IdleTimeout, req.IdleAction
	rec.Volumes, rec.Mounts, rec.ShmSize = req.Volumes, req.Mounts, req.ShmSize
	rec.StopSignal, rec.StopTimeout = req.StopSignal, req.StopTimeout
	rec.Network = api.NetworkPolicy{Mode: api.NetNone}
	if req.Network != nil {
		rec.Network = *req.Network
		if rec.Network.Mode == "" {
			rec.Network.Mode = api.NetNone
		}
	}
	rec.Hostname = rec.Name
	if rec.Hostname == "" {
		rec.Hostname = rec.ID[:12]
	}
	rec.ExpiresAt = time.Time{}
	if req.TTL > 0 {
		rec.ExpiresAt = now.Add(req.TTL.D())
	}
}

// teardown stops a box (if any), removes its storage and frees its id range.
func (m *Manager) teardown(rec *record, b isolate.Box) {
	isolate.TestStall("teardown", rec.ID)
	ctx := context.Background()
	if b != nil {
		b.Stop(ctx)
	}
	dir := filepath.Join(m.sandboxesDir(), rec.ID)
	if _, err := m.cleanBox(ctx, rec); err != nil {
		m.log.Warn("remove sandbox", "id", rec.ID, "err", err)
	}
	storage.RemoveTree(m.checkpointDir(rec.ID))
	if err := m.deleteTree(dir); err != nil {
		m.log.Warn("remove sandbox storage", "id", rec.ID, "err", err)
	}
	m.db.DeleteSandbox(ctx, rec.ID)
	m.net.free(slotOf(rec.UIDBase))
}

// teardownAsync runs teardown off the request path.
func (m *Manager) teardownAsync(rec *record, b isolate.Box) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.teardown(rec, b)
	}()
}

// stopIdle stops running sandboxes idle past their idle timeout. A
// sandbox's clock starts when it starts; an exec in flight keeps it busy.
func (m *Manager) stopIdle(now time.Time) {
	for id := range m.running() {
		rec, err := m.get(context.Background(), id)
		if err != nil || rec.IdleTimeout <= 0 || rec.State != api.StateRunning {
			continue
		}
		last, busy := m.act.state(id)
		if last.Before(rec.StartedAt) {
			last = rec.StartedAt
		}
		if busy || now.Sub(last) < rec.IdleTimeout.D() {
			continue
		}
		// Each idle action runs on its own: a graceful stop waits up to
		// the sandbox's stop timeout, which must not hold up the others.
		if !m.idling.add(id) {
			continue
		}
		m.wg.Add(1) // inside expireLoop's own count: Close waits for it
		go func(rec *record, idle time.Duration) {
			defer m.wg.Done()
			defer m.idling.remove(id)
			var err error
			switch rec.IdleAction {
			case api.IdlePause:
				_, err = m.Pause(context.Background(), id)
			case api.IdleHibernate:
				_, err = m.Hibernate(context.Background(), id)
			default:
				_, err = m.Stop(context.Background(), id)
			}
			if err != nil {
				m.log.Warn("idle timeout", "id", id, "action", rec.IdleAction, "err", err)
				return
			}
			m.event(id, "sandbox.idle", map[string]any{"idle": idle.Round(time.Second).String(), "action": cmp.Or(rec.IdleAction, api.IdleStop)})
		}(rec, now.Sub(last))
	}
}

// hold marks a sandbox busy for the life of a long request (an exec, a
// followed log) so the idle timeout does not stop it underneath.
func (m *Manager) hold(id string) func() { return m.act.hold(id) }
