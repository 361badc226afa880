package sandbox

import (
	"strings"
	"sync"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/egress"
)

// denialWatches collects, for each foreground exec running, the egress
// denials of its sandbox while it runs, to tell the caller which of its
// connections were refused (api.ExitStatus.Denied).
type denialWatches struct {
	mu   sync.Mutex
	w    map[*denialWatch]struct{}
	sync func() // flushes the egress event queue (SetNetSync); nil: none
}

// denialWatch is one exec's.
type denialWatch struct {
	sandbox string
	start   time.Time
	evs     []egress.Event // guarded by denialWatches.mu; at most maxWatchEvents
}

// maxWatchEvents bounds the denials kept for one exec.
const maxWatchEvents = 4096

// SetNetSync gives the manager the egress server's Sync: an exec that ends
// waits (briefly) for the denials its command saw to reach NetEvent.
func (m *Manager) SetNetSync(sync func()) {
	m.denials.mu.Lock()
	m.denials.sync = sync
	m.denials.mu.Unlock()
}

// watchDenials starts collecting sandbox id's denials from now on.
func (m *Manager) watchDenials(id string) *denialWatch {
	w := &denialWatch{sandbox: id, start: time.Now()}
	d := &m.denials
	d.mu.Lock()
	if d.w == nil {
		d.w = map[*denialWatch]struct{}{}
	}
	d.w[w] = struct{}{}
	d.mu.Unlock()
	return w
}

// noteDenial hands a denied egress event to the watches of its sandbox.
func (m *Manager) noteDenial(ev egress.Event) {
	d := &m.denials
	d.mu.Lock()
	defer d.mu.Unlock()
	for w := range d.w {
		if w.sandbox != ev.Sandbox || ev.Time.Before(w.start) {
			continue
		}
		if len(w.evs) < maxWatchEvents {
			w.evs = append(w.evs, ev)
		}
	}
}

// endDenials stops w, the watch of the exec of agent process proc ("" when
// the agent named none, as for a session's command) that ended at end, and
// returns its command's denials, grouped by destination, protocol and rule
// in the order they came. The egress queue is flushed first: a denial is
// queued before its refusal is sent, so every refusal the command saw is
// in.
//
// Which denials are the command's: those of its sandbox between its start
// and end whose process (the egress attribution, which names the agent
// process leading the socket's process group: "p12 (curl …)") is proc.
// A denial attributed to another agent process (a concurrent exec, a
// background process) is not; one den could not attribute (process
// unknown: the gvisor and microvm tiers, rationed lookups) or attributed
// only to a pid outside every agent process group (a daemonized child)
// counts by the time window alone.
func (m *Manager) endDenials(w *denialWatch, proc string, end time.Time) []api.DeniedConn {
	d := &m.denials
	d.mu.Lock()
	sync := d.sync
	d.mu.Unlock()
	if sync != nil {
		sync()
	}
	return groupDenials(m.stopDenials(w), proc, end)
}

// stopDenials ends w (again: no matter) and returns what it collected.
func (m *Manager) stopDenials(w *denialWatch) []egress.Event {
	d := &m.denials
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.w, w)
	return w.evs
}

// groupDenials is endDenials' selection and grouping.
func groupDenials(evs []egress.Event, proc string, end time.Time) []api.DeniedConn {
	var out []api.DeniedConn
	at := map[api.DeniedConn]int{} // key (Reason and Count zero) → index in out
	for _, ev := range evs {
		if ev.Time.After(end) || !processIs(ev.Process, proc) {
			continue
		}
		k := api.DeniedConn{Host: ev.Name, Port: ev.Port, Proto: "tcp", Rule: ev.Rule}
		if k.Host == "" {
			k.Host = ev.Addr
		}
		if ev.Kind == egress.KindDNS {
			k.Proto, k.Port = "dns", 53
		}
		if k.Rule == "" {
			k.Rule = egress.Rule(ev.Reason)
		}
		if i, ok := at[k]; ok {
			out[i].Count++
			continue
		}
		if len(out) == api.MaxDenied {
			continue
		}
		at[k] = len(out)
		k.Reason, k.Count = ev.Reason, 1
		out = append(out, k)
	}
	return out
}

// processIs reports whether an event's process (egress attribution) may
// be agent process proc: it is, or den cannot tell (see endDenials).
func processIs(process, proc string) bool {
	if proc == "" || process == "" || strings.HasPrefix(process, proc+" (") {
		return true
	}
	id, _, ok := strings.Cut(process, " (")
	return !ok || !agent.IsProcID(id)
}
