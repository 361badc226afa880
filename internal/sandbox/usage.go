package sandbox

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/isolate"
)

// UsageInterval is how often running sandboxes are sampled for usage
// totals and metrics: rare enough that hundreds of sandboxes cost little.
var UsageInterval = 5 * time.Second

// meter is the running accounting of one sandbox.
type meter struct {
	total   api.Usage
	last    isolate.Stats // the previous sample
	sampled time.Time
	dirty   int // samples since the total was last saved
}

// meterSet is the usage accounting of the running sandboxes.
type meterSet struct {
	// mu guards m and every meter in it.
	mu sync.Mutex
	m  map[string]*meter
}

// start begins accounting for id from total, its counters read first at
// sampled (zero: at the first sample), unless it is accounted already.
func (ms *meterSet) start(id string, total api.Usage, sampled time.Time) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.m == nil {
		ms.m = map[string]*meter{}
	}
	if ms.m[id] == nil {
		ms.m[id] = &meter{total: total, sampled: sampled}
	}
}

// drop ends id's accounting.
func (ms *meterSet) drop(id string) {
	ms.mu.Lock()
	delete(ms.m, id)
	ms.mu.Unlock()
}

// fold adds one reading s of id at now to its totals: the time since the
// last reading is alive time, and active time too if the sandbox was busy
// or used (lastSeen) since. It reports whether the totals are due to be
// saved (every sixth reading); false if id is not accounted.
func (ms *meterSet) fold(id string, s isolate.Stats, now, lastSeen time.Time, busy bool) bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	mt := ms.m[id]
	if mt == nil {
		return false
	}
	if !mt.sampled.IsZero() {
		dt := now.Sub(mt.sampled).Seconds()
		cpu := s.CPU - mt.last.CPU
		if cpu < 0 { // counters restarted with the box
			cpu = s.CPU
		}
		tx := s.NetTxBytes - mt.last.NetTxBytes
		if tx < 0 {
			tx = s.NetTxBytes
		}
		mt.total.CPUSeconds += cpu.Seconds()
		mt.total.MemoryGiBHours += float64(s.Memory) / (1 << 30) * dt / 3600
		mt.total.AliveSeconds += dt
		if busy || lastSeen.After(mt.sampled) {
			mt.total.ActiveSeconds += dt
		}
		mt.total.EgressBytes += tx
	}
	mt.last, mt.sampled = s, now
	mt.dirty++
	return mt.dirty >= 6
}

// total is id's totals, which are now saved (the count of readings since
// the last save starts again); ok is false if id is not accounted.
func (ms *meterSet) total(id string) (api.Usage, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if mt := ms.m[id]; mt != nil {
		mt.dirty = 0
		return mt.total, true
	}
	return api.Usage{}, false
}

// copy is every meter as of now.
func (ms *meterSet) copy() map[string]meter {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	out := make(map[string]meter, len(ms.m))
	for id, mt := range ms.m {
		out[id] = *mt
	}
	return out
}

// sampleUsage adds the time since the last sample to every running
// sandbox's totals, and saves them now and then.
func (m *Manager) sampleUsage(now time.Time) {
	for id, b := range m.running() {
		if m.sample(id, b, now) {
			m.saveUsage(id)
		}
	}
}

// sampleOne takes a last sample of a sandbox that is stopping.
func (m *Manager) sampleOne(id string, b isolate.Box) {
	if b != nil {
		m.sample(id, b, time.Now())
	}
}

// sample folds one reading into a sandbox's totals; it reports whether
// the totals are due to be saved.
func (m *Manager) sample(id string, b isolate.Box, now time.Time) bool {
	st, ok := b.(isolate.Statser)
	if !ok {
		return false
	}
	s, err := st.Stats()
	if err != nil {
		return false
	}
	last, busy := m.act.state(id)
	return m.meters.fold(id, s, now, last, busy)
}

// saveUsage writes a sandbox's totals to its record.
func (m *Manager) saveUsage(id string) {
	unlock := m.lock(id)
	defer unlock()
	if rec, err := m.get(context.Background(), id); err == nil {
		m.put(context.Background(), rec) // put stamps the current totals
	}
}

// usageOf returns the current totals of a sandbox (for put and for stats).
func (m *Manager) usageOf(id string) (api.Usage, bool) { return m.meters.total(id) }

// startMeter begins accounting for a sandbox that just booted: its
// counters start at zero now.
func (m *Manager) startMeter(rec *record) { m.meters.start(rec.ID, rec.Usage, time.Now()) }

// Stats reports a running or paused sandbox's live use, limits and
// totals; it wakes no sandbox (a paused one's frozen processes still hold
// their memory, which is what it reports).
func (m *Manager) Stats(ctx context.Context, id string) (*api.Stats, error) {
	rec, err := m.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.State == api.StateHibernated {
		return nil, asleep(rec)
	}
	sb := &rec.Sandbox
	b := m.box(sb.ID)
	if b == nil {
		return nil, notRunning(sb)
	}
	st, ok := b.(isolate.Statser)
	if !ok {
		return nil, api.Errorf(api.KindUnsupported, "the %s runtime does not report usage", sb.Runtime)
	}
	s, err := st.Stats()
	if err != nil {
		return nil, err
	}
	m.sample(sb.ID, b, time.Now()) // bring the totals up to this moment
	out := &api.Stats{
		ID: sb.ID, CPU: api.Duration(s.CPU), Memory: api.Size(s.Memory), MemoryLimit: sb.Limits.Memory,
		Pids: s.Pids, PidsLimit: sb.Limits.Pids, NetRxBytes: s.NetRxBytes, NetTxBytes: s.NetTxBytes,
		Disk: api.Size(m.diskUsed(filepath.Join(m.sandboxesDir(), sb.ID))),
	}
	out.Usage, _ = m.usageOf(sb.ID)
	return out, nil
}

func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// Metrics writes Prometheus text-format metrics from the latest samples.
func (m *Manager) Metrics(ctx context.Context, w *strings.Builder) {
	all, _ := m.db.ListSandboxes(ctx, nil)
	states := map[string]int{}
	names := map[string]string{}
	for _, s := range all {
		if s.State != stateWarm {
			states[s.State]++
			names[s.ID] = s.Name
		}
	}
	fmt.Fprintf(w, "# HELP den_sandboxes Sandboxes by state.\n# TYPE den_sandboxes gauge\n")
	for _, st := range api.States {
		fmt.Fprintf(w, "den_sandboxes{state=%q} %d\n", st, states[st])
	}
	fmt.Fprintf(w, "# HELP den_warm_pool Booted sandboxes waiting to be claimed.\n# TYPE den_warm_pool gauge\nden_warm_pool %d\n", len(m.pool))
	meters := m.meters.copy()
	ids := make([]string, 0, len(meters))
	for id := range meters {
		if _, ok := names[id]; ok {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	type row struct {
		name, help, typ string
		val             func(meter) float64
	}
	rows := []row{
		{"den_sandbox_cpu_seconds_total", "CPU seconds used over the sandbox's life.", "counter", func(mt meter) float64 { return mt.total.CPUSeconds }},
		{"den_sandbox_memory_gib_hours_total", "Memory held over time, GiB-hours.", "counter", func(mt meter) float64 { return mt.total.MemoryGiBHours }},
		{"den_sandbox_alive_seconds_total", "Seconds running.", "counter", func(mt meter) float64 { return mt.total.AliveSeconds }},
		{"den_sandbox_active_seconds_total", "Seconds with API activity.", "counter", func(mt meter) float64 { return mt.total.ActiveSeconds }},
		{"den_sandbox_egress_bytes_total", "Bytes sent off the sandbox.", "counter", func(mt meter) float64 { return float64(mt.total.EgressBytes) }},
		{"den_sandbox_memory_bytes", "Memory in use at the last sample.", "gauge", func(mt meter) float64 { return float64(mt.last.Memory) }},
		{"den_sandbox_pids", "Processes and threads at the last sample.", "gauge", func(mt meter) float64 { return float64(mt.last.Pids) }},
	}
	for _, r := range rows {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", r.name, r.help, r.name, r.typ)
		for _, id := range ids {
			fmt.Fprintf(w, "%s{id=%q,name=%q} %g\n", r.name, id, names[id], r.val(meters[id]))
		}
	}
}
