package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
)

// maxRequestHead bounds an explicit-proxy request line plus header.
const maxRequestHead = 64 << 10

// ServeProxy serves an explicit HTTP proxy for sandboxes that honour
// HTTP(S)_PROXY: CONNECT host:port tunnels and absolute-URI http://
// requests (forwarded with hop-by-hop headers stripped, one upstream
// connection per request). The target host is judged as in the transparent
// proxy: an IP literal in any form (decimal, hex, octal, short, IPv6,
// IPv4-mapped) is judged as an address, a name by AllowName and by the
// addresses it resolves to, and only a checked address is dialed.
// Userinfo ('@') or '%' in the host is refused. Refusals get a 403 (429 for
// limits) whose status line names the rule (see Rule) and whose body the
// whole reason. A CONNECT tunnel to a name with
// secret headers (Policy.Secrets) whose client speaks TLS (for that name or
// without SNI) is intercepted: see SecretHeader; other tunnels and
// absolute-URI requests to such a name are relayed without the secrets.
// It returns nil after Close, and ErrServerClosed when called after Close.
func (s *Server) ServeProxy(ln net.Listener) error {
	return s.serve(ln, s.handleProxy)
}

// headLimiter reads from the client, failing once n bytes are exceeded;
// n is reset for each request head and lifted for bodies.
type headLimiter struct {
	r io.Reader
	n int64
}

var errHeadTooLarge = errors.New("request header larger than 64 KiB")

func (l *headLimiter) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (s *Server) handleProxy(c net.Conn) {
	src := addrPortOf(c.RemoteAddr())
	base := Event{Kind: KindConnect, SrcPort: int(src.Port())}
	var x *session
	deny := func(ev Event, code int, reason string) {
		ev.Verdict, ev.Reason, ev.Duration = VerdictDeny, reason, time.Since(ev.Time)
		s.emitFor(x, ev)
		writeRefusal(c, code, reason)
	}
	id, pol, ok := s.lookup(src.Addr())
	if !ok {
		ev := base
		ev.Time = time.Now()
		deny(ev, http.StatusForbidden, "unknown source "+src.Addr().String())
		return
	}
	base.Sandbox = id
	x = &session{id: id, pol: pol, attr: s.attribute(id, "tcp", src)}
	m, why := s.openMeter(id, pol.MaxEgressBytes)
	defer s.closeMeter(m)
	x.m = m
	if why != "" {
		ev := base
		ev.Time = time.Now()
		deny(ev, http.StatusTooManyRequests, why)
		return
	}
	if ok, why := s.lim.acquire(id, pol.ConnRate); !ok {
		ev := base
		ev.Time = time.Now()
		deny(ev, http.StatusTooManyRequests, why)
		return
	}
	defer s.lim.release(id)

	lr := &headLimiter{r: c}
	br := bufio.NewReaderSize(lr, 16<<10)
	wait := max(s.cfg.IdleTimeout, 60*time.Second)
	for n := 0; ; n++ {
		// The first request must come quickly; later ones may wait.
		if n == 0 {
			c.SetReadDeadline(time.Now().Add(s.cfg.PeekTimeout))
		} else {
			c.SetReadDeadline(time.Now().Add(wait))
		}
		lr.n = maxRequestHead
		if n > 0 {
			// Wait for the next request without holding the head deadline.
			if _, err := br.Peek(1); err != nil {
				return
			}
			c.SetReadDeadline(time.Now().Add(s.cfg.PeekTimeout))
		}
		req, err := http.ReadRequest(br)
		ev := base
		ev.Time = time.Now()
		if err != nil {
			if n > 0 && (errors.Is(err, io.EOF) || errors.Is(err, os.ErrDeadlineExceeded)) {
				return
			}
			if errors.Is(err, io.EOF) && br.Buffered() == 0 {
				return
			}
			deny(ev, http.StatusBadRequest, "malformed request: "+err.Error())
			return
		}
		lr.n = 1<<62 - 1
		c.SetReadDeadline(time.Time{})
		if n > 0 && !s.lim.token(id, pol.ConnRate) {
			deny(ev, http.StatusTooManyRequests, "rate limit")
			return
		}
		if m.exhausted() {
			deny(ev, http.StatusTooManyRequests, byteLimitReason(m.limit))
			return
		}
		if req.Method == http.MethodConnect {
			s.proxyConnect(x, c, br, req, ev)
			return
		}
		if !s.proxyForward(x, c, req, ev) {
			return
		}
	}
}

// writeRefusal answers a refused request and closes the connection (by the
// caller returning). The status line names the rule ("HTTP/1.1 403 den
// egress: name not in allow list"), for clients that show only that; the
// body has the whole reason.
func writeRefusal(c net.Conn, code int, reason string) {
	body := "den egress: " + reason + "\n"
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "HTTP/1.1 %d den egress: %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Den-Egress: deny\r\n\r\n%s",
		code, Rule(reason), len(body), body)
	c.SetWriteDeadline(time.Time{})
}

// splitTarget splits "host:port" (host may be a bracketed IPv6 literal)
// with a default port; '@' and '%' are refused.
func splitTarget(hp string, defPort int) (host string, port int, err error) {
	if hp == "" {
		return "", 0, errors.New("empty host")
	}
	if strings.ContainsAny(hp, "@") {
		return "", 0, errors.New("userinfo ('@') in host")
	}
	if strings.ContainsAny(hp, "%") {
		return "", 0, errors.New("'%' in host")
	}
	if strings.ContainsAny(hp, " \t\r\n\x00/\\?#") {
		return "", 0, errors.New("invalid character in host")
	}
	host, ps := hp, ""
	if hp[0] == '[' {
		end := strings.IndexByte(hp, ']')
		if end < 0 {
			return "", 0, errors.New("unterminated IPv6 literal")
		}
		host, ps = hp[:end+1], hp[end+1:]
		if ps != "" {
			if ps[0] != ':' {
				return "", 0, errors.New("garbage after IPv6 literal")
			}
			ps = ps[1:]
			if ps == "" {
				return "", 0, errors.New("empty port")
			}
		}
	} else if i := strings.LastIndexByte(hp, ':'); i >= 0 {
		if strings.IndexByte(hp[:i], ':') >= 0 {
			return "", 0, errors.New("IPv6 literal without brackets")
		}
		host, ps = hp[:i], hp[i+1:]
		if ps == "" {
			return "", 0, errors.New("empty port")
		}
	}
	if host == "" || host == "[]" {
		return "", 0, errors.New("empty host")
	}
	if ps == "" {
		if defPort == 0 {
			return "", 0, errors.New("missing port")
		}
		return host, defPort, nil
	}
	if !isPort(ps) {
		return "", 0, fmt.Errorf("bad port %s", quoteShort(ps))
	}
	p, _ := strconv.Atoi(ps)
	return host, p, nil
}

// target judges host:port and returns the address to dial.
func (s *Server) target(pol Policy, host string, port int, ev *Event) (netip.AddrPort, string, bool) {
	ev.Port = port
	ev.Name = host
	if a, isIP := ParseIP(host); isIP {
		ev.Addr = a.String()
	}
	addrs, name, why, ok := s.judgeHost(context.Background(), pol, host)
	if name != "" {
		ev.Name = name
	}
	if !ok {
		return netip.AddrPort{}, why, false
	}
	ap := netip.AddrPortFrom(addrs[0], uint16(port))
	ev.Addr = ap.Addr().String()
	return ap, why, true
}

func (s *Server) proxyConnect(x *session, c net.Conn, br *bufio.Reader, req *http.Request, ev Event) {
	deny := func(code int, reason string) {
		ev.Verdict, ev.Reason, ev.Duration = VerdictDeny, reason, time.Since(ev.Time)
		s.emitFor(x, ev)
		writeRefusal(c, code, reason)
	}
	host, port, err := splitTarget(req.RequestURI, 0)
	if err != nil {
		ev.Name = req.RequestURI
		deny(http.StatusForbidden, "bad CONNECT target "+quoteShort(req.RequestURI)+": "+err.Error())
		return
	}
	ap, why, ok := s.target(x.pol, host, port, &ev)
	if !ok {
		deny(http.StatusForbidden, why)
		return
	}
	var secrets []SecretHeader
	if _, isIP := ParseIP(host); !isIP {
		secrets = x.pol.secretsFor(ev.Name)
	}
	x.settle()
	up, err := s.dialChecked(ap)
	if err != nil {
		ev.Verdict, ev.Reason, ev.Duration = VerdictAllow, why+"; upstream: "+err.Error(), time.Since(ev.Time)
		s.emitFor(x, ev)
		writeRefusal(c, http.StatusBadGateway, "upstream: "+err.Error())
		return
	}
	defer s.untrack(up)
	end := func(reason string, out, in int64) {
		ev.Verdict, ev.Reason, ev.BytesOut, ev.BytesIn, ev.Duration = VerdictAllow, reason, out, in, time.Since(ev.Time)
		s.emitFor(x, ev)
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		up.Close()
		end(why+"; client gone", 0, 0)
		return
	}
	// Bytes the client sent after the request head go first.
	var pre []byte
	if len(secrets) > 0 {
		// A host with secret headers: is the tunnel TLS for that name?
		p, kind, sni, perr := s.peek(&readerConn{Conn: c, r: br}, false)
		pre = p
		if n := br.Buffered(); n > 0 {
			b, _ := br.Peek(n)
			pre = append(pre, b...)
		}
		sniName, _ := NormalizeName(sni)
		switch {
		case perr != nil && errors.Is(perr, io.EOF):
			up.Close()
			end(why+"; client closed before sending a request", 0, 0)
			return
		case kind == sniffTLS && perr == nil && (sni == "" || sniName == ev.Name):
			leaf, err := s.leafCert(x.id, ev.Name)
			if err != nil {
				up.Close()
				ev.Verdict, ev.Reason, ev.Duration = VerdictDeny, "cannot intercept TLS for "+secretNames(secrets)+": "+err.Error(), time.Since(ev.Time)
				s.emitFor(x, ev)
				return
			}
			out, in, note := s.intercept(x, c, pre, up, ap, ev.Name, secrets, leaf)
			end(why+note, out, in)
			return
		case kind == sniffTLS && perr == nil:
			why += "; " + notInjected(secrets, "TLS server name "+quoteShort(sni)+" differs from the CONNECT host")
		case kind == sniffHTTP:
			why += "; " + notInjected(secrets, "plain HTTP, the secret would cross in clear")
		default:
			why += "; " + notInjected(secrets, "not a TLS connection")
		}
	} else if n := br.Buffered(); n > 0 {
		pre, _ = br.Peek(n)
		pre = append([]byte(nil), pre...)
	}
	out, in, limited := s.relay(c, up, pre, x.m)
	if limited {
		why += "; " + byteLimitReason(x.m.limit)
	}
	end(why, out, in)
}

// readerConn is a net.Conn whose reads come from r (a buffered reader of
// the connection).
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c *readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// hopHeaders are removed from forwarded requests and responses, with every
// header the Connection header names.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func stripHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// proxyForward forwards one absolute-URI request; false means the client
// connection must close.
func (s *Server) proxyForward(x *session, c net.Conn, req *http.Request, ev Event) bool {
	pol := x.pol
	deny := func(code int, reason string) bool {
		ev.Verdict, ev.Reason, ev.Duration = VerdictDeny, reason, time.Since(ev.Time)
		s.emitFor(x, ev)
		writeRefusal(c, code, reason)
		return false
	}
	raw := req.RequestURI
	if strings.HasPrefix(raw, "/") || req.URL.Host == "" {
		ev.Name = req.Host
		return deny(http.StatusBadRequest, "not a proxy request (want an absolute URI or CONNECT)")
	}
	if !strings.EqualFold(req.URL.Scheme, "http") {
		ev.Name = req.URL.Host
		return deny(http.StatusBadRequest, "scheme "+quoteShort(req.URL.Scheme)+" not proxied: use CONNECT for https")
	}
	auth := raw[strings.Index(raw, "://")+3:]
	if i := strings.IndexAny(auth, "/?#"); i >= 0 {
		auth = auth[:i]
	}
	host, port, err := splitTarget(auth, 80)
	if err != nil {
		ev.Name = auth
		return deny(http.StatusForbidden, "bad request target "+quoteShort(auth)+": "+err.Error())
	}
	ap, why, ok := s.target(pol, host, port, &ev)
	if !ok {
		return deny(http.StatusForbidden, why)
	}
	if _, isIP := ParseIP(host); !isIP {
		if secrets := pol.secretsFor(ev.Name); len(secrets) > 0 {
			why += "; " + notInjected(secrets, "plain HTTP, the secret would cross in clear")
		}
	}
	x.settle()
	up, err := s.dialChecked(ap)
	if err != nil {
		ev.Verdict, ev.Reason, ev.Duration = VerdictAllow, why+"; upstream: "+err.Error(), time.Since(ev.Time)
		s.emitFor(x, ev)
		writeRefusal(c, http.StatusBadGateway, "upstream: "+err.Error())
		return false
	}
	defer func() {
		up.Close()
		s.untrack(up)
	}()

	clientClose := req.Close
	stripHop(req.Header)
	req.Host = auth // the host the request names is the one we checked
	req.RequestURI = ""
	req.Close = true
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // keep Go's default out
	}
	upW := &meteredWriter{w: up, m: x.m}
	werr := make(chan error, 1)
	go func() {
		// Write sends the whole body and closes it, and closing a body
		// read by http.ReadRequest reads what is left of it: the client
		// connection is at the next request afterwards. (Reading the body
		// again here failed with "invalid Read on closed Body", and that
		// failure closed every kept-alive client connection after its
		// first response: TestProxyForward's second request then met a
		// reset.)
		err := req.Write(upW)
		if errors.Is(err, errByteLimit) {
			up.Close() // the upstream would wait for the rest of the body
		}
		werr <- err
	}()
	cw := &countWriter{w: c}
	var wErr error
	wDone := false
	waitWriter := func() error {
		if !wDone {
			wErr, wDone = <-werr, true
		}
		return wErr
	}
	finish := func(reason string, keep bool) bool {
		// The response is complete: a body still being sent is cut off,
		// which closes the client connection too.
		up.Close()
		err := waitWriter()
		if err != nil {
			keep = false
		}
		if errors.Is(err, errByteLimit) {
			reason += "; " + byteLimitReason(x.m.limit)
		}
		ev.Verdict, ev.Reason, ev.BytesOut, ev.BytesIn, ev.Duration = VerdictAllow, reason, upW.n, cw.n, time.Since(ev.Time)
		s.emitFor(x, ev)
		return keep
	}
	ur := bufio.NewReader(up)
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(ur, req)
		if err != nil {
			up.Close() // unblocks the writer
			if errors.Is(waitWriter(), errByteLimit) {
				writeRefusal(c, http.StatusTooManyRequests, byteLimitReason(x.m.limit))
				return finish(why, false)
			}
			writeRefusal(c, http.StatusBadGateway, "upstream: "+err.Error())
			return finish(why+"; upstream: "+err.Error(), false)
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		// 1xx: pass it on and read the final response.
		stripHop(resp.Header)
		fmt.Fprintf(cw, "HTTP/1.1 %s\r\n", resp.Status)
		resp.Header.Write(cw)
		io.WriteString(cw, "\r\n")
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		up.Close()
		writeRefusal(c, http.StatusBadGateway, "protocol upgrades are not proxied")
		return finish(why+"; upgrade refused", false)
	}
	stripHop(resp.Header)
	keep := !clientClose && resp.ProtoAtLeast(1, 1) &&
		(resp.ContentLength >= 0 || len(resp.TransferEncoding) > 0 || req.Method == http.MethodHead ||
			resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified)
	resp.Close = !keep
	if err := resp.Write(cw); err != nil {
		up.Close()
		return finish(why+"; relaying the response: "+err.Error(), false)
	}
	return finish(why, keep)
}
