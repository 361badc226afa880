// Package egress enforces a sandbox's network egress policy on the host:
// a DNS server that answers A and AAAA queries only for names the sandbox's
// Policy allows (and only with addresses the policy allows, refusing every
// other query type, which stops DNS tunnelling), a transparent proxy for the
// TCP connections nftables redirects from a sandbox's network namespace,
// which reads the TLS SNI or HTTP Host without consuming it, resolves the
// name itself and dials only an address it has checked (defeating DNS
// rebinding, spoofed SNI, IP literals in odd encodings and raw connections
// to private, host or metadata addresses), and an explicit HTTP proxy
// (CONNECT and absolute-URI requests) that applies the same checks; every
// DNS query and every connection, allowed or denied, is reported as an Event
// with its sandbox, name, address, byte counts and reason (and, with
// Config.Attribute, the process behind it), and connections are bounded per
// sandbox in number, rate and total bytes sent. A policy's secret headers
// are set on the sandbox's HTTPS requests to their hosts by terminating
// TLS with a certificate from the sandbox's own CA, so the secrets never
// enter the sandbox.
package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// Config configures a Server. Only Sandbox is required.
type Config struct {
	// Sandbox maps a connection's source address (the sandbox's veth
	// address) to the sandbox's id and current policy; ok=false → deny
	// ("unknown source"). Called once per DNS query and per connection, so
	// policy changes apply to the next one.
	Sandbox func(src netip.Addr) (id string, p Policy, ok bool)
	// Resolve looks a name up upstream (default: net.DefaultResolver
	// LookupNetIP "ip" of the fully qualified name). Tests inject a fake.
	Resolve func(ctx context.Context, name string) ([]netip.Addr, error)
	// Dial opens the upstream connection (default net.Dialer). Tests may
	// inject.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Public, TEST ONLY: prefixes treated as public although they are in a
	// blocked range (tests stand in for the internet with servers on such
	// addresses).
	Public []netip.Prefix
	// Deny lists prefixes never reachable, whatever the policy, AllowCIDR
	// or Public say: the bridge subnet, the daemon's own addresses. The
	// host's interface addresses are always denied, without listing them.
	Deny []netip.Prefix
	// Log is the audit sink, called for every DNS query and every
	// connection (allowed or denied) from one goroutine, in order. Events
	// are queued; when Log falls behind by thousands of events, new ones
	// are dropped (see DroppedEvents) rather than stall the data path.
	Log func(Event)
	// OriginalDst returns where a redirected connection was going.
	// Default: getsockopt SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST on the
	// accepted socket.
	OriginalDst func(c net.Conn) (netip.AddrPort, error)

	// MaxConnsPerSandbox bounds a sandbox's concurrent proxied connections
	// (transparent and explicit together); default 512.
	MaxConnsPerSandbox int
	// ConnRate bounds a sandbox's new connections per second (token bucket,
	// burst max(1, ConnRate)); 0 = unlimited. A Policy.ConnRate > 0
	// overrides it for its sandbox.
	ConnRate float64
	// PeekTimeout bounds reading a TLS ClientHello, an HTTP request head
	// or, in the explicit proxy, a request head; default 5 s.
	PeekTimeout time.Duration
	// ServerFirstWait is how long the transparent proxy waits for a
	// client's first bytes when the destination address is allowed
	// without a name, before treating the connection as a protocol where
	// the server speaks first; default 1 s. When the address needs a name,
	// the proxy waits PeekTimeout.
	ServerFirstWait time.Duration
	// DialTimeout bounds connecting upstream; default 10 s.
	DialTimeout time.Duration
	// ResolveTimeout bounds one upstream lookup; default 5 s.
	ResolveTimeout time.Duration
	// IdleTimeout closes a relayed connection that moved no byte in either
	// direction for this long; 0 (default) = never. The explicit proxy
	// waits at most max(IdleTimeout, 60 s) for a keep-alive request.
	IdleTimeout time.Duration
	// MaxNameLen bounds the names the DNS server answers; default 253.
	MaxNameLen int

	// CA returns the sandbox's own certificate authority (certificate and
	// private key, a crypto.Signer), which the daemon made and installed
	// in the sandbox's trust store. It signs the certificates (ECDSA P-256,
	// valid 24 h, for exactly the host name; cached per sandbox and name)
	// with which the proxy terminates the sandbox's TLS connections to a
	// host that has secret headers (Policy.Secrets). Without it such
	// connections are denied.
	CA func(sandbox string) (*tls.Certificate, error)
	// UpstreamTLS configures the proxy's TLS connections to hosts with
	// secret headers (RootCAs, …); nil = the system roots. ServerName is
	// always the host, ALPN http/1.1, and verification is always on.
	UpstreamTLS *tls.Config
	// Attribute names the process behind a connection or DNS query from
	// sandbox at src (the sandbox-side address and port of its socket;
	// network is "tcp" or "udp"), for Event.Process, or says why it cannot
	// (for Event.ProcessUnknown). It is called, in its own goroutine, when
	// the connection or query is accepted. Whatever ends the sandbox's
	// socket waits for it (at most attributeWait): a refusal (the
	// connection closed, the DNS answer sent) only follows it, so the
	// process is still there to be found. Optional.
	Attribute func(sandbox, network string, src netip.AddrPort) (process, unknown string)
}

// Event is one audit record: a DNS query or a connection. Its JSON keys are
// snake_case, like the rest of den's API.
type Event struct {
	Time     time.Time     `json:"time"`      // when the query or connection arrived
	Sandbox  string        `json:"sandbox"`   // sandbox id; "" for an unknown source
	Kind     string        `json:"kind"`      // "dns" or "connect"
	Name     string        `json:"name"`      // queried name, or SNI / Host / proxy target
	QType    string        `json:"qtype"`     // DNS query type ("A", "AAAA", "TXT", …); "" for connections
	Addr     string        `json:"addr"`      // connection: address dialed (or the original destination when denied); DNS: answers, comma-separated
	Port     int           `json:"port"`      // destination port
	BytesOut int64         `json:"bytes_out"` // sandbox → upstream (for an intercepted TLS connection: the HTTP bytes sent upstream, before encryption)
	BytesIn  int64         `json:"bytes_in"`  // upstream → sandbox (intercepted: the HTTP bytes sent to the sandbox, before encryption)
	Verdict  string        `json:"verdict"`   // "allow" or "deny"
	Reason   string        `json:"reason"`    // why
	Duration time.Duration `json:"duration"`  // how long the query or connection lasted, in nanoseconds
	SrcPort  int           `json:"src_port"`  // the sandbox-side source port (to attribute the connection to a process)
	Process  string        `json:"process"`   // the process behind it, from Config.Attribute; "" when unknown
	// ProcessUnknown says why Process is empty (the socket was gone, the
	// attribution was rationed or too slow, the source is no sandbox…);
	// "" when Process is set or no Config.Attribute is configured.
	ProcessUnknown string `json:"process_unknown,omitempty"`
	// Rule is a denial's short, stable rule (Rule of Reason: "name not in
	// allow list", "address not public", …); "" when allowed.
	Rule string `json:"rule,omitempty"`

	sync chan struct{} // a Sync marker, not an event
}

// Kinds and verdicts of Events.
const (
	KindDNS      = "dns"
	KindConnect  = "connect"
	VerdictAllow = "allow"
	VerdictDeny  = "deny"
)

// ErrServerClosed is returned by the Serve methods called after Close.
var ErrServerClosed = errors.New("egress: server closed")

// Server is a DNS server, transparent proxy and explicit proxy sharing one
// Config. Its methods are safe for concurrent use.
type Server struct {
	cfg Config

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	packets   map[net.PacketConn]struct{}
	conns     map[net.Conn]struct{}
	dnsSrv    map[*dns.Server]struct{}
	wg        sync.WaitGroup

	lim *limiter

	bytesMu sync.Mutex
	bytes   map[string]*byteCount // egress bytes per sandbox

	certs certCache

	events  chan Event
	logDone chan struct{}
	dropped atomic.Uint64

	hostMu      sync.Mutex
	hostAddrs   map[netip.Addr]struct{}
	hostFetched time.Time
}

const eventQueue = 8192

// New returns a Server for cfg, filling in defaults.
func New(cfg Config) *Server {
	if cfg.Resolve == nil {
		cfg.Resolve = defaultResolve
	}
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = d.DialContext
	}
	if cfg.OriginalDst == nil {
		cfg.OriginalDst = originalDst
	}
	if cfg.MaxConnsPerSandbox <= 0 {
		cfg.MaxConnsPerSandbox = 512
	}
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = 5 * time.Second
	}
	if cfg.ServerFirstWait <= 0 {
		cfg.ServerFirstWait = time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.ResolveTimeout <= 0 {
		cfg.ResolveTimeout = 5 * time.Second
	}
	if cfg.MaxNameLen <= 0 || cfg.MaxNameLen > 253 {
		cfg.MaxNameLen = 253
	}
	s := &Server{
		cfg:       cfg,
		listeners: map[net.Listener]struct{}{},
		packets:   map[net.PacketConn]struct{}{},
		conns:     map[net.Conn]struct{}{},
		dnsSrv:    map[*dns.Server]struct{}{},
		lim:       newLimiter(cfg.MaxConnsPerSandbox, cfg.ConnRate),
		bytes:     map[string]*byteCount{},
	}
	if cfg.Log != nil {
		s.events = make(chan Event, eventQueue)
		s.logDone = make(chan struct{})
		go func() {
			defer close(s.logDone)
			for e := range s.events {
				if e.sync != nil {
					close(e.sync)
					continue
				}
				cfg.Log(e)
			}
		}()
	}
	return s
}

func defaultResolve(ctx context.Context, name string) ([]netip.Addr, error) {
	// The trailing dot keeps the host's search domains out of it.
	return net.DefaultResolver.LookupNetIP(ctx, "ip", name+".")
}

// Close stops every Serve method, closes every connection in progress,
// waits for their handlers and flushes the events to Log. The Serve methods
// then return nil.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for l := range s.listeners {
		l.Close()
	}
	for pc := range s.packets {
		pc.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	srvs := make([]*dns.Server, 0, len(s.dnsSrv))
	for d := range s.dnsSrv {
		srvs = append(srvs, d)
	}
	s.mu.Unlock()
	for _, d := range srvs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d.ShutdownContext(ctx)
		cancel()
	}
	s.wg.Wait()
	if s.events != nil {
		close(s.events)
		<-s.logDone
	}
	return nil
}

// Sync waits (at most wait) until every Event emitted before it was
// called has been passed to Config.Log. A denial's Event is emitted
// before the refusal is sent (or the connection closed), so once a client
// has seen its refusal, Sync makes its Event visible to Log's reader.
func (s *Server) Sync(wait time.Duration) {
	if s.events == nil || !s.enter() {
		return
	}
	defer s.leave()
	done := make(chan struct{})
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case s.events <- Event{sync: done}:
	case <-t.C:
		return
	}
	select {
	case <-done:
	case <-t.C:
	}
}

// DroppedEvents is the number of Events dropped because Log fell behind.
func (s *Server) DroppedEvents() uint64 { return s.dropped.Load() }

// enter registers a handler; false after Close. Every emit happens between
// enter and leave.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

func (s *Server) leave() { s.wg.Done() }

// track registers c to be closed by Close; false (and c closed) after Close.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) emit(e Event) {
	if s.events == nil {
		return
	}
	select {
	case s.events <- e:
		return
	default:
	}
	t := time.NewTimer(50 * time.Millisecond)
	defer t.Stop()
	select {
	case s.events <- e:
	case <-t.C:
		s.dropped.Add(1)
	}
}

// attributeWait bounds how long an Event (and the refusal or answer that
// follows it) waits for Config.Attribute.
const attributeWait = 500 * time.Millisecond

// attribution is a Config.Attribute call in progress.
type attribution struct {
	done    chan struct{}
	proc    string      // set before done is closed
	unknown string      // why proc is "", set before done is closed
	waited  atomic.Bool // an Event already waited for it in vain
}

// attribute starts Config.Attribute for a connection or query of sandbox
// id from src over network ("tcp" or "udp"); nil without Attribute.
func (s *Server) attribute(id, network string, src netip.AddrPort) *attribution {
	if s.cfg.Attribute == nil || id == "" {
		return nil
	}
	a := &attribution{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.proc, a.unknown = s.cfg.Attribute(id, network, src)
		if a.proc == "" && a.unknown == "" {
			a.unknown = "the attribution found nothing"
		}
	}()
	return a
}

// result is the attribution (the process, or why it is unknown), waiting
// for it at most attributeWait (once per connection: later Events of a
// connection whose attribution timed out do not wait again).
func (a *attribution) result() (process, unknown string) {
	if a == nil {
		return "", ""
	}
	select {
	case <-a.done:
		return a.proc, a.unknown
	default:
	}
	late := "the attribution took longer than " + attributeWait.String()
	if a.waited.Load() {
		return "", late
	}
	t := time.NewTimer(attributeWait)
	defer t.Stop()
	select {
	case <-a.done:
		return a.proc, a.unknown
	case <-t.C:
		a.waited.Store(true)
		return "", late
	}
}

// session is what a proxied connection knows of its sandbox.
type session struct {
	id   string
	pol  Policy
	attr *attribution
	m    *meter
}

// settle waits for the session's attribution (at most attributeWait):
// called before a connection is relayed, so that its process cannot be
// done with it, and gone, before den has found it.
func (x *session) settle() {
	if x != nil {
		x.attr.result()
	}
}

// noSession is Event.ProcessUnknown of an event from a source that is no
// sandbox's: there is no sandbox to look for the process in.
const noSession = "the source is not a sandbox's address"

// emitFor emits ev with the session's attribution (x nil: the source is
// no sandbox's).
func (s *Server) emitFor(x *session, ev Event) {
	if ev.Verdict == VerdictDeny {
		ev.Rule = Rule(ev.Reason)
	}
	switch {
	case x != nil:
		ev.Process, ev.ProcessUnknown = x.attr.result()
	case s.cfg.Attribute != nil:
		ev.ProcessUnknown = noSession
	}
	s.emit(ev)
}

// lookup finds the sandbox behind src.
func (s *Server) lookup(src netip.Addr) (string, Policy, bool) {
	if s.cfg.Sandbox == nil || !src.IsValid() {
		return "", Policy{}, false
	}
	return s.cfg.Sandbox(normAddr(src))
}

// isHostAddr reports whether a is one of the host's interface addresses
// (refreshed at most every 5 s) or in Config.Deny.
func (s *Server) isHostAddr(a netip.Addr) bool {
	a = normAddr(a)
	if inPrefixes(s.cfg.Deny, a) {
		return true
	}
	s.hostMu.Lock()
	defer s.hostMu.Unlock()
	if s.hostAddrs == nil || time.Since(s.hostFetched) > 5*time.Second {
		m := map[netip.Addr]struct{}{}
		if as, err := net.InterfaceAddrs(); err == nil {
			for _, x := range as {
				if p, err := netip.ParsePrefix(x.String()); err == nil {
					m[normAddr(p.Addr())] = struct{}{}
				}
			}
		}
		if len(m) > 0 || s.hostAddrs == nil {
			s.hostAddrs = m
		}
		s.hostFetched = time.Now()
	}
	_, ok := s.hostAddrs[a]
	return ok
}

// judgeAddr is Policy.AllowAddr plus the server's own rules: host
// addresses and Config.Deny are never reachable; Config.Public counts as
// public.
func (s *Server) judgeAddr(p Policy, a netip.Addr, viaName bool) (bool, string) {
	if !a.IsValid() {
		return false, "invalid address"
	}
	a = normAddr(a)
	if s.isHostAddr(a) {
		if why := BlockedReason(a); why != "" {
			return false, "blocked address " + a.String() + ": " + why + ", on the host"
		}
		return false, "address " + a.String() + " belongs to the host"
	}
	if id, _, ok := s.lookup(a); ok {
		// Config.Deny names the bridge's subnets; this catches a sandbox
		// address it does not (an IPv6 prefix the caller left out).
		return false, "address " + a.String() + " belongs to sandbox " + id
	}
	return allowAddr(p, a, viaName, s.cfg.Public)
}

// resolveChecked resolves name and keeps the addresses the policy allows.
// why explains an empty result.
func (s *Server) resolveChecked(ctx context.Context, p Policy, name string) (ok []netip.Addr, blocked int, why string, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ResolveTimeout)
	defer cancel()
	addrs, err := s.cfg.Resolve(ctx, name)
	if err != nil {
		return nil, 0, "resolve " + name + ": " + err.Error(), err
	}
	seen := map[netip.Addr]bool{}
	for _, a := range addrs {
		if !a.IsValid() {
			continue
		}
		a = normAddr(a)
		if seen[a] {
			continue
		}
		seen[a] = true
		if good, w := s.judgeAddr(p, a, true); good {
			ok = append(ok, a)
		} else {
			blocked++
			if why == "" {
				why = w
			}
		}
	}
	switch {
	case len(ok) > 0:
		why = ""
	case blocked > 0:
		why = "resolves to a private address (" + why + ")"
	default:
		why = "no address for " + name
	}
	return ok, blocked, why, nil
}

// judgeHost decides a destination given as a host string (a name or an IP
// literal in any form) and returns the addresses that may be dialed.
func (s *Server) judgeHost(ctx context.Context, p Policy, host string) (addrs []netip.Addr, name string, reason string, ok bool) {
	if host == "" {
		return nil, "", "empty host", false
	}
	if a, isIP := ParseIP(host); isIP {
		good, why := s.judgeAddr(p, a, false)
		if !good {
			return nil, "", why, false
		}
		return []netip.Addr{a}, "", why, true
	}
	n, err := NormalizeName(host)
	if err != nil {
		return nil, "", "invalid host " + quoteShort(host) + ": " + err.Error(), false
	}
	good, nameWhy := p.AllowName(n)
	if !good {
		return nil, n, nameWhy, false
	}
	got, _, why, _ := s.resolveChecked(ctx, p, n)
	if len(got) == 0 {
		return nil, n, why, false
	}
	return got, n, nameWhy, true
}

// pick chooses the address to dial among checked ones: want if it is one of
// them, else the first of want's family, else the first.
func pick(checked []netip.Addr, want netip.Addr) netip.Addr {
	want = normAddr(want)
	for _, a := range checked {
		if a == want {
			return a
		}
	}
	if want.IsValid() {
		for _, a := range checked {
			if a.Is4() == want.Is4() {
				return a
			}
		}
	}
	return checked[0]
}

func quoteShort(s string) string {
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			const hex = "0123456789abcdef"
			b = append(b, '\\', 'x', hex[c>>4], hex[c&15])
			continue
		}
		b = append(b, c)
	}
	return string(append(b, '"'))
}

func addrPortOf(a net.Addr) netip.AddrPort {
	switch v := a.(type) {
	case *net.TCPAddr:
		ap := v.AddrPort()
		return netip.AddrPortFrom(normAddr(ap.Addr()), ap.Port())
	case *net.UDPAddr:
		ap := v.AddrPort()
		return netip.AddrPortFrom(normAddr(ap.Addr()), ap.Port())
	case nil:
		return netip.AddrPort{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(normAddr(ap.Addr()), ap.Port())
}

// serve runs an accept loop, handling each connection in its own goroutine.
func (s *Server) serve(ln net.Listener, h func(net.Conn)) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			if isTemporary(err) {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		if !s.enter() {
			c.Close()
			return nil
		}
		if !s.track(c) {
			s.leave()
			return nil
		}
		go func() {
			defer s.leave()
			defer s.untrack(c)
			defer c.Close()
			h(c)
		}()
	}
}

func isTemporary(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EAGAIN, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// dialChecked connects to a checked address, tracking the connection so
// Close can end it.
func (s *Server) dialChecked(ap netip.AddrPort) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DialTimeout)
	defer cancel()
	c, err := s.cfg.Dial(ctx, "tcp", ap.String())
	if err != nil {
		return nil, err
	}
	if !s.track(c) {
		return nil, ErrServerClosed
	}
	return c, nil
}
