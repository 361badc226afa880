package egress

import (
	"bufio"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// TLS interception for secret headers (see SecretHeader).
//
// The sandbox's TLS connection to a host with secret headers ends at the
// proxy, which presents a certificate for exactly that host signed by the
// sandbox's own CA (Config.CA). Each HTTP/1.1 request read from it is
// checked (its Host must be that host; no CONNECT, no TRACE, which would
// echo the secrets, no protocol upgrade, no HTTP/2), gets the secret headers (replacing any copy the sandbox sent)
// and is forwarded over a TLS connection to the checked address of the
// host, verified for the host's name; the response is relayed back. Bodies
// stream both ways; requests are re-framed (Content-Length or chunked) so
// the upstream parses exactly the request the proxy checked. Trailers are
// not forwarded.

const (
	leafValidity   = 24 * time.Hour
	leafRenew      = time.Hour // a cached certificate is re-issued when less remains
	maxCachedLeafs = 4096
	secretMask     = "[den: secret]"
	writerGrace    = 100 * time.Millisecond
)

// certCache holds the leaf certificates issued per sandbox and name.
type certCache struct {
	mu sync.Mutex
	m  map[certKey]*certEntry
}

type certKey struct{ sandbox, name string }

type certEntry struct {
	ca    [32]byte // SHA-256 of the CA certificate that signed it
	cert  *tls.Certificate
	renew time.Time
}

// leafCert returns the certificate for name signed by sandbox's CA,
// issuing it if none is cached, the cached one is about to expire or the
// CA changed.
func (s *Server) leafCert(sandbox, name string) (*tls.Certificate, error) {
	if s.cfg.CA == nil {
		return nil, errors.New("no certificate authority configured (Config.CA)")
	}
	ca, err := s.cfg.CA(sandbox)
	if err != nil {
		return nil, fmt.Errorf("the sandbox's certificate authority: %w", err)
	}
	if ca == nil || len(ca.Certificate) == 0 || ca.PrivateKey == nil {
		return nil, errors.New("the sandbox has no certificate authority")
	}
	fp := sha256.Sum256(ca.Certificate[0])
	k := certKey{sandbox, name}
	now := time.Now()
	s.certs.mu.Lock()
	e := s.certs.m[k]
	s.certs.mu.Unlock()
	if e != nil && e.ca == fp && now.Before(e.renew) {
		return e.cert, nil
	}
	cert, notAfter, err := issueLeaf(ca, name, now)
	if err != nil {
		return nil, err
	}
	s.certs.mu.Lock()
	defer s.certs.mu.Unlock()
	if s.certs.m == nil {
		s.certs.m = map[certKey]*certEntry{}
	}
	if len(s.certs.m) >= maxCachedLeafs {
		for k, e := range s.certs.m {
			if !now.Before(e.renew) {
				delete(s.certs.m, k)
			}
		}
		if len(s.certs.m) >= maxCachedLeafs {
			clear(s.certs.m)
		}
	}
	s.certs.m[k] = &certEntry{ca: fp, cert: cert, renew: notAfter.Add(-leafRenew)}
	return cert, nil
}

// issueLeaf makes an ECDSA P-256 server certificate for exactly name,
// valid 24 h (not past the CA's own expiry), signed by ca.
func issueLeaf(ca *tls.Certificate, name string, now time.Time) (*tls.Certificate, time.Time, error) {
	caCert := ca.Leaf
	if caCert == nil {
		var err error
		if caCert, err = x509.ParseCertificate(ca.Certificate[0]); err != nil {
			return nil, time.Time{}, fmt.Errorf("the sandbox's CA certificate: %w", err)
		}
	}
	signer, ok := ca.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, time.Time{}, fmt.Errorf("the sandbox's CA key (%T) cannot sign", ca.PrivateKey)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, time.Time{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, time.Time{}, err
	}
	notBefore := now.Add(-time.Minute)
	notAfter := notBefore.Add(leafValidity)
	if caCert.NotAfter.Before(notAfter) {
		notAfter = caCert.NotAfter
	}
	if !notAfter.After(now) {
		return nil, time.Time{}, errors.New("the sandbox's CA certificate has expired")
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		DNSNames:              []string{name},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, signer)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("signing a certificate for %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, time.Time{}, err
	}
	chain := append([][]byte{der}, ca.Certificate...)
	return &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}, notAfter, nil
}

// upstreamTLS is the client configuration for name's upstream.
func (s *Server) upstreamTLS(name string) *tls.Config {
	c := &tls.Config{}
	if s.cfg.UpstreamTLS != nil {
		c = s.cfg.UpstreamTLS.Clone()
	}
	c.ServerName = name
	c.NextProtos = []string{"http/1.1"}
	c.InsecureSkipVerify = false
	if c.MinVersion == 0 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}

// secretNames names the headers of secrets for an Event ("secret header
// Authorization", "secret headers A, B"), never their values.
func secretNames(secrets []SecretHeader) string {
	names := make([]string, len(secrets))
	for i, h := range secrets {
		names[i] = h.Header
	}
	if len(names) == 1 {
		return "secret header " + names[0]
	}
	return "secret headers " + strings.Join(names, ", ")
}

func notInjected(secrets []SecretHeader, why string) string {
	return secretNames(secrets) + " not injected (" + why + ")"
}

// scrubSecrets replaces every secret value in v with secretMask.
func scrubSecrets(v string, secrets []SecretHeader) string {
	for _, h := range secrets {
		if h.Value != "" && strings.Contains(v, h.Value) {
			v = strings.ReplaceAll(v, h.Value, secretMask)
		}
	}
	return v
}

// scrubHeader masks secret values in h's values and drops a header whose
// name contains one.
func scrubHeader(h http.Header, secrets []SecretHeader) {
	for k, vs := range h {
		if scrubSecrets(k, secrets) != k {
			delete(h, k)
			continue
		}
		for i, v := range vs {
			vs[i] = scrubSecrets(v, secrets)
		}
	}
}

// prefixConn reads pre before the connection.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// activeConn records when bytes last moved.
type activeConn struct {
	net.Conn
	last *atomic.Int64
}

func (c *activeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.last.Store(time.Now().UnixNano())
	}
	return n, err
}

func (c *activeConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.last.Store(time.Now().UnixNano())
	}
	return n, err
}

// interceptor proxies the requests of one intercepted connection.
type interceptor struct {
	s       *Server
	x       *session
	name    string
	target  netip.AddrPort
	secrets []SecretHeader

	raw net.Conn // the sandbox's connection
	tc  *tls.Conn
	lim *headLimiter
	cbr *bufio.Reader
	cw  countWriter // plaintext to the sandbox
	cbw *bufio.Writer

	idle bool
	last atomic.Int64 // when bytes last moved (with IdleTimeout)

	upMu  sync.Mutex // guards upRaw for the idle watchdog
	upRaw net.Conn   // the current upstream connection (tracked), or nil
	upTLS *tls.Conn
	ubr   *bufio.Reader
	uw    meteredWriter // plaintext to the upstream, across connections
	ubw   *bufio.Writer

	requests int
}

// intercept terminates the sandbox's TLS connection c (pre: the bytes
// already read of it, the ClientHello) for name with leaf, and proxies its
// HTTP/1.1 requests one by one to up, connected to the checked target
// (which it redials when the upstream closes), over TLS verified for name,
// setting secrets on each. It returns the plaintext bytes sent upstream and
// to the sandbox, and a note for the Event's reason ("; …"), scrubbed of
// secret values.
func (s *Server) intercept(x *session, c net.Conn, pre []byte, up net.Conn, target netip.AddrPort, name string,
	secrets []SecretHeader, leaf *tls.Certificate) (out, in int64, note string) {
	it := &interceptor{s: s, x: x, name: name, target: target, secrets: secrets, raw: c, idle: s.cfg.IdleTimeout > 0}
	it.uw.m = x.m
	defer it.closeUp()
	var client net.Conn = c
	if it.idle {
		it.last.Store(time.Now().UnixNano())
		client = &activeConn{Conn: c, last: &it.last}
		done := make(chan struct{})
		defer close(done)
		go it.watchdog(done, s.cfg.IdleTimeout)
	}
	it.setUp(up)

	tc := tls.Server(&prefixConn{Conn: client, pre: pre}, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			if h.ServerName != "" && !strings.EqualFold(strings.TrimSuffix(h.ServerName, "."), name) {
				return nil, fmt.Errorf("server name %s is not %s", quoteShort(h.ServerName), name)
			}
			return nil, nil
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.PeekTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		return 0, 0, scrubSecrets("; TLS intercepted for "+secretNames(secrets)+", but the handshake with the sandbox failed: "+err.Error(), x.pol.Secrets)
	}
	it.tc = tc
	it.lim = &headLimiter{r: tc}
	it.cbr = bufio.NewReaderSize(it.lim, 16<<10)
	it.cw.w = tc
	it.cbw = bufio.NewWriterSize(&it.cw, 16<<10)

	var fail string
	for n := 0; ; n++ {
		keep, why := it.exchange(n)
		if why != "" {
			fail = why
		}
		if !keep {
			break
		}
	}
	switch it.requests {
	case 0:
		note = "; TLS intercepted for " + secretNames(secrets) + ", no request forwarded"
	case 1:
		note = "; TLS intercepted, " + secretNames(secrets) + " injected into 1 request"
	default:
		note = "; TLS intercepted, " + secretNames(secrets) + " injected into " + strconv.Itoa(it.requests) + " requests"
	}
	if fail != "" {
		note += "; " + fail
	}
	return it.uw.n, it.cw.n, scrubSecrets(note, x.pol.Secrets)
}

// watchdog closes both sides once no byte moved for d.
func (it *interceptor) watchdog(done chan struct{}, d time.Duration) {
	t := time.NewTicker(max(d/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			if time.Since(time.Unix(0, it.last.Load())) >= d {
				it.raw.Close()
				it.closeUpRaw()
				return
			}
		}
	}
}

// setUp makes c (tracked, connected to the target) the upstream
// connection, not yet TLS.
func (it *interceptor) setUp(c net.Conn) {
	it.upMu.Lock()
	it.upRaw = c
	it.upMu.Unlock()
}

// closeUpRaw closes the upstream connection without forgetting it: what
// uses it fails.
func (it *interceptor) closeUpRaw() {
	it.upMu.Lock()
	if it.upRaw != nil {
		it.upRaw.Close()
	}
	it.upMu.Unlock()
}

// closeUp closes and forgets the upstream connection; the next request
// dials again.
func (it *interceptor) closeUp() {
	it.upMu.Lock()
	c := it.upRaw
	it.upRaw = nil
	it.upMu.Unlock()
	if c != nil {
		c.Close()
		it.s.untrack(c)
	}
	it.upTLS, it.ubr, it.ubw = nil, nil, nil
}

// ensureUp connects to the target over TLS verified for the name, unless
// a connection is up.
func (it *interceptor) ensureUp() error {
	if it.upTLS != nil {
		return nil
	}
	it.upMu.Lock()
	c := it.upRaw
	it.upMu.Unlock()
	if c == nil {
		var err error
		if c, err = it.s.dialChecked(it.target); err != nil {
			return err
		}
		it.setUp(c)
	}
	var conn net.Conn = c
	if it.idle {
		conn = &activeConn{Conn: c, last: &it.last}
	}
	tc := tls.Client(conn, it.s.upstreamTLS(it.name))
	ctx, cancel := context.WithTimeout(context.Background(), it.s.cfg.DialTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		it.closeUp()
		return fmt.Errorf("TLS with %s: %w", it.name, err)
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != "" && p != "http/1.1" {
		it.closeUp()
		return fmt.Errorf("TLS with %s: negotiated %s, not http/1.1", it.name, quoteShort(p))
	}
	it.upTLS = tc
	it.ubr = bufio.NewReaderSize(tc, 16<<10)
	it.uw.w = tc
	it.ubw = bufio.NewWriterSize(&it.uw, 16<<10)
	return nil
}

// refuse answers the current request with a refusal; the connection then
// ends.
func (it *interceptor) refuse(code int, reason string) (bool, string) {
	reason = scrubSecrets(reason, it.x.pol.Secrets)
	writeRefusal(it.tc, code, reason)
	return false, reason
}

// exchange proxies the n-th request of the connection; keep reports
// whether another may follow, fail what went wrong.
func (it *interceptor) exchange(n int) (keep bool, fail string) {
	s := it.s
	tc := it.tc
	it.lim.n = maxRequestHead
	if n == 0 {
		tc.SetReadDeadline(time.Now().Add(s.cfg.PeekTimeout))
	} else {
		// Wait for the next request without holding the head deadline.
		tc.SetReadDeadline(time.Now().Add(max(s.cfg.IdleTimeout, 60*time.Second)))
		if _, err := it.cbr.Peek(1); err != nil {
			return false, ""
		}
		tc.SetReadDeadline(time.Now().Add(s.cfg.PeekTimeout))
	}
	req, err := http.ReadRequest(it.cbr)
	if err != nil {
		if errors.Is(err, io.EOF) && it.cbr.Buffered() == 0 {
			return false, ""
		}
		if n > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			return false, ""
		}
		return it.refuse(http.StatusBadRequest, "malformed request: "+err.Error())
	}
	it.lim.n = 1<<62 - 1
	tc.SetReadDeadline(time.Time{})

	if code, why := checkIntercepted(req); code != 0 {
		return it.refuse(code, why)
	}
	host := req.Host
	if host == "" {
		host = it.name
	}
	h, herr := hostOnly(host)
	hn, nerr := NormalizeName(h)
	if herr != nil || nerr != nil || hn != it.name {
		return it.refuse(http.StatusMisdirectedRequest, "request for host "+quoteShort(host)+" on a connection for "+it.name)
	}
	if it.x.m.exhausted() {
		return it.refuse(http.StatusTooManyRequests, byteLimitReason(it.x.m.limit))
	}

	hadCL := len(req.Header["Content-Length"]) > 0
	chunked := len(req.TransferEncoding) > 0
	stripHop(req.Header)
	req.Header.Del("Content-Length")
	for _, sh := range it.secrets {
		req.Header.Del(sh.Header) // and any other spelling Go canonicalized to it
		req.Header.Set(sh.Header, sh.Value)
	}
	uri := req.RequestURI
	if !strings.HasPrefix(uri, "/") && uri != "*" {
		uri = req.URL.RequestURI() // absolute form: the origin form of it
	}
	if err := it.ensureUp(); err != nil {
		return it.refuse(http.StatusBadGateway, "upstream: "+err.Error())
	}
	it.requests++

	// Send the request (head and body) while reading the response: the
	// upstream may answer (100 Continue, or early) before the body ends.
	type wresult struct {
		err        error
		clientSide bool // reading the sandbox's body failed
	}
	wc := make(chan wresult, 1)
	upRaw := it.upRaw
	bw := it.ubw
	go func() {
		cs, err := writeRequest(bw, req, uri, host, chunked, hadCL)
		if err != nil && (cs || errors.Is(err, errByteLimit)) {
			upRaw.Close() // the upstream would wait for the rest of the body
		}
		wc <- wresult{err, cs}
	}()
	var wr wresult
	wDone := false
	// waitWriter waits for the writer at most d (forever when d < 0).
	waitWriter := func(d time.Duration) bool {
		if wDone {
			return true
		}
		if d < 0 {
			wr, wDone = <-wc, true
			return true
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case wr = <-wc:
			wDone = true
		case <-t.C:
		}
		return wDone
	}
	// abort ends the connection, answering code (0: nothing, the response
	// has begun) unless the request body went past the byte limit.
	abort := func(code int, reason string) (bool, string) {
		it.closeUpRaw()
		if code != 0 && waitWriter(writerGrace) && errors.Is(wr.err, errByteLimit) {
			code, reason = http.StatusTooManyRequests, byteLimitReason(it.x.m.limit)
		}
		reason = scrubSecrets(reason, it.x.pol.Secrets)
		if code != 0 {
			writeRefusal(tc, code, reason)
		}
		it.raw.Close() // the writer may be reading a body from it
		waitWriter(-1)
		it.closeUp()
		return false, reason
	}

	var resp *http.Response
	for {
		resp, err = http.ReadResponse(it.ubr, req)
		if err != nil {
			return abort(http.StatusBadGateway, "upstream: "+err.Error())
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return abort(http.StatusBadGateway, "upstream switched protocols: upgrades are not proxied")
		}
		if resp.StatusCode >= 200 {
			break
		}
		// 1xx: pass it on and read the final response.
		stripHop(resp.Header)
		scrubHeader(resp.Header, it.x.pol.Secrets)
		it.writeStatus(resp)
		resp.Header.Write(it.cbw)
		it.cbw.WriteString("\r\n")
		if err := it.cbw.Flush(); err != nil {
			return abort(0, "")
		}
	}
	defer resp.Body.Close()

	keepUp := !resp.Close
	keepClient := !req.Close && req.ProtoAtLeast(1, 1)
	bodyless := req.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified
	chunkOut := false
	stripHop(resp.Header)
	scrubHeader(resp.Header, it.x.pol.Secrets)
	if !bodyless {
		resp.Header.Del("Content-Length")
		switch {
		case resp.ContentLength >= 0:
			resp.Header.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
		case keepClient:
			chunkOut = true
		default:
			keepClient = false // delimited by closing
		}
	}
	if !keepClient {
		resp.Header.Set("Connection", "close")
	}
	it.writeStatus(resp)
	resp.Header.Write(it.cbw)
	if chunkOut {
		it.cbw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	it.cbw.WriteString("\r\n")
	if err := it.cbw.Flush(); err != nil {
		return abort(0, "")
	}
	if !bodyless {
		upErr, cErr := it.copyResponseBody(resp.Body, chunkOut)
		switch {
		case upErr != nil:
			// The sandbox sees a truncated response and the connection end.
			return abort(0, "upstream: "+upErr.Error())
		case cErr != nil:
			return abort(0, "")
		}
	}
	// The response is complete; the request should be too. If the
	// sandbox is still sending a body the upstream did not wait for, the
	// connection cannot go on.
	if !waitWriter(writerGrace) || wr.err != nil {
		reason := ""
		if wDone && errors.Is(wr.err, errByteLimit) {
			reason = byteLimitReason(it.x.m.limit)
		}
		_, why := abort(0, reason)
		return false, why
	}
	if !keepUp {
		it.closeUp()
	}
	if !keepClient {
		tc.Close()
	}
	return keepClient, ""
}

// writeStatus writes resp's status line (secret values masked).
func (it *interceptor) writeStatus(resp *http.Response) {
	text := strings.TrimSpace(strings.TrimPrefix(resp.Status, strconv.Itoa(resp.StatusCode)))
	if text == "" {
		text = http.StatusText(resp.StatusCode)
	}
	text = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, scrubSecrets(text, it.x.pol.Secrets))
	fmt.Fprintf(it.cbw, "HTTP/1.1 %03d %s\r\n", resp.StatusCode, text)
}

// copyResponseBody streams body to the sandbox, chunked when chunk is
// set, flushing as it goes. upErr is a failure to read the upstream's
// body, cErr to write to the sandbox.
func (it *interceptor) copyResponseBody(body io.Reader, chunk bool) (upErr, cErr error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	w := it.cbw
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if chunk {
				fmt.Fprintf(w, "%x\r\n", n)
			}
			w.Write(buf[:n])
			if chunk {
				w.WriteString("\r\n")
			}
			if err := w.Flush(); err != nil {
				return nil, err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr, nil
		}
	}
	if chunk {
		w.WriteString("0\r\n\r\n")
	}
	return nil, w.Flush()
}

// checkIntercepted refuses (status and reason) the requests an
// intercepted connection does not proxy; 0 if req may go on.
func checkIntercepted(req *http.Request) (int, string) {
	switch {
	case req.ProtoMajor != 1:
		return http.StatusHTTPVersionNotSupported, "only HTTP/1 is proxied on a connection with secret headers"
	case req.Method == http.MethodConnect:
		return http.StatusMethodNotAllowed, "CONNECT inside an intercepted connection"
	case req.Method == http.MethodTrace || req.Method == "TRACK":
		// The upstream would echo the request, secrets included.
		return http.StatusMethodNotAllowed, req.Method + " is not proxied on a connection with secret headers"
	case len(req.Header.Values("Upgrade")) > 0:
		return http.StatusNotImplemented, "protocol upgrades are not proxied on a connection with secret headers"
	case req.URL.Scheme != "" && !strings.EqualFold(req.URL.Scheme, "https"):
		return http.StatusBadRequest, "scheme " + quoteShort(req.URL.Scheme) + " on a TLS connection"
	case req.URL.Opaque != "":
		// "https:x" would go upstream as the request target "x".
		return http.StatusBadRequest, "request target " + quoteShort(req.RequestURI) + " is neither a path nor an https:// URL"
	}
	return 0, ""
}

// writeRequest sends req upstream: request line (uri), Host, req's header
// (already stripped of hop-by-hop headers, with the secrets set), framing
// and the body, streamed, flushed as it arrives. clientSide reports that
// reading the sandbox's body failed.
func writeRequest(w *bufio.Writer, req *http.Request, uri, host string, chunked, hadCL bool) (clientSide bool, err error) {
	w.WriteString(req.Method)
	w.WriteString(" ")
	w.WriteString(uri)
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(host)
	w.WriteString("\r\n")
	if err := req.Header.Write(w); err != nil {
		return false, err
	}
	switch {
	case chunked:
		w.WriteString("Transfer-Encoding: chunked\r\n")
	case req.ContentLength > 0 || hadCL:
		fmt.Fprintf(w, "Content-Length: %d\r\n", max(req.ContentLength, 0))
	}
	w.WriteString("\r\n")
	if err := w.Flush(); err != nil {
		return false, err
	}
	if !chunked && req.ContentLength <= 0 {
		return false, nil
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for {
		n, rerr := req.Body.Read(buf)
		if n > 0 {
			if chunked {
				fmt.Fprintf(w, "%x\r\n", n)
			}
			w.Write(buf[:n])
			if chunked {
				w.WriteString("\r\n")
			}
			if err := w.Flush(); err != nil {
				return false, err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return true, rerr
		}
	}
	if chunked {
		w.WriteString("0\r\n\r\n")
	}
	return false, w.Flush()
}
