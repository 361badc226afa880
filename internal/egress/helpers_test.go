package egress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Tests stand in for the internet with servers on 127.0.0.2 and up, made
// public for the policy by Config.Public. 127.0.0.1 (a host address) is the
// sandbox's source address and where the proxies listen.

var loopbackPublic = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// fakeResolver maps names to addresses; a name's answers may change from
// call to call (DNS rebinding).
type fakeResolver struct {
	mu    sync.Mutex
	names map[string][][]netip.Addr // successive answers; the last repeats
	calls map[string]int
}

func newResolver() *fakeResolver {
	return &fakeResolver{names: map[string][][]netip.Addr{}, calls: map[string]int{}}
}

func (r *fakeResolver) set(name string, answers ...[]netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names[name] = answers
	r.calls[name] = 0
}

func (r *fakeResolver) callCount(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[name]
}

func (r *fakeResolver) Resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name = strings.ToLower(name)
	ans, ok := r.names[name]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	}
	i := min(r.calls[name], len(ans)-1)
	r.calls[name]++
	return ans[i], nil
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// eventLog collects Events.
type eventLog struct {
	mu  sync.Mutex
	evs []Event
}

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	l.evs = append(l.evs, e)
	l.mu.Unlock()
}

func (l *eventLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.evs...)
}

// wait returns the first event matching pred, waiting up to 5 s.
func (l *eventLog) wait(t testing.TB, what string, pred func(Event) bool) Event {
	t.Helper()
	return l.waitFrom(t, 0, what, pred)
}

// waitFrom is wait among the events from the from'th on (those logged
// after an earlier len(l.all())).
func (l *eventLog) waitFrom(t testing.TB, from int, what string, pred func(Event) bool) Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		evs := l.all()
		for _, e := range evs[min(from, len(evs)):] {
			if pred(e) {
				return e
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no event %s; have:\n%s", what, l.dump())
	return Event{}
}

func (l *eventLog) dump() string {
	var b strings.Builder
	for _, e := range l.all() {
		fmt.Fprintf(&b, "  %+v\n", e)
	}
	return b.String()
}

type harness struct {
	t       testing.TB
	srv     *Server
	pol     atomic.Pointer[Policy]
	res     *fakeResolver
	log     *eventLog
	origDst sync.Map // client source port → netip.AddrPort

	tproxy net.Listener // transparent
	eproxy net.Listener // explicit
	dnsUDP net.PacketConn
	dnsTCP net.Listener
}

const sandboxID = "sb1"

var sandboxSrc = netip.MustParseAddr("127.0.0.1")

func newHarness(t testing.TB, pol Policy, mod func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, res: newResolver(), log: &eventLog{}}
	h.pol.Store(&pol)
	cfg := Config{
		Sandbox: func(src netip.Addr) (string, Policy, bool) {
			if src != sandboxSrc {
				return "", Policy{}, false
			}
			return sandboxID, *h.pol.Load(), true
		},
		Resolve:         h.res.Resolve,
		Public:          loopbackPublic,
		Log:             h.log.add,
		OriginalDst:     h.originalDst,
		PeekTimeout:     2 * time.Second,
		ServerFirstWait: 100 * time.Millisecond,
		DialTimeout:     2 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	h.srv = New(cfg)
	var err error
	if h.tproxy, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if h.eproxy, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if h.dnsUDP, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if h.dnsTCP, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 3)
	go func() { done <- h.srv.ServeTransparent(h.tproxy) }()
	go func() { done <- h.srv.ServeProxy(h.eproxy) }()
	go func() { done <- h.srv.ServeDNS(h.dnsUDP, h.dnsTCP) }()
	// Wait for the Serve methods to register their sockets: a Close
	// before that would make them return ErrServerClosed.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		h.srv.mu.Lock()
		n := len(h.srv.listeners) + len(h.srv.packets)
		h.srv.mu.Unlock()
		if n == 4 || time.Now().After(deadline) {
			break
		}
	}
	t.Cleanup(func() {
		h.srv.Close()
		for range 3 {
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Serve returned %v after Close", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Serve did not return after Close")
				return
			}
		}
	})
	return h
}

func (h *harness) setPolicy(p Policy) { h.pol.Store(&p) }

// originalDst stands in for SO_ORIGINAL_DST: the test registers where each
// client connection "was going" by its source port.
func (h *harness) originalDst(c net.Conn) (netip.AddrPort, error) {
	port := addrPortOf(c.RemoteAddr()).Port()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if v, ok := h.origDst.Load(port); ok {
			return v.(netip.AddrPort), nil
		}
		time.Sleep(time.Millisecond)
	}
	return netip.AddrPort{}, fmt.Errorf("no original destination registered for port %d", port)
}

// dialTransparent connects to the transparent proxy as if the sandbox had
// connected to dst and been redirected.
func (h *harness) dialTransparent(dst netip.AddrPort) (net.Conn, error) {
	return h.dialTransparentFrom("", dst)
}

func (h *harness) dialTransparentFrom(local string, dst netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	c, err := d.Dial("tcp", h.tproxy.Addr().String())
	if err != nil {
		return nil, err
	}
	h.origDst.Store(addrPortOf(c.LocalAddr()).Port(), dst)
	return c, nil
}

// transparentClient is an HTTP client whose connections all go through the
// transparent proxy, "redirected" from where they were going.
func (h *harness) transparentClient(tlsConf *tls.Config) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return nil, fmt.Errorf("test client wants an address, got %q", addr)
			}
			return h.dialTransparent(ap)
		},
		TLSClientConfig:   tlsConf,
		DisableKeepAlives: true,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// ---- upstream servers ----

var (
	certOnce sync.Once
	certTLS  tls.Certificate
	certPool *x509.CertPool
)

// testCert is a self-signed certificate for example.com and *.example.com.
func testCert(t testing.TB) (tls.Certificate, *x509.CertPool) {
	certOnce.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber:          big.NewInt(1),
			Subject:               pkix.Name{CommonName: "den egress test"},
			NotBefore:             time.Now().Add(-time.Hour),
			NotAfter:              time.Now().Add(24 * time.Hour),
			DNSNames:              []string{"example.com", "*.example.com", "*.example.org"},
			KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
			ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			BasicConstraintsValid: true,
			IsCA:                  true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			panic(err)
		}
		leaf, _ := x509.ParseCertificate(der)
		certTLS = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
		certPool = x509.NewCertPool()
		certPool.AddCert(leaf)
	})
	return certTLS, certPool
}

type upstream struct {
	addr     netip.AddrPort
	accepted atomic.Int64
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// startHTTP serves HTTP (TLS when tlsOn) on ip, answering with tag and
// what it saw of the request.
func startHTTP(t testing.TB, ip, tag string, tlsOn bool) *upstream {
	t.Helper()
	return startHTTPAt(t, netip.AddrPortFrom(netip.MustParseAddr(ip), 0), tag, tlsOn)
}

func startHTTPAt(t testing.TB, at netip.AddrPort, tag string, tlsOn bool) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", at.String())
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: addrPortOf(ln.Addr())}
	var l net.Listener = countingListener{ln, &u.accepted}
	if tlsOn {
		cert, _ := testCert(t)
		l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}})
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s host=%s uri=%s proxy-connection=%q x-hop=%q body=%d", tag, r.Host, r.RequestURI,
			r.Header.Get("Proxy-Connection"), r.Header.Get("X-Hop"), len(body))
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return u
}

// startEcho echoes what it reads; when banner is set, it sends it first.
func startEcho(t testing.TB, ip, banner string) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: addrPortOf(ln.Addr())}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.accepted.Add(1)
			go func() {
				defer c.Close()
				if banner != "" {
					io.WriteString(c, banner)
				}
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return u
}

// readAllTimeout reads c until EOF or the timeout.
func readAllTimeout(c net.Conn, d time.Duration) ([]byte, error) {
	c.SetReadDeadline(time.Now().Add(d))
	return io.ReadAll(c)
}

// rawRequest sends req to the explicit proxy and returns the response.
func (h *harness) rawRequest(t testing.TB, req string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", h.eproxy.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the proxy's answer to %q: %v", req, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}
