package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"
)

// ServeTransparent accepts the TCP connections nftables redirects from
// sandboxes and proxies the allowed ones. For each connection it finds the
// original destination (Config.OriginalDst) and the sandbox (by source
// address), reads the TLS ClientHello or HTTP/1 request head without
// consuming it (at most 16 KiB, within PeekTimeout), and then:
//   - with a name (SNI or Host): AllowName, resolve the name itself, keep the
//     addresses AllowAddr(viaName=true) allows, and dial one of those on
//     the original port (the original destination if it is among them) —
//     never an address the sandbox chose;
//   - without one (raw TCP, TLS without SNI, an IP literal as name): dial
//     the original destination only if AllowAddr(viaName=false) allows it.
//
// The original destination may never be the host itself (the proxy, the
// bridge, any host interface address) or Config.Deny. Denied connections
// are closed, a plain HTTP request's after a 403 refusal like the explicit
// proxy's (see ServeProxy). A TLS connection (SNI present, any port) to a name with
// secret headers (Policy.Secrets) is intercepted: see SecretHeader; a
// plain-HTTP one is relayed unchanged, without the secrets. Every
// connection is logged once, when it ends. It returns nil after Close, and
// ErrServerClosed when called after Close.
func (s *Server) ServeTransparent(ln net.Listener) error {
	return s.serve(ln, s.handleTransparent)
}

func (s *Server) handleTransparent(c net.Conn) {
	start := time.Now()
	src := addrPortOf(c.RemoteAddr())
	ev := Event{Time: start, Kind: KindConnect, SrcPort: int(src.Port())}
	var x *session
	var kind sniffKind
	deny := func(reason string) {
		ev.Verdict, ev.Reason, ev.Duration = VerdictDeny, reason, time.Since(start)
		s.emitFor(x, ev)
		if kind == sniffHTTP {
			// A plain HTTP request gets its refusal as an HTTP answer.
			writeRefusal(c, http.StatusForbidden, reason)
		}
	}
	// The sandbox first, so that every denial below has its process.
	id, pol, known := s.lookup(src.Addr())
	if known {
		ev.Sandbox = id
		x = &session{id: id, pol: pol, attr: s.attribute(id, "tcp", src)}
	}
	dst, err := s.cfg.OriginalDst(c)
	if err != nil {
		deny(err.Error())
		return
	}
	dst = netip.AddrPortFrom(normAddr(dst.Addr()), dst.Port())
	ev.Addr, ev.Port = dst.Addr().String(), int(dst.Port())
	if !known {
		deny("unknown source " + src.Addr().String())
		return
	}
	m, why := s.openMeter(id, pol.MaxEgressBytes)
	defer s.closeMeter(m)
	x.m = m
	if why != "" {
		deny(why)
		return
	}
	if ok, why := s.lim.acquire(id, pol.ConnRate); !ok {
		deny(why)
		return
	}
	defer s.lim.release(id)
	if local := addrPortOf(c.LocalAddr()); dst.Addr() == local.Addr() || s.isHostAddr(dst.Addr()) || !dst.Addr().IsValid() {
		deny("destination " + dst.String() + " is the host (the proxy itself, the bridge or a host address)")
		return
	}
	if pol.Mode != ModeAllow && pol.Mode != ModeOpen {
		deny(modeReason(pol.Mode))
		return
	}
	rawOK, rawWhy := s.judgeAddr(pol, dst.Addr(), false)

	pre, k, name, serr := s.peek(c, rawOK)
	kind = k
	if serr != nil && errors.Is(serr, io.EOF) {
		deny("client closed before sending a request")
		return
	}
	ev.Name = name
	target := dst
	reason := rawWhy
	var secrets []SecretHeader
	if name != "" {
		if _, isIP := ParseIP(name); isIP {
			// An address in place of a name: only the raw rules apply.
			if !rawOK {
				deny("no name (address " + quoteShort(name) + " in SNI/Host): " + rawWhy)
				return
			}
		} else {
			addrs, n, why, ok := s.judgeHost(context.Background(), pol, name)
			if n != "" {
				ev.Name = n
			}
			if !ok {
				deny(why)
				return
			}
			target = netip.AddrPortFrom(pick(addrs, dst.Addr()), dst.Port())
			reason = why
			if target.Addr() != dst.Addr() {
				reason += "; dialed " + target.Addr().String() + " (checked) instead of " + dst.Addr().String()
			}
			secrets = pol.secretsFor(n)
		}
	} else if !rawOK {
		if serr != nil {
			deny("no name (" + serr.Error() + "): " + rawWhy)
		} else {
			deny("no name: " + rawWhy)
		}
		return
	}
	var leaf *tls.Certificate
	if len(secrets) > 0 {
		if kind == sniffTLS {
			if leaf, err = s.leafCert(id, ev.Name); err != nil {
				deny("cannot intercept TLS for " + secretNames(secrets) + ": " + err.Error())
				return
			}
		} else {
			reason += "; " + notInjected(secrets, "plain HTTP, the secret would cross in clear")
		}
	}
	ev.Addr = target.Addr().String()
	x.settle()
	up, err := s.dialChecked(target)
	if err != nil {
		ev.Verdict, ev.Reason, ev.Duration = VerdictAllow, reason+"; upstream: "+err.Error(), time.Since(start)
		s.emitFor(x, ev)
		return
	}
	defer s.untrack(up)
	var out, in int64
	if leaf != nil {
		var note string
		out, in, note = s.intercept(x, c, pre, up, target, ev.Name, secrets, leaf)
		reason += note
	} else {
		var limited bool
		out, in, limited = s.relay(c, up, pre, m)
		if limited {
			reason += "; " + byteLimitReason(m.limit)
		}
	}
	ev.Verdict, ev.Reason, ev.BytesOut, ev.BytesIn, ev.Duration = VerdictAllow, reason, out, in, time.Since(start)
	s.emitFor(x, ev)
}

// errNoData means the client sent nothing within the wait.
var errNoData = errors.New("client sent nothing")

// peek reads the start of the client's stream until sniff can decide,
// 16 KiB are read, or the deadline passes. When the address is allowed
// without a name (rawOK), it waits only ServerFirstWait for the first
// bytes, for protocols in which the server speaks first. err (not EOF)
// explains why no name was found; the bytes read are always returned, with
// the kind of protocol they start.
func (s *Server) peek(c net.Conn, rawOK bool) (pre []byte, kind sniffKind, name string, err error) {
	start := time.Now()
	deadline := start.Add(s.cfg.PeekTimeout)
	first := deadline
	if rawOK {
		first = start.Add(min(s.cfg.ServerFirstWait, s.cfg.PeekTimeout))
	}
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 0, 2048)
	c.SetReadDeadline(first)
	for {
		if len(buf) == cap(buf) {
			if cap(buf) >= maxPeek {
				return buf, kind, "", errors.New("no name in the first 16 KiB")
			}
			nb := make([]byte, len(buf), min(maxPeek, 4*cap(buf)))
			copy(nb, buf)
			buf = nb
		}
		n, rerr := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if n > 0 {
			if len(buf) == n {
				c.SetReadDeadline(deadline)
			}
			k, nm, serr := sniff(buf)
			kind = k
			if serr == nil {
				return buf, kind, nm, nil
			}
			if serr != errNeedMore {
				return buf, kind, "", serr
			}
		}
		if rerr != nil {
			switch {
			case errors.Is(rerr, os.ErrDeadlineExceeded) && len(buf) == 0:
				return buf, kind, "", errNoData
			case errors.Is(rerr, os.ErrDeadlineExceeded):
				return buf, kind, "", errors.New("timed out reading the request")
			default: // EOF, reset: nothing to proxy
				return buf, kind, "", io.EOF
			}
		}
	}
}
