package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"sort"
	"strconv"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/isolate"
)

// share is a port opened to den's reverse proxy.
type share struct {
	Port   int    `json:"port"`
	Public bool   `json:"public,omitempty"`
	Token  string `json:"token,omitempty"`
	// KeepsPrefix: the server wants /preview/ID/PORT/ in the request path
	// (it was started with that base, see PreviewKeepsPrefix).
	KeepsPrefix bool `json:"keeps_prefix,omitempty"`
}

func (m *Manager) previewOf(id string, s share) *api.Preview {
	p := &api.Preview{Port: s.Port, Public: s.Public, Token: s.Token,
		Path: "/preview/" + id + "/" + strconv.Itoa(s.Port) + "/"}
	if m.cfg.PreviewDomain != "" {
		p.Host = strconv.Itoa(s.Port) + "-" + id + "." + m.cfg.PreviewDomain
	}
	return p
}

func validPort(p int) error {
	if p < 1 || p > 65535 {
		return api.FieldError("port", "%d is not a TCP port (1-65535)", p)
	}
	return nil
}

// SharePort opens a port of a sandbox to den's reverse proxy, private
// (with a token) unless public. Sharing a private port again keeps its
// token unless req.Rotate.
func (m *Manager) SharePort(ctx context.Context, id string, req api.PortRequest) (*api.Preview, error) {
	if err := validPort(req.Port); err != nil {
		return nil, err
	}
	rec, err := m.get(ctx, id)
	if err != nil {
		return nil, err
	}
	unlock := m.lock(rec.ID)
	defer unlock()
	if rec, err = m.get(ctx, rec.ID); err != nil {
		return nil, err
	}
	s := share{Port: req.Port, Public: req.Public}
	for _, o := range rec.Ports {
		if o.Port == req.Port && !req.Public && !req.Rotate {
			s.Token = o.Token
		}
	}
	if !req.Public && s.Token == "" {
		var b [24]byte
		rand.Read(b[:])
		s.Token = hex.EncodeToString(b[:])
	}
	rec.Ports = append(withoutPort(rec.Ports, req.Port), s)
	sort.Slice(rec.Ports, func(i, j int) bool { return rec.Ports[i].Port < rec.Ports[j].Port })
	if err := m.put(ctx, rec); err != nil {
		return nil, err
	}
	m.event(rec.ID, "port.share", map[string]any{"port": s.Port, "public": s.Public, "rotate": req.Rotate})
	return m.previewOf(rec.ID, s), nil
}

// Ports lists a sandbox's shared ports.
func (m *Manager) Ports(ctx context.Context, id string) ([]*api.Preview, error) {
	rec, err := m.get(ctx, id)
	if err != nil {
		return nil, err
	}
	out := []*api.Preview{}
	for _, s := range rec.Ports {
		out = append(out, m.previewOf(rec.ID, s))
	}
	return out, nil
}

// UnsharePort closes a shared port.
func (m *Manager) UnsharePort(ctx context.Context, id string, port int) error {
	rec, err := m.get(ctx, id)
	if err != nil {
		return err
	}
	unlock := m.lock(rec.ID)
	defer unlock()
	if rec, err = m.get(ctx, rec.ID); err != nil {
		return err
	}
	kept := withoutPort(rec.Ports, port)
	if len(kept) == len(rec.Ports) {
		return api.Errorf(api.KindNotFound, "port %d of sandbox %s is not shared", port, rec.ID[:12])
	}
	rec.Ports = kept
	return m.put(ctx, rec)
}

// ErrNoPreview is the one answer to a preview request that may not pass,
// whatever the reason: no such sandbox, a name or an id prefix instead of
// the full id, the port not shared, a private port without its token or
// with a wrong one. So the preview route, which anyone can reach, tells
// nothing about which sandboxes, names or ports exist.
var ErrNoPreview = api.Errorf(api.KindNotFound, "no preview here: a preview URL is /preview/ID/PORT/ with the sandbox's full id, and a private one needs its token (?den_token=, from den port ls ID)")

// dummyToken is compared against when there is no token to compare with,
// so a refusal costs about what a wrong token does.
var dummyToken = make([]byte, 48)

// PreviewAllowed reports whether a request for a shared port may pass:
// id is a sandbox's full id (names and prefixes are not resolved here,
// before any authorization), the port is shared, and public or the token
// matches. Every refusal is ErrNoPreview. keepsPrefix says whether path
// previews of the port pass /preview/ID/PORT/ on unstripped.
func (m *Manager) PreviewAllowed(ctx context.Context, id string, port int, token string) (sid string, keepsPrefix bool, err error) {
	var rec *record
	if isFullID(id) && validPort(port) == nil {
		if r, err := m.get(WithScope(ctx, nil), id); err == nil && r.ID == id {
			rec = r
		}
	}
	want, public := dummyToken, false
	if rec != nil {
		for _, s := range rec.Ports {
			if s.Port == port {
				want, public, keepsPrefix = []byte(s.Token), s.Public, s.KeepsPrefix
			}
		}
	}
	match := subtle.ConstantTimeCompare([]byte(token), want) == 1
	if rec == nil || !public && (!match || token == "") {
		return "", false, ErrNoPreview
	}
	return rec.ID, keepsPrefix, nil
}

// PreviewKeepsPrefix records that the server on a shared port of sandbox
// sid (a full id PreviewAllowed returned) serves under /preview/ID/PORT/
// itself: it answered a request stripped of that prefix with a redirect to
// the very path the browser asked for. Path previews of the port then keep
// the prefix, until the port is shared again.
func (m *Manager) PreviewKeepsPrefix(ctx context.Context, sid string, port int) error {
	unlock := m.lock(sid)
	defer unlock()
	rec, err := m.get(WithScope(ctx, nil), sid)
	if err != nil {
		return err
	}
	for i := range rec.Ports {
		if rec.Ports[i].Port == port && !rec.Ports[i].KeepsPrefix {
			rec.Ports[i].KeepsPrefix = true
			m.event(rec.ID, "port.keeps_prefix", map[string]any{"port": port})
			return m.put(ctx, rec)
		}
	}
	return nil
}

// isFullID reports whether s is a whole sandbox id (32 lower-case hex digits).
func isFullID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// DialPort connects to a port inside a running sandbox (its loopback).
func (m *Manager) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if err := validPort(port); err != nil {
		return nil, err
	}
	ag, sb, err := m.Agent(ctx, id)
	if err != nil {
		return nil, err
	}
	var c net.Conn
	if d, ok := m.box(sb.ID).(isolate.Dialer); ok {
		c, err = d.DialInside(ctx, port)
	} else {
		// Tiers whose loopback the daemon cannot reach: through the agent.
		c, err = ag.DialPort(ctx, port)
	}
	if err != nil {
		return nil, api.Errorf(api.KindConflict, "nothing answers on port %d in sandbox %s: %v", port, sb.ID[:12], err)
	}
	return c, nil
}

func withoutPort(shares []share, port int) []share {
	var kept []share
	for _, o := range shares {
		if o.Port != port {
			kept = append(kept, o)
		}
	}
	return kept
}
