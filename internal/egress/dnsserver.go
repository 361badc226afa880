package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// answerTTL caps the TTL of every answer, so policy changes and rebinding
// defences are not outlived by caches in the sandbox.
const answerTTL = 30

// ServeDNS answers DNS over UDP on pc and over TCP on ln (either may be
// nil) until Close. Only A and AAAA queries of class IN for a name the
// sandbox's policy allows (AllowName; in mode open, any name not denied)
// are answered, with the addresses upstream resolution (Config.Resolve)
// gives that AllowAddr(viaName=true) allows, TTL ≤ 30 s; a name resolving
// only to blocked addresses gets an empty NOERROR answer (logged as a deny
// "resolves to a private address"). Every other query — other types (TXT,
// MX, ANY, PTR, …), classes or opcodes, names not allowed or longer than
// MaxNameLen, unknown sources, mode none — gets REFUSED. Each query is
// logged. It returns nil after Close, and ErrServerClosed when called after
// Close.
func (s *Server) ServeDNS(pc net.PacketConn, ln net.Listener) error {
	if pc == nil && ln == nil {
		return errors.New("egress: ServeDNS without a socket")
	}
	h := dnsHandler{s}
	var srvs []*dns.Server
	if pc != nil {
		srvs = append(srvs, &dns.Server{PacketConn: pc, Handler: h, UDPSize: 4096})
	}
	if ln != nil {
		srvs = append(srvs, &dns.Server{Listener: ln, Handler: h, MaxTCPQueries: 256,
			ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
			IdleTimeout: func() time.Duration { return 8 * time.Second }})
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrServerClosed
	}
	for _, d := range srvs {
		s.dnsSrv[d] = struct{}{}
	}
	if pc != nil {
		s.packets[pc] = struct{}{}
	}
	if ln != nil {
		s.listeners[ln] = struct{}{}
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for _, d := range srvs {
			delete(s.dnsSrv, d)
		}
		delete(s.packets, pc)
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()
	errc := make(chan error, len(srvs))
	for _, d := range srvs {
		go func() { errc <- d.ActivateAndServe() }()
	}
	var first error
	for range srvs {
		err := <-errc
		if err != nil && first == nil && !s.isClosed() {
			first = err
			// One socket failed: stop the other too.
			for _, d := range srvs {
				d.Shutdown()
			}
		}
	}
	if s.isClosed() {
		return nil
	}
	return first
}

type dnsHandler struct{ s *Server }

func qtypeString(t uint16) string {
	if n, ok := dns.TypeToString[t]; ok {
		return n
	}
	return fmt.Sprintf("TYPE%d", t)
}

func (h dnsHandler) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	s := h.s
	if !s.enter() {
		return
	}
	defer s.leave()
	start := time.Now()
	src := addrPortOf(w.RemoteAddr())
	ev := Event{Time: start, Kind: KindDNS, SrcPort: int(src.Port())}
	m := new(dns.Msg)
	var x *session
	finish := func(verdict, reason string) {
		ev.Verdict, ev.Reason, ev.Duration = verdict, reason, time.Since(start)
		s.emitFor(x, ev)
	}
	// Each answer is sent after its event: the event waits for the
	// attribution, which needs the querying socket, and a client that has
	// its answer may close it at once.
	refuse := func(reason string) {
		m.SetRcode(r, dns.RcodeRefused)
		m.RecursionAvailable = true
		finish(VerdictDeny, reason)
		w.WriteMsg(m)
	}
	if len(r.Question) > 0 {
		q := r.Question[0]
		ev.Name = strings.TrimSuffix(q.Name, ".")
		ev.QType = qtypeString(q.Qtype)
	}
	if r.Response || r.Opcode != dns.OpcodeQuery || len(r.Question) != 1 {
		refuse("not a single standard query")
		return
	}
	id, pol, ok := s.lookup(src.Addr())
	if !ok {
		refuse("unknown source " + src.Addr().String())
		return
	}
	ev.Sandbox = id
	network := "udp"
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		network = "tcp"
	}
	x = &session{id: id, pol: pol, attr: s.attribute(id, network, src)}
	q := r.Question[0]
	if q.Qclass != dns.ClassINET {
		refuse("query class " + dns.ClassToString[q.Qclass] + " refused")
		return
	}
	if pol.Mode != ModeAllow && pol.Mode != ModeOpen {
		refuse(modeReason(pol.Mode))
		return
	}
	if len(ev.Name) > s.cfg.MaxNameLen {
		refuse(fmt.Sprintf("name longer than %d characters", s.cfg.MaxNameLen))
		return
	}
	if q.Qtype != dns.TypeA && q.Qtype != dns.TypeAAAA {
		refuse("query type " + ev.QType + " refused")
		return
	}
	name, err := NormalizeName(ev.Name)
	if err != nil {
		refuse("invalid name: " + err.Error())
		return
	}
	ev.Name = name
	ok, nameWhy := pol.AllowName(name)
	if !ok {
		refuse(nameWhy)
		return
	}
	addrs, blocked, why, rerr := s.resolveChecked(context.Background(), pol, name)
	m.SetReply(r)
	m.RecursionAvailable = true
	if rerr != nil {
		var de *net.DNSError
		if errors.As(rerr, &de) && de.IsNotFound {
			m.Rcode = dns.RcodeNameError
		} else {
			m.Rcode = dns.RcodeServerFailure
		}
		finish(VerdictAllow, nameWhy+"; "+why)
		h.write(w, r, m)
		return
	}
	var answers []string
	for _, a := range addrs {
		hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: answerTTL}
		switch {
		case q.Qtype == dns.TypeA && a.Is4():
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.IP(a.AsSlice())})
		case q.Qtype == dns.TypeAAAA && a.Is6():
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.IP(a.AsSlice())})
		default:
			continue
		}
		answers = append(answers, a.String())
	}
	ev.Addr = strings.Join(answers, ",")
	switch {
	case len(addrs) == 0 && blocked > 0:
		finish(VerdictDeny, why)
	case len(answers) == 0:
		finish(VerdictAllow, nameWhy+"; no "+ev.QType+" address")
	default:
		finish(VerdictAllow, nameWhy)
	}
	h.write(w, r, m)
}

// write sends m, truncated to what the client can take over UDP.
func (h dnsHandler) write(w dns.ResponseWriter, r, m *dns.Msg) {
	size := dns.MinMsgSize
	if opt := r.IsEdns0(); opt != nil {
		size = max(int(opt.UDPSize()), dns.MinMsgSize)
		m.SetEdns0(uint16(min(size, 4096)), false)
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		m.Truncate(size)
	}
	w.WriteMsg(m)
}
