package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"sync"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/egress"
	"github.com/den-dev/den/internal/isolate"
)

// Egress wiring: where den's proxy and DNS listen, as seen from sandboxes.
type Egress struct {
	Gateway   netip.Addr // the bridge address
	HTTPProxy int        // port of the explicit proxy, for HTTP(S)_PROXY
	// AddrSlot maps a sandbox's source address back to its slot, and
	// SlotAddr a slot to its address.
	AddrSlot func(netip.Addr) (int, bool)
	SlotAddr func(int) (netip.Addr, error)
}

// toPolicy converts and validates an API policy; secret references are
// left unexpanded (policyFor expands them).
func toPolicy(p api.NetworkPolicy) (egress.Policy, error) {
	if p.ConnRate < 0 || p.MaxEgress < 0 || p.Bandwidth < 0 {
		return egress.Policy{}, api.FieldError("network", "limits must not be negative")
	}
	if p.Bandwidth > 0 && p.Bandwidth < 8<<10 {
		return egress.Policy{}, api.FieldError("network.bandwidth", "%s is below the minimum of 8k bytes/second", p.Bandwidth)
	}
	out := egress.Policy{Mode: egress.Mode(p.Mode), Allow: p.Allow, Deny: p.Deny, ConnRate: p.ConnRate, MaxEgressBytes: int64(p.MaxEgress)}
	for _, sh := range p.SecretHeaders {
		out.Secrets = append(out.Secrets, egress.SecretHeader{Host: sh.Host, Header: sh.Header, Value: sh.Value}) // the template; policyFor expands it
	}
	if out.Mode == "" {
		out.Mode = egress.Mode(api.NetNone)
	}
	for _, c := range p.AllowCIDR {
		pr, err := netip.ParsePrefix(c)
		if err != nil {
			a, aerr := netip.ParseAddr(c)
			if aerr != nil {
				return out, api.FieldError("network.allow_cidr", "%q is not a CIDR like 203.0.113.0/24", c)
			}
			pr = netip.PrefixFrom(a, a.BitLen())
		}
		out.AllowCIDR = append(out.AllowCIDR, pr.Masked())
	}
	if err := out.Validate(); err != nil {
		return out, api.FieldError("network", "%v", err)
	}
	return out, nil
}

// netTable is which sandbox holds each id-range slot (its host uid range,
// and its bridge address where it is networked) and the egress policy,
// secrets expanded, of each networked sandbox: what the egress proxy and
// DNS look up for every connection and query (SandboxForAddr).
type netTable struct {
	// mu guards slots and pol; lookup reads both in one hold, so a
	// connection never pairs a slot's new sandbox with the old one's policy.
	mu    sync.Mutex
	slots map[int]string           // slot → sandbox id
	pol   map[string]egress.Policy // sandbox id → its policy (networked ones only)
}

// alloc gives id the lowest free slot of maxSlots.
func (t *netTable) alloc(id string) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := 0; i < maxSlots; i++ {
		if _, used := t.slots[i]; !used {
			t.setSlotLocked(i, id)
			return i, nil
		}
	}
	return 0, api.Errorf(api.KindConflict, "all %d id ranges are in use: remove sandboxes", maxSlots)
}

// take records that id holds slot (a sandbox found at start-up).
func (t *netTable) take(slot int, id string) {
	t.mu.Lock()
	t.setSlotLocked(slot, id)
	t.mu.Unlock()
}

func (t *netTable) setSlotLocked(slot int, id string) {
	if t.slots == nil {
		t.slots = map[int]string{}
	}
	t.slots[slot] = id
}

// free gives slot back.
func (t *netTable) free(slot int) {
	t.mu.Lock()
	delete(t.slots, slot)
	t.mu.Unlock()
}

// setPolicy makes pol id's policy; drop forgets it (id is not networked).
func (t *netTable) setPolicy(id string, pol egress.Policy) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pol == nil {
		t.pol = map[string]egress.Policy{}
	}
	t.pol[id] = pol
}

func (t *netTable) drop(id string) {
	t.mu.Lock()
	delete(t.pol, id)
	t.mu.Unlock()
}

// lookup is the sandbox holding slot and its policy; ok is false when no
// sandbox holds it or that sandbox is not networked.
func (t *netTable) lookup(slot int) (id string, pol egress.Policy, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok = t.slots[slot]
	if !ok {
		return "", egress.Policy{}, false
	}
	pol, ok = t.pol[id]
	return id, pol, ok
}

// networkedIDs are the sandboxes with a policy.
func (t *netTable) networkedIDs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := make([]string, 0, len(t.pol))
	for id := range t.pol {
		ids = append(ids, id)
	}
	return ids
}

// slotOf is the id-range slot of a sandbox whose uids start at uidBase.
func slotOf(uidBase int) int { return (uidBase - uidStart) / 65536 }

func networked(p api.NetworkPolicy) bool { return p.Mode == api.NetAllow || p.Mode == api.NetOpen }

// SandboxForAddr is the egress servers' view of who is connecting: the
// sandbox holding that bridge address, and its current policy.
func (m *Manager) SandboxForAddr(src netip.Addr) (string, egress.Policy, bool) {
	if m.cfg.Egress == nil {
		return "", egress.Policy{}, false
	}
	slot, ok := m.cfg.Egress.AddrSlot(src)
	if !ok {
		return "", egress.Policy{}, false
	}
	return m.net.lookup(slot)
}

// NetEvent records one egress event in the event log.
func (m *Manager) NetEvent(ev egress.Event) {
	m.event(ev.Sandbox, "net."+ev.Kind, ev)
	if ev.Verdict == egress.VerdictDeny {
		m.noteDenial(ev)
	}
}

// policyFor is the proxy's policy for a sandbox: secrets expanded.
func (m *Manager) policyFor(ctx context.Context, owner string, p api.NetworkPolicy) (egress.Policy, error) {
	pol, err := toPolicy(p)
	if err != nil {
		return pol, err
	}
	for i, sh := range p.SecretHeaders {
		v, err := m.expandSecret(ctx, owner, sh.Value)
		if err != nil {
			return pol, err
		}
		pol.Secrets[i].Value = v
	}
	return pol, nil
}

// checkNetwork checks a policy a new sandbox (or a build's RUN steps) is
// to have: valid, and networked only where the daemon has networking.
func (m *Manager) checkNetwork(ctx context.Context, owner string, p api.NetworkPolicy) error {
	if _, err := m.policyFor(ctx, owner, p); err != nil {
		return err
	}
	if networked(p) && m.cfg.Egress == nil {
		return api.Errorf(api.KindUnsupported, "this daemon runs without sandbox networking: network mode %q is not available", p.Mode)
	}
	return nil
}

func (m *Manager) setNetPolicy(id, owner string, p api.NetworkPolicy) {
	pol, err := m.policyFor(context.Background(), owner, p)
	if err != nil || !networked(p) {
		m.net.drop(id)
		return
	}
	m.net.setPolicy(id, pol)
}

// proxyEnv is the environment that points proxy-aware tools at den.
func (m *Manager) proxyEnv(p api.NetworkPolicy) []string {
	if !networked(p) || m.cfg.Egress == nil {
		return nil
	}
	u := "http://" + netip.AddrPortFrom(m.cfg.Egress.Gateway, uint16(m.cfg.Egress.HTTPProxy)).String()
	return append([]string{"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "http_proxy=" + u, "https_proxy=" + u, "NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1"}, caEnv(p)...)
}

// allowUDP gives the box's UDP rules the policy's allow_cidr prefixes.
func allowUDP(b isolate.Box, p api.NetworkPolicy) error {
	u, ok := b.(isolate.UDPAllower)
	if !ok {
		return nil // UDP stays dropped
	}
	var cidrs []netip.Prefix
	if networked(p) {
		pol, err := toPolicy(p)
		if err != nil {
			return err
		}
		cidrs = pol.AllowCIDR
	}
	if err := u.AllowUDP(cidrs); err != nil {
		return fmt.Errorf("sandbox UDP rules: %w", err)
	}
	return nil
}

// netReady points the sandbox's resolver at den's DNS (queries to any
// address are redirected there anyway; a loopback resolver would not be)
// and lets its UDP out to its allow_cidr prefixes.
func (m *Manager) netReady(ctx context.Context, id string, p api.NetworkPolicy, b isolate.Box) error {
	if m.cfg.Egress == nil {
		return nil
	}
	if err := allowUDP(b, p); err != nil {
		return err
	}
	if len(p.SecretHeaders) > 0 {
		if err := m.installCA(ctx, id, b); err != nil {
			return fmt.Errorf("install the sandbox's CA: %w", err)
		}
	}
	conf := "nameserver " + m.cfg.Egress.Gateway.String() + "\noptions timeout:2 attempts:2\n"
	resp, err := b.Agent().Do(ctx, "PUT", agent.PathFiles, map[string][]string{"path": {"/etc/resolv.conf"}, "mode": {"0644"}}, bytes.NewReader([]byte(conf)), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// SetNetwork changes a sandbox's egress policy, live.
func (m *Manager) SetNetwork(ctx context.Context, id string, p api.NetworkPolicy) (*api.Sandbox, error) {
	rec, err := m.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := m.checkNetwork(ctx, rec.Owner, p); err != nil {
		return nil, err
	}
	if p.Mode == "" {
		p.Mode = api.NetNone
	}
	unlock := m.lock(rec.ID)
	defer unlock()
	if rec, err = m.get(ctx, rec.ID); err != nil {
		return nil, err
	}
	was := networked(rec.Network)
	rec.Network = p
	m.setNetPolicy(rec.ID, rec.Owner, p)
	if b := m.box(rec.ID); b != nil && was != networked(p) {
		nw, ok := b.(isolate.Networker)
		if !ok {
			return nil, api.Errorf(api.KindUnsupported, "the %s runtime cannot change a running sandbox's network: stop it, change the policy, start it", rec.Runtime)
		}
		if networked(p) {
			addr, err := nw.AttachNet()
			if err != nil {
				return nil, err
			}
			rec.Address = addr
			if err := m.netReady(ctx, rec.ID, p, b); err != nil {
				return nil, err
			}
		} else {
			if err := nw.DetachNet(); err != nil {
				return nil, err
			}
			rec.Address = ""
		}
	}
	if b := m.box(rec.ID); b != nil && networked(p) {
		nw, ok := b.(isolate.Networker)
		if ok && was {
			if err := nw.SetBandwidth(int64(p.Bandwidth)); err != nil {
				return nil, err
			}
			if err := allowUDP(b, p); err != nil {
				return nil, err
			}
			if len(p.SecretHeaders) > 0 {
				if err := m.installCA(ctx, rec.ID, b); err != nil {
					return nil, err
				}
			}
		} else if ok && p.Bandwidth > 0 {
			if err := nw.SetBandwidth(int64(p.Bandwidth)); err != nil {
				return nil, err
			}
		}
	}
	if err := m.put(ctx, rec); err != nil {
		return nil, err
	}
	m.event(rec.ID, "sandbox.network", map[string]any{"mode": p.Mode, "allow": p.Allow, "deny": p.Deny, "allow_cidr": p.AllowCIDR})
	return &rec.Sandbox, nil
}
