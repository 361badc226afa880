package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/egress"
	"github.com/den-dev/den/internal/host"
	"github.com/den-dev/den/internal/isolate/linux"
	"github.com/den-dev/den/internal/sandbox"
	"github.com/den-dev/den/internal/testenv/e2e"
)

// The tests' stand-in for the internet: a network namespace the test makes,
// reached from the host through a veth, holding 198.51.100.10 and
// 2001:db8:5::10 (documentation ranges the egress servers treat as public
// in tests only), and 198.51.100.11. It serves HTTP on port 80 and a TCP
// echo that greets first on 2222 (198.51.100.10 and 2001:db8:5::10), HTTPS
// on 443 (198.51.100.10) and a UDP echo on 7 (all three addresses).
const (
	inetAddr  = "198.51.100.10"
	inet6Addr = "2001:db8:5::10"
	// inetAddr2 is a second address of the test internet, with only the
	// UDP echo.
	inetAddr2 = "198.51.100.11"
	// echoGreeting is the first line of the TCP echo on 2222: what shows
	// it was reached.
	echoGreeting = "greetings from the test internet's echo"
	// webGreeting starts every answer of the test internet's web server.
	webGreeting = "hello from the test internet"
)

type inet struct {
	ns   netns.NsHandle
	name string
	host string // the veth's host end
	nw   *host.Network
	// cert is the test servers' certificate (trusted by the egress
	// proxy's upstream TLS): tests serving HTTPS on other ports use it.
	cert tls.Certificate
}

func newInet(t *testing.T) *inet {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("network tests need nftables (apt-get install nftables)")
	}
	in := &inet{name: fmt.Sprintf("dentinet%d", os.Getpid()%100000), host: fmt.Sprintf("dti%d", os.Getpid()%100000)}
	netns.DeleteNamed(in.name)
	if l, err := netlink.LinkByName(in.host); err == nil {
		netlink.LinkDel(l)
	}
	runtime.LockOSThread()
	orig, _ := netns.Get()
	ns, err := netns.NewNamed(in.name)
	netns.Set(orig)
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatalf("create test namespace: %v", err)
	}
	in.ns = ns
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(in.host); err == nil {
			netlink.LinkDel(l)
		}
		ns.Close()
		netns.DeleteNamed(in.name)
	})
	la := netlink.NewLinkAttrs()
	la.Name = in.host
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: in.host + "p"}); err != nil {
		t.Fatal(err)
	}
	hostEnd, _ := netlink.LinkByName(in.host)
	peer, _ := netlink.LinkByName(in.host + "p")
	netlink.AddrAdd(hostEnd, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("198.51.100.1"), Mask: net.CIDRMask(24, 32)}})
	netlink.LinkSetUp(hostEnd)
	if err := netlink.LinkSetNsFd(peer, int(ns)); err != nil {
		t.Fatal(err)
	}
	h, _ := netlink.NewHandleAt(ns)
	defer h.Close()
	p, _ := h.LinkByName(in.host + "p")
	h.AddrAdd(p, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(inetAddr), Mask: net.CIDRMask(24, 32)}})
	h.AddrAdd(p, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(inetAddr2), Mask: net.CIDRMask(24, 32)}})
	// IPv6, without duplicate address detection (it would hold the
	// addresses back for a second).
	netlink.AddrAdd(hostEnd, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("2001:db8:5::1"), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD})
	h.AddrAdd(p, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(inet6Addr), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD})
	h.LinkSetUp(p)
	lo, _ := h.LinkByName("lo")
	h.LinkSetUp(lo)
	for _, a := range []string{inetAddr, inetAddr2, inet6Addr} {
		pc := in.listenPacket(t, a, 7)
		go func() { // UDP echo, saying whom it answers (masquerading shows)
			buf := make([]byte, 2048)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(append(buf[:n:n], " from "+from.(*net.UDPAddr).IP.String()...), from)
			}
		}()
	}
	return in
}

// inNS runs f on a thread in the test namespace.
func (in *inet) inNS(f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, _ := netns.Get()
	defer orig.Close()
	defer netns.Set(orig)
	netns.Set(in.ns)
	f()
}

// listen opens a listener inside the test namespace on inetAddr (or addr).
func (in *inet) listen(t *testing.T, port int, addr ...string) net.Listener {
	t.Helper()
	a := inetAddr
	if len(addr) > 0 {
		a = addr[0]
	}
	var ln net.Listener
	var err error
	in.inNS(func() { ln, err = net.Listen("tcp", net.JoinHostPort(a, strconv.Itoa(port))) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// listenPacket opens a UDP socket inside the test namespace.
func (in *inet) listenPacket(t *testing.T, addr string, port int) net.PacketConn {
	t.Helper()
	var pc net.PacketConn
	var err error
	in.inNS(func() { pc, err = net.ListenPacket("udp", net.JoinHostPort(addr, strconv.Itoa(port))) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc
}

func selfSigned(t *testing.T, names ...string) tls.Certificate {
	return selfSignedAt(t, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), names...)
}

// selfSignedAt is a self-signed CA certificate for names, valid from
// notBefore to notAfter.
func selfSignedAt(t *testing.T, notBefore, notAfter time.Time, names ...string) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: notBefore, NotAfter: notAfter,
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// newNetEnv is newEnv with sandbox networking: its own bridge, nftables
// table and egress servers, and a fake resolver for the test names.
func newNetEnv(t *testing.T) (*env, *inet) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network tests need root")
	}
	in := newInet(t)
	web := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, err := strconv.Atoi(r.URL.Query().Get("bytes")); err == nil && n > 0 {
			w.Write(make([]byte, n))
			return
		}
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "hello from the test internet, host %s", r.Host)
		if a := r.Header.Get("Authorization"); a != "" {
			fmt.Fprintf(w, ", authorization %s", a)
		}
	})}
	go web.Serve(in.listen(t, 80))
	go web.Serve(in.listen(t, 80, inet6Addr))
	serverCert := selfSigned(t, "allowed.test", "other.test", "www.allowed.test", "api.example.test")
	in.cert = serverCert
	tlsLn := tls.NewListener(in.listen(t, 443), &tls.Config{Certificates: []tls.Certificate{serverCert}})
	upstreamRoots := x509.NewCertPool()
	leaf, _ := x509.ParseCertificate(serverCert.Certificate[0])
	upstreamRoots.AddCert(leaf)
	go web.Serve(tlsLn)
	for _, a := range []string{inetAddr, inet6Addr} {
		echo := in.listen(t, 2222, a)
		go func() {
			for {
				c, err := echo.Accept()
				if err != nil {
					return
				}
				go func() { io.WriteString(c, echoGreeting+"\n"); io.Copy(c, c); c.Close() }()
			}
		}()
	}
	t.Cleanup(func() { web.Close() })

	// Free ports for the egress servers, IPv4 and IPv6 (as den serve
	// listens on the bridge's two gateway addresses).
	ports := make([]int, 3)
	lns := make([]net.Listener, 3)
	lns6 := make([]net.Listener, 3)
	for i := range ports {
		ln, err := net.Listen("tcp4", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i], ports[i] = ln, ln.Addr().(*net.TCPAddr).Port
		if lns6[i], err = net.Listen("tcp6", fmt.Sprintf("[::]:%d", ports[i])); err != nil {
			t.Fatal(err)
		}
	}
	pc, err := net.ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", ports[1]))
	if err != nil {
		t.Fatal(err)
	}
	pc6, err := net.ListenPacket("udp6", fmt.Sprintf("[::]:%d", ports[1]))
	if err != nil {
		t.Fatal(err)
	}
	n := os.Getpid() % 200
	nw, err := host.NewNetwork(host.NetworkConfig{
		Bridge: fmt.Sprintf("dent%d", os.Getpid()%100000), Table: fmt.Sprintf("dentest%d", os.Getpid()%100000),
		Subnet:      netip.MustParsePrefix(fmt.Sprintf("10.201.%d.0/24", n)),
		Transparent: ports[0], DNS: ports[1], HTTPProxy: ports[2],
	})
	if err != nil {
		t.Fatal(err)
	}
	in.nw = nw
	t.Cleanup(func() {
		exec.Command("nft", "delete", "table", "inet", fmt.Sprintf("dentest%d", os.Getpid()%100000)).Run()
		if l, err := netlink.LinkByName(fmt.Sprintf("dent%d", os.Getpid()%100000)); err == nil {
			netlink.LinkDel(l)
		}
	})

	st, err := e2e.Open(t.TempDir(), "net", linux.Config{Network: nw})
	if err != nil {
		t.Fatal(err)
	}
	st.Config.Egress = &sandbox.Egress{Gateway: nw.Gateway(), HTTPProxy: ports[2], AddrSlot: nw.Slot, SlotAddr: nw.Addr}
	if err := st.Start(); err != nil {
		t.Fatal(err)
	}
	e := &env{s: st, db: st.DB, data: st.Data, rt: st.Runtime}
	e.started()
	m := e.m
	names := map[string][]netip.Addr{
		"allowed.test":     {netip.MustParseAddr(inetAddr)},
		"www.allowed.test": {netip.MustParseAddr(inetAddr)},
		"other.test":       {netip.MustParseAddr(inetAddr)},
		"api.example.test": {netip.MustParseAddr(inetAddr)},
		"private.test":     {netip.MustParseAddr("10.1.2.3")},
		"metadata.test":    {netip.MustParseAddr("169.254.169.254")},
		"v6.test":          {netip.MustParseAddr(inet6Addr)}, // AAAA only
		"evilallowed.test": {netip.MustParseAddr(inetAddr)},
		"ula.test":         {netip.MustParseAddr("fd12:3456::1")},
	}
	eg := egress.New(egress.Config{
		Sandbox: m.SandboxForAddr, Log: m.NetEvent,
		Public: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8::/32")},
		Deny:   []netip.Prefix{nw.Subnet(), nw.Subnet6()},
		CA:     m.SandboxCA, Attribute: m.Attribute,
		UpstreamTLS: &tls.Config{RootCAs: upstreamRoots},
		Resolve: func(ctx context.Context, name string) ([]netip.Addr, error) {
			if a, ok := names[strings.TrimSuffix(strings.ToLower(name), ".")]; ok {
				return a, nil
			}
			return nil, fmt.Errorf("no such host %s", name)
		},
	})
	m.SetNetSync(func() { eg.Sync(2 * time.Second) }) // as den serve does
	go eg.ServeTransparent(lns[0])
	go eg.ServeDNS(pc, lns[1])
	go eg.ServeProxy(lns[2])
	go eg.ServeTransparent(lns6[0])
	go eg.ServeDNS(pc6, lns6[1])
	go eg.ServeProxy(lns6[2])
	t.Cleanup(func() {
		st.Close()
		eg.Close()
	})
	return e, in
}

// curl runs curl in the sandbox and returns its output (stdout+stderr) and exit code.
func curl(t *testing.T, e *env, id string, args ...string) (string, int) {
	t.Helper()
	r, err := e.c.Exec(context.Background(), id, api.ExecRequest{Cmd: append([]string{"curl", "-sS", "--max-time", "5"}, args...), Timeout: api.Duration(20 * time.Second)})
	if err != nil {
		t.Fatalf("curl %v: %v", args, err)
	}
	return string(r.Stdout) + string(r.Stderr), r.ExitCode
}

// tcpRead connects from sandbox id to host:port, sends nothing and prints
// what the server says first ("" when the connection is closed on it).
func tcpRead(t *testing.T, e *env, id, host string, port int) string {
	t.Helper()
	r, err := e.c.Exec(context.Background(), id, api.ExecRequest{Cmd: []string{"python3", "-c", `
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), 10)
    s.settimeout(10)
    print(s.recv(200).decode(errors="replace"))
except OSError as e:
    print("refused", e.__class__.__name__)
`, host, strconv.Itoa(port)}, Timeout: api.Duration(30 * time.Second)})
	if err != nil {
		t.Fatalf("tcp probe: %v", err)
	}
	return string(r.Stdout) + string(r.Stderr)
}

// curlFrom is a control: curl in sandbox id, returning its output.
func curlFrom(t *testing.T, e *env, id string, args ...string) func() string {
	return func() string { out, _ := curl(t, e, id, args...); return out }
}

func TestNetworkPolicy(t *testing.T) {
	e, in := newNetEnv(t)
	ctx := context.Background()
	// The control: a sandbox allowed everything public, and the test
	// internet's address by CIDR, reaches every target of the test
	// internet the sandboxes below are refused.
	ctl := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetOpen, AllowCIDR: []string{inetAddr + "/32"}}})
	// The default: loopback only.
	plain := e.create(t, api.CreateRequest{})
	out, _ := curl(t, e, ctl.ID, "--noproxy", "*", "http://"+inetAddr+"/")
	reached(t, "the internet by address", out, webGreeting)
	if out, code := curl(t, e, plain.ID, "--noproxy", "*", "http://"+inetAddr+"/"); code == 0 || strings.Contains(out, webGreeting) {
		t.Fatalf("a sandbox without network reached the internet: %s", out)
	}
	// It has no interface but loopback: nothing it tries reaches den.
	if evs := netEvents(t, e, plain.ID); len(evs) != 0 {
		t.Fatalf("a sandbox without network has egress events: %+v", evs)
	}
	sb := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test", "*.allowed.test", "private.test", "metadata.test"}}})
	if sb.Address == "" {
		t.Fatalf("networked sandbox has no address: %+v", sb)
	}
	// A program ignoring proxy variables goes through the transparent proxy.
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "http://allowed.test/"); code != 0 || !strings.Contains(out, webGreeting) {
		t.Fatalf("allowed name, transparent: %d %s", code, out)
	}
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "-k", "https://www.allowed.test/"); code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("allowed name over TLS (SNI): %d %s", code, out)
	}
	// Through HTTP(S)_PROXY, which den sets.
	if out, code := curl(t, e, sb.ID, "-k", "https://allowed.test/"); code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("allowed name via the explicit proxy: %d %s", code, out)
	}
	// The proxy dials the address it resolved itself, not the one the
	// sandbox connected to (10.1.2.3, which never leaves the host: the
	// sandbox's connection is redirected to den): allowed, and safe.
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "-k", "--resolve", "allowed.test:443:10.1.2.3", "https://allowed.test/"); code != 0 || !strings.Contains(out, "hello") {
		t.Errorf("spoofed SNI: the proxy should dial the checked address: %d %s", code, out)
	}
	// Host listeners on the gateway and on the host's loopback: the host
	// reaches them, no sandbox does.
	gw := in.nw.Gateway().String()
	gwPort, gwAccepted := hostListener(t, "tcp4", gw+":0")
	loPort, loAccepted := hostListener(t, "tcp4", "127.0.0.1:0")
	_, _, proxyPort := in.nw.Ports()
	explicitProxy := fmt.Sprintf("http://%s:%d", gw, proxyPort)
	for _, c := range []struct {
		what    string
		args    []string      // curl in sb; nil: tcpRead of the control's target
		ctl     bool          // the control: the same curl in ctl
		control func() string // else what a position allowed to reach the target gets; nil: none possible (see why)
		answer  string        // what the target answers
		reason  string        // in the denial's reason
		match   func(egress.Event) bool
	}{
		{"another name", []string{"--noproxy", "*", "--resolve", "other.test:80:" + inetAddr, "http://other.test/"},
			true, nil, webGreeting + ", host other.test", "name not in allow list", connectNamed("other.test")},
		{"an IP literal", []string{"--noproxy", "*", "http://" + inetAddr + "/"},
			true, nil, webGreeting, "address " + inetAddr + " not in allow-cidr", connectTo(inetAddr, 80)},
		{"a decimal literal through the explicit proxy", []string{"-x", explicitProxy, "http://3325256714/"},
			true, nil, webGreeting, "address " + inetAddr + " not in allow-cidr", connectTo(inetAddr, 80)},
		// No control: 10.1.2.3 is outside the test's namespaces. The name
		// is allowed, so only the resolved address can be the reason.
		{"an allowed name resolving to a private address", []string{"--noproxy", "*", "--resolve", "private.test:80:" + inetAddr, "http://private.test/"},
			false, nil, webGreeting, "private 10.0.0.0/8", connectNamed("private.test")},
		// No control: the metadata address is never dialed from here.
		{"the metadata address", []string{"--noproxy", "*", "http://169.254.169.254/"},
			false, nil, "", "cloud metadata service", connectTo("169.254.169.254", 80)},
		{"an allowed name resolving to the metadata address", []string{"--noproxy", "*", "--resolve", "metadata.test:80:" + inetAddr, "http://metadata.test/"},
			false, nil, webGreeting, "cloud metadata service", connectNamed("metadata.test")},
		{"the gateway", []string{"--noproxy", "*", "--http0.9", fmt.Sprintf("http://%s:%d/", gw, gwPort)},
			false, func() string { return hostControl(t, fmt.Sprintf("%s:%d", gw, gwPort), gwAccepted) },
			hostGreeting, "is the host", connectTo(gw, gwPort)},
		{"a look-alike name", []string{"--noproxy", "*", "--resolve", "evilallowed.test:80:" + inetAddr, "http://evilallowed.test/"},
			true, nil, webGreeting + ", host evilallowed.test", "name not in allow list", connectNamed("evilallowed.test")},
		{"raw tcp", nil,
			false, func() string { return tcpRead(t, e, ctl.ID, inetAddr, 2222) },
			echoGreeting, "address " + inetAddr + " not in allow-cidr", connectTo(inetAddr, 2222)},
		{"the host's loopback, a hex literal through the explicit proxy", []string{"--noproxy", "", "-x", explicitProxy, "--http0.9", fmt.Sprintf("http://0x7f000001:%d/", loPort)},
			false, func() string { return hostControl(t, fmt.Sprintf("127.0.0.1:%d", loPort), loAccepted) },
			hostGreeting, "loopback", func(ev egress.Event) bool { return ev.Kind == egress.KindConnect && ev.Port == loPort }},
	} {
		if c.ctl {
			c.control = curlFrom(t, e, ctl.ID, c.args...)
		}
		if c.control != nil {
			reached(t, c.what, c.control(), c.answer)
		}
		var out string
		if c.args == nil {
			out = tcpRead(t, e, sb.ID, inetAddr, 2222)
		} else {
			out, _ = curl(t, e, sb.ID, c.args...)
		}
		refused(t, e, sb.ID, c.what, out, c.answer, c.reason, c.match)
	}
	noneAccepted(t, "the gateway", gwAccepted)
	noneAccepted(t, "the host's loopback", loAccepted)
	// Another sandbox is not reachable: its server answers den's port
	// proxy and itself, not sb.
	other := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetOpen}})
	sandboxServer(t, e, other.ID, other.Address)
	out, _ = curl(t, e, sb.ID, "--noproxy", "*", "http://"+other.Address+":80/")
	betweenSandboxes(t, e, sb.ID, "another sandbox", out, other.Address)
	// Every denial has a reason.
	for _, ev := range netEvents(t, e, sb.ID) {
		if ev.Verdict == egress.VerdictDeny && ev.Reason == "" {
			t.Errorf("deny without a reason: %+v", ev)
		}
	}
	// Live changes: open lets other.test through; none cuts everything.
	if _, err := e.c.SetNetwork(ctx, sb.ID, api.NetworkPolicy{Mode: api.NetOpen}); err != nil {
		t.Fatal(err)
	}
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "http://other.test/"); code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("open mode: %d %s", code, out)
	}
	// No control: 10.1.2.3 is outside the test's namespaces (open mode
	// allows the name: only the address can be the reason).
	from := len(netEvents(t, e, sb.ID))
	if out, _ := curl(t, e, sb.ID, "--noproxy", "*", "--resolve", "private.test:80:"+inetAddr, "http://private.test/"); strings.Contains(out, webGreeting) {
		t.Fatalf("open mode reached a private address: %s", out)
	}
	wantEventFrom(t, e, sb.ID, from, "open mode, a name resolving to a private address", func(ev egress.Event) bool {
		return connectNamed("private.test")(ev) && ev.Verdict == egress.VerdictDeny && strings.Contains(ev.Reason, "private 10.0.0.0/8")
	})
	if _, err := e.c.SetNetwork(ctx, sb.ID, api.NetworkPolicy{Mode: api.NetNone}); err != nil {
		t.Fatal(err)
	}
	// The control: sb reached allowed.test above.
	from = len(netEvents(t, e, sb.ID))
	if out, _ := curl(t, e, sb.ID, "--noproxy", "*", "--resolve", "allowed.test:80:"+inetAddr, "http://allowed.test/"); strings.Contains(out, webGreeting) {
		t.Fatalf("none mode still reaches out: %s", out)
	}
	// Mode none takes the sandbox's interface away: nothing reaches den.
	if got, err := e.c.Get(ctx, sb.ID); err != nil || got.Address != "" {
		t.Fatalf("none mode: the sandbox keeps an address: %v %+v", err, got)
	}
	if evs := netEvents(t, e, sb.ID); len(evs) != from {
		t.Fatalf("none mode: egress events after the network went: %+v", evs[from:])
	}
	// A plain sandbox gains a network live.
	if _, err := e.c.SetNetwork(ctx, plain.ID, api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test"}}); err != nil {
		t.Fatal(err)
	}
	if out, code := curl(t, e, plain.ID, "--noproxy", "*", "http://allowed.test/"); code != 0 {
		t.Fatalf("after a live attach: %d %s", code, out)
	}
	// Bad policies: clear errors.
	for _, bad := range []api.NetworkPolicy{{Mode: "sometimes"}, {Mode: api.NetAllow, Allow: []string{"exa mple.com"}}, {Mode: api.NetAllow, AllowCIDR: []string{"10.0.0.0/33"}}} {
		_, err := e.c.SetNetwork(ctx, sb.ID, bad)
		wantKind(t, err, api.KindInvalid)
	}
}

// Bypasses a sandbox might try: DNS tunnelling, raw and packet sockets,
// IPv6, UDP other than DNS. Each is refused, and the sandbox keeps working.
func TestNetworkBypasses(t *testing.T) {
	e, in := newNetEnv(t)
	sb := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test", "v6.test"}}})
	// A UDP listener on the test internet: nothing may arrive there from
	// sb. The control: a sandbox whose allow_cidr names it gets through.
	udp := in.listenPacket(t, inetAddr, 9999)
	got := make(chan string, 10)
	go func() {
		buf := make([]byte, 100)
		for {
			n, _, err := udp.ReadFrom(buf)
			if err != nil {
				close(got)
				return
			}
			got <- string(buf[:n])
		}
	}()
	ctl := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, AllowCIDR: []string{inetAddr + "/32"}}})
	e.sh(t, ctl.ID, `python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"control", ("`+inetAddr+`", 9999))'`)
	select {
	case msg := <-got:
		reached(t, "UDP to the test internet", msg, "control")
	case <-time.After(20 * time.Second):
		t.Fatal("control: a datagram from a sandbox whose allow_cidr names the listener did not arrive")
	}
	drops := forwardDrops(t)
	script := `
import socket, struct
def q(name, qtype):
    pkt = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        pkt += bytes([len(label)]) + label.encode()
    pkt += b"\0" + struct.pack(">HH", qtype, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    s.sendto(pkt, ("8.8.8.8", 53))
    r = s.recv(512)
    return r[3] & 0x0f, struct.unpack(">H", r[6:8])[0]
print("txt", q("allowed.test", 16))
print("tunnel", q("a"*60 + ".b"*20 + ".exfil.example", 1))
print("a", q("allowed.test", 1))
print("other", q("other.test", 1))
for fam, typ, proto, what in ((socket.AF_PACKET, socket.SOCK_RAW, 0, "packet"), (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, "raw")):
    try:
        socket.socket(fam, typ, proto); print(what, "open")
    except PermissionError:
        print(what, "denied")
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"leak", ("` + inetAddr + `", 9999))
def v6(host): # IPv6 goes to the proxy like IPv4
    try:
        s6 = socket.create_connection(("` + inet6Addr + `", 80), timeout=5)
        s6.sendall(b"GET / HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n"); s6.settimeout(5)
        got = b""
        while True:
            d = s6.recv(4096)
            if not d: break
            got += d
        return got.decode(errors="replace").split("\r\n\r\n")[-1] or "closed"
    except OSError as e:
        return "error " + e.__class__.__name__
print("v6 allowed:", v6("v6.test"))
print("v6 denied:", v6("other.test"))
`
	r, err := e.c.Exec(context.Background(), sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", script}, Timeout: api.Duration(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	udp.SetReadDeadline(time.Now().Add(500 * time.Millisecond)) // the datagram had its chance
	out := string(r.Stdout)
	// rcode 5 = REFUSED; rcode 0 with answers for an allowed A query.
	for _, want := range []string{"txt (5, 0)", "tunnel (5, 0)", "a (0, 1)", "other (5, 0)", "packet denied", "raw denied"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("want %q in:\n%s%s", want, out, r.Stderr)
		}
	}
	for msg := range got {
		t.Fatalf("a UDP datagram left the sandbox: %q", msg)
	}
	// UDP is dropped by the kernel, not den: no event; the forward
	// chain's drop counter says so.
	if n := forwardDrops(t); n <= drops {
		t.Fatalf("the UDP datagram was not counted as dropped (%d before, %d after)", drops, n)
	}
	// IPv6: an allowed name reaches the test internet's IPv6 server
	// (the control); a denied one, to the same address, does not.
	lines := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, ": "); ok {
			lines[k] = v
		}
	}
	reached(t, "IPv6 with an allowed name", lines["v6 allowed"], webGreeting+", host v6.test")
	refused(t, e, sb.ID, "IPv6 with a denied name", lines["v6 denied"], webGreeting, "name not in allow list", func(ev egress.Event) bool {
		return connectTo(inet6Addr, 80)(ev) && ev.Name == "other.test"
	})
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "http://allowed.test/"); code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("the sandbox stopped working: %d %s", code, out)
	}
}

// Shared ports: a server bound only to the sandbox's loopback is reached
// through den's reverse proxy (HTTP and WebSocket), private by default.
func TestPreviewPorts(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	srv := e.startProc(t, sb.ID, `exec python3 -c '
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = ("path=" + self.path + " host=" + self.headers.get("Host", "")).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
'`)
	_ = srv
	var p api.Preview
	for i := 0; i < 50; i++ { // wait for the server to listen
		r := e.sh(t, sb.ID, "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000), 1)' 2>/dev/null && echo up")
		if string(r.Stdout) == "up\n" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	status, b := e.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/ports", strings.NewReader(`{"port": 8000}`))
	if status != 201 || json.Unmarshal(b, &p) != nil || p.Token == "" || p.Public {
		t.Fatalf("share: %d %s", status, b)
	}
	if status, b := e.raw(t, "GET", p.Path+"hello?x=1", nil); status != 404 {
		t.Fatalf("private preview without a token: %d %s", status, b)
	}
	status, b = e.raw(t, "GET", p.Path+"hello?x=1&den_token="+p.Token, nil)
	if status != 200 || !strings.HasPrefix(string(b), "path=/hello?x=1 ") {
		t.Fatalf("preview: %d %s", status, b)
	}
	if status, _ := e.raw(t, "GET", p.Path+"?den_token=wrong", nil); status != 404 {
		t.Fatalf("wrong token: %d", status)
	}
	// Public: no token; unshare: gone.
	e.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/ports", strings.NewReader(`{"port": 8000, "public": true}`))
	if status, _ := e.raw(t, "GET", p.Path, nil); status != 200 {
		t.Fatalf("public preview: %d", status)
	}
	if status, _ := e.raw(t, "DELETE", "/v1/sandboxes/"+sb.ID+"/ports/8000", nil); status != 204 {
		t.Fatalf("unshare: %d", status)
	}
	if status, _ := e.raw(t, "GET", p.Path, nil); status != 404 {
		t.Fatalf("after unshare: %d", status)
	}
	// Raw TCP (den forward) over a WebSocket.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", e.sock)
	}}}
	c, _, err := websocket.Dial(ctx, "ws://den/v1/sandboxes/"+sb.ID+"/ports/8000/tcp", &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	c.Write(ctx, websocket.MessageBinary, []byte("GET /raw HTTP/1.0\r\n\r\n"))
	var got strings.Builder
	for !strings.Contains(got.String(), "path=/raw") {
		_, msg, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("tcp forward: %v (got %q)", err, got.String())
		}
		got.Write(msg)
	}
	c.CloseNow()
	if status, _ := e.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/ports/9/tcp", nil); status != 409 {
		t.Fatalf("a closed port: %d", status)
	}
}

// Secret headers: the proxy adds them to HTTPS requests for their host;
// the value appears nowhere in the sandbox.
func TestSecretHeaders(t *testing.T) {
	e, _ := newNetEnv(t)
	ctx := context.Background()
	const secret = "s3cr3t-token-value-9f2c"
	if status, b := e.raw(t, "PUT", "/v1/secrets/API_TOKEN", strings.NewReader(secret)); status != 204 {
		t.Fatalf("set secret: %d %s", status, b)
	}
	status, b := e.raw(t, "GET", "/v1/secrets", nil)
	if status != 200 || strings.Contains(string(b), secret) || !strings.Contains(string(b), "API_TOKEN") {
		t.Fatalf("list secrets: %d %s", status, b)
	}
	sb := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{
		Mode: api.NetAllow, Allow: []string{"allowed.test", "other.test"},
		SecretHeaders: []api.SecretHeader{{Host: "allowed.test", Header: "Authorization", Value: "Bearer ${API_TOKEN}"}},
	}})
	// Through the transparent proxy (no proxy variables) and through HTTPS_PROXY.
	for _, args := range [][]string{{"--noproxy", "*", "https://allowed.test/"}, {"https://allowed.test/"}} {
		out, code := curl(t, e, sb.ID, args...)
		if code != 0 || !strings.Contains(out, "authorization Bearer "+secret) {
			t.Fatalf("secret header via %v: %d %s", args, code, out)
		}
	}
	// A sandbox-supplied Authorization is replaced; other hosts get nothing.
	if out, _ := curl(t, e, sb.ID, "--noproxy", "*", "-H", "Authorization: Bearer forged", "https://allowed.test/"); !strings.Contains(out, secret) || strings.Contains(out, "forged") {
		t.Fatalf("header replacement: %s", out)
	}
	if out, _ := curl(t, e, sb.ID, "--noproxy", "*", "-k", "https://other.test/"); !strings.Contains(out, webGreeting+", host other.test") || strings.Contains(out, "authorization") {
		t.Fatalf("another host: want its answer without the secret: %s", out)
	}
	e.sh(t, sb.ID, "sleep 30 >/dev/null 2>&1 &") // a process to look at besides the agent
	secretAbsent(t, e, sb, secret, 2)
	// The sandbox record keeps the reference, not the value.
	got, _ := e.c.Get(ctx, sb.ID)
	if doc, _ := json.Marshal(got); strings.Contains(string(doc), secret) {
		t.Fatalf("the API shows the secret: %s", doc)
	}
	// Connections are attributed to the exec that made them.
	evs, _ := e.c.Events(ctx, client.EventFilter{Sandbox: sb.ID, Type: "net.connect"})
	attributed := 0
	for _, ev := range evs {
		var d egress.Event
		json.Unmarshal(ev.Data, &d)
		if strings.Contains(d.Process, "curl") {
			attributed++
		}
		if strings.Contains(string(ev.Data), secret) {
			t.Fatalf("the audit log holds the secret: %s", ev.Data)
		}
	}
	if attributed == 0 {
		t.Fatalf("no connection attributed to its process in %d events", len(evs))
	}
	// An unknown secret reference is refused up front.
	_, err := e.c.Create(ctx, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test"},
		SecretHeaders: []api.SecretHeader{{Host: "allowed.test", Header: "Authorization", Value: "${NO_SUCH_SECRET_X}"}}}})
	wantKind(t, err, api.KindInvalid)
}

// secretAbsent checks that secret is nowhere inside sb, from the host, so
// the check itself does not carry it in: not in the sandbox's files (its
// writable layers), nor in the environment or command line of any of its
// processes (at least minProcs of them). It returns the pids it looked at.
func secretAbsent(t *testing.T, e *env, sb *api.Sandbox, secret string, minProcs int) []int {
	t.Helper()
	filepath.WalkDir(filepath.Join(e.data, "sandboxes", sb.ID, "upper"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), secret) {
				t.Errorf("the secret is in the sandbox's file %s", p)
			}
		}
		return nil
	})
	ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", sb.Pid))
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		if l, _ := os.Readlink("/proc/" + ent.Name() + "/ns/pid"); l != ns {
			continue
		}
		pids = append(pids, pid)
		for _, f := range []string{"environ", "cmdline"} {
			if b, _ := os.ReadFile("/proc/" + ent.Name() + "/" + f); strings.Contains(string(b), secret) {
				t.Errorf("the secret is in /proc/%s/%s of a sandbox process", ent.Name(), f)
			}
		}
	}
	if len(pids) < minProcs {
		t.Fatalf("looked at %d sandbox processes, want at least %d", len(pids), minProcs)
	}
	return pids
}

// Per-sandbox limits: connection rate, total egress bytes, bandwidth.
func TestNetworkLimits(t *testing.T) {
	e, _ := newNetEnv(t)
	ctx := context.Background()
	allow := []string{"allowed.test"}
	// Connection rate: 2 per second; a burst of 8 gets some refused.
	rl := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: allow, ConnRate: 2}})
	r := e.sh(t, rl.ID, "ok=0; for i in 1 2 3 4 5 6 7 8; do curl -s --noproxy '*' --max-time 3 http://allowed.test/ | grep -q hello && ok=$((ok+1)); done; echo $ok")
	if n, _ := strconv.Atoi(strings.TrimSpace(string(r.Stdout))); n < 1 || n > 5 {
		t.Fatalf("with conn_rate 2/s, %d of 8 immediate connections succeeded", n)
	}
	// Egress bytes: a request within the 2 KB limit reaches the server
	// (the control); a 35 KB upload passes the limit; the next is refused.
	eb := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: allow, MaxEgress: 2048}})
	out, _ := curl(t, e, eb.ID, "--noproxy", "*", "http://allowed.test/")
	reached(t, "a request within max_egress", out, webGreeting)
	curl(t, e, eb.ID, "--noproxy", "*", "--data-binary", "@/usr/share/common-licenses/GPL-3", "http://allowed.test/")
	from := len(netEvents(t, e, eb.ID))
	out, _ = curl(t, e, eb.ID, "--noproxy", "*", "http://allowed.test/")
	if strings.Contains(out, webGreeting) {
		t.Fatalf("past max_egress: %s", out)
	}
	wantEventFrom(t, e, eb.ID, from, "the request past max_egress", func(ev egress.Event) bool {
		return connectTo(inetAddr, 80)(ev) && ev.Verdict == egress.VerdictDeny && strings.Contains(ev.Reason, "egress byte limit reached (2048 bytes)")
	})
	// Bandwidth: 300 KB at 100 KB/s takes about 3 s.
	bw := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: allow, Bandwidth: 100 << 10}})
	start := time.Now()
	out, code := curl(t, e, bw.ID, "--noproxy", "*", "--max-time", "20", "-o", "/dev/null", "-w", "%{size_download}", "http://allowed.test/?bytes=307200")
	if d := time.Since(start); code != 0 || strings.TrimSpace(out) != "307200" || d < 2*time.Second || d > 15*time.Second {
		t.Fatalf("300 KB at 100 KB/s: code %d, %q bytes, %v", code, out, d)
	}
	// Lifting the limit live makes it fast.
	if _, err := e.c.SetNetwork(ctx, bw.ID, api.NetworkPolicy{Mode: api.NetAllow, Allow: allow}); err != nil {
		t.Fatal(err)
	}
	// 3 MB would take 30 s at the old 100 KB/s: within curl's 10 s only
	// if the limit is really gone.
	if out, code := curl(t, e, bw.ID, "--noproxy", "*", "--max-time", "10", "-o", "/dev/null", "-w", "%{size_download}", "http://allowed.test/?bytes=3145728"); code != 0 || strings.TrimSpace(out) != "3145728" {
		t.Fatalf("without the limit, 3 MB in 10 s: curl exit %d, %q bytes", code, out)
	}
}

// netEvents returns the sandbox's egress events.
func netEvents(t *testing.T, e *env, id string) []egress.Event {
	t.Helper()
	evs, err := e.c.Events(context.Background(), client.EventFilter{Sandbox: id, Type: "net."})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]egress.Event, 0, len(evs))
	for _, ev := range evs {
		var d egress.Event
		json.Unmarshal(ev.Data, &d)
		out = append(out, d)
	}
	return out
}

// wantEvent fails unless one of the sandbox's egress events matches
// within 5 s (events reach the log asynchronously).
func wantEvent(t *testing.T, e *env, id, what string, match func(egress.Event) bool) {
	t.Helper()
	wantEventFrom(t, e, id, 0, what, match)
}

// wantEventFrom is wantEvent among the sandbox's events from the from'th
// on (those logged after an earlier count of them).
func wantEventFrom(t *testing.T, e *env, id string, from int, what string, match func(egress.Event) bool) {
	t.Helper()
	if msg := findEvent(t, e, id, from, what, match); msg != "" {
		t.Fatal(msg)
	}
}

// findEvent waits up to 5 s for an event of the sandbox's, from the
// from'th on, to match; it returns "" or why none did, listing them.
func findEvent(t *testing.T, e *env, id string, from int, what string, match func(egress.Event) bool) string {
	t.Helper()
	var evs []egress.Event
	for i := 0; i < 50; i++ {
		evs = netEvents(t, e, id)
		for _, ev := range evs[min(from, len(evs)):] {
			if match(ev) {
				return ""
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "  %s %s %s %s:%d %s: %s [process %q, unknown %q]\n", ev.Kind, ev.Name, ev.QType, ev.Addr, ev.Port, ev.Verdict, ev.Reason, ev.Process, ev.ProcessUnknown)
	}
	return fmt.Sprintf("no event for %s in:\n%s", what, b.String())
}

// Negative checks. Each "cannot reach X" first shows X answering from a
// control position (reached: a sandbox or the host allowed to reach it),
// then that the sandbox under test gets nothing of that answer and that
// den logged the denial, with its reason (refused). A target no control can
// reach on this machine (cloud metadata, private ranges, NAT64: the tests
// never send traffic beyond loopback and their own namespaces) has no
// control; its check rests on the reason naming the range.

// reached fails unless out (what the control got from the target) holds
// answer, the target's identifying answer.
func reached(t *testing.T, what, out, answer string) {
	t.Helper()
	if !strings.Contains(out, answer) {
		t.Fatalf("%s: the control did not reach the target (want %q): %s", what, answer, out)
	}
}

// refused fails unless out (what the sandbox got trying the target) lacks
// answer and the sandbox's log holds a denial matching, whose reason
// contains reason. The test goes on (the other cases of a table get
// checked too).
func refused(t *testing.T, e *env, id, what, out, answer, reason string, match func(egress.Event) bool) {
	t.Helper()
	if answer != "" && strings.Contains(out, answer) {
		t.Errorf("%s: reached the target: %s", what, out)
		return
	}
	if msg := findEvent(t, e, id, 0, fmt.Sprintf("%s (a denial with reason %q; the sandbox got %q)", what, reason, out), func(ev egress.Event) bool {
		return ev.Verdict == egress.VerdictDeny && strings.Contains(ev.Reason, reason) && match(ev)
	}); msg != "" {
		t.Error(msg)
	}
}

// connectTo matches a connection event to addr:port.
func connectTo(addr string, port int) func(egress.Event) bool {
	return func(ev egress.Event) bool {
		return ev.Kind == egress.KindConnect && ev.Addr == addr && ev.Port == port
	}
}

// connectNamed matches a connection event for name.
func connectNamed(name string) func(egress.Event) bool {
	return func(ev egress.Event) bool { return ev.Kind == egress.KindConnect && ev.Name == name }
}

// hostGreeting is what hostListener's listeners send to whoever connects.
const hostGreeting = "hello from a host listener"

// hostListener listens on the host at addr (port 0: any) and greets every
// connection; it returns the port and a channel of the connections'
// sources.
func hostListener(t *testing.T, network, addr string) (int, chan string) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan string, 100)
	go greetAll(ln, accepted)
	return ln.Addr().(*net.TCPAddr).Port, accepted
}

// greetAll accepts ln's connections until it closes, sending each source
// to accepted and hostGreeting to the connection.
func greetAll(ln net.Listener, accepted chan<- string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		accepted <- c.RemoteAddr().String()
		io.WriteString(c, hostGreeting+"\n")
		c.Close()
	}
}

// hostControl dials a hostListener from the host (the control: the host
// reaches it) and returns what it said.
func hostControl(t *testing.T, addr string, accepted chan string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("control: the host cannot reach its own listener on %s: %v", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	<-accepted
	return string(b)
}

// noneAccepted fails if a hostListener accepted a connection since its
// control.
func noneAccepted(t *testing.T, what string, accepted chan string) {
	t.Helper()
	select {
	case from := <-accepted:
		t.Fatalf("%s: the host listener accepted a connection from %s", what, from)
	default:
	}
}

// sandboxGreeting is what sandboxServer answers.
const sandboxGreeting = "hello from a server in another sandbox"

// sandboxServer starts an HTTP-ish server on port 80 (all addresses, IPv4
// and IPv6) in sandbox id, and proves it answers: through den's port
// proxy (the daemon dialing inside the sandbox) and from the sandbox
// itself to each of addrs (its own bridge addresses).
func sandboxServer(t *testing.T, e *env, id string, addrs ...string) {
	t.Helper()
	e.startProc(t, id, `exec python3 -c '
import socket, threading
def serve(c):
    c.settimeout(5)
    try: c.recv(4096)
    except OSError: pass
    c.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n`+sandboxGreeting+`\n"); c.close()
ls = socket.socket(socket.AF_INET6); ls.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); ls.bind(("::", 80)); ls.listen(16)
while True:
    c, _ = ls.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
'`)
	var c net.Conn
	var err error
	for i := 0; i < 100; i++ { // until it listens
		if c, err = e.m.DialPort(context.Background(), id, 80); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("control: the server in sandbox %s does not answer den's port proxy: %v", id, err)
	}
	io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	c.Close()
	reached(t, "the other sandbox's server, through den's port proxy", string(b), sandboxGreeting)
	for _, a := range addrs {
		h := a
		if strings.Contains(a, ":") {
			h = "[" + a + "]"
		}
		out, _ := curl(t, e, id, "--noproxy", "*", "http://"+h+":80/")
		reached(t, "the other sandbox's server, from itself at "+a, out, sandboxGreeting)
	}
}

// betweenSandboxes is refused for a connection from sandbox id to another
// sandbox's address. Such a connection never reaches den, so no event can
// explain it: the bridge drops it (every port isolated, so the two never
// resolve each other's link addresses, and what crosses the bridge is not
// routed). The reason checked is that mechanism: every port of the test
// bridge isolated, and no event for the address (den dialed nothing).
func betweenSandboxes(t *testing.T, e *env, id, what, out, addr string) {
	t.Helper()
	if strings.Contains(out, sandboxGreeting) {
		t.Fatalf("%s: reached the target: %s", what, out)
	}
	br, err := netlink.LinkByName(fmt.Sprintf("dent%d", os.Getpid()%100000))
	if err != nil {
		t.Fatal(err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	ports := 0
	for _, l := range links {
		if l.Attrs().MasterIndex != br.Attrs().Index {
			continue
		}
		ports++
		pi, err := netlink.LinkGetProtinfo(l)
		if err != nil {
			t.Fatal(err)
		}
		if !pi.Isolated {
			t.Fatalf("%s: bridge port %s is not isolated (sandbox %s got %q)", what, l.Attrs().Name, id, out)
		}
	}
	if ports < 2 {
		t.Fatalf("%s: the bridge has %d ports, want the two sandboxes'", what, ports)
	}
	for _, ev := range netEvents(t, e, id) {
		if ev.Addr == addr {
			t.Fatalf("%s: an event for the other sandbox's address: %+v", what, ev)
		}
	}
}

// forwardDrops reads the test table's counter of what the forward chain
// drops from the bridge (UDP no allow_cidr rule names; den never sees it).
func forwardDrops(t *testing.T) int {
	t.Helper()
	table := fmt.Sprintf("dentest%d", os.Getpid()%100000)
	out, err := exec.Command("nft", "list", "chain", "inet", table, "forward").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list chain: %v: %s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		// iifname "dentN" counter packets P bytes B drop
		if len(f) == 8 && f[0] == "iifname" && f[2] == "counter" && f[3] == "packets" && f[7] == "drop" {
			n, err := strconv.Atoi(f[4])
			if err != nil {
				t.Fatalf("nft counter %q: %v", l, err)
			}
			return n
		}
	}
	t.Fatalf("no drop counter in the forward chain:\n%s", out)
	return 0
}

// udpDropped fails unless the sandbox's datagram to addr's UDP echo gets
// no answer and is counted by the forward chain's drop rule (the kernel
// drops it: den logs nothing). The caller shows the echo answering first.
func udpDropped(t *testing.T, e *env, id, addr, what string) {
	t.Helper()
	before := forwardDrops(t)
	if got := udpPing(t, e, id, addr); got != "timeout" {
		t.Fatalf("%s: %q", what, got)
	}
	if n := forwardDrops(t); n <= before {
		t.Fatalf("%s: not counted as dropped by the forward chain (%d before, %d after)", what, before, n)
	}
}

// udpProbe sends "ping" to addr:port from the sandbox and prints the
// answer ("echo ...") or "timeout".
const udpProbe = `
import socket, sys
fam = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(fam, socket.SOCK_DGRAM); s.settimeout(2)
s.sendto(b"ping", (sys.argv[1], int(sys.argv[2])))
try:
    print("echo", s.recv(200).decode())
except socket.timeout:
    print("timeout")
`

func udpPing(t *testing.T, e *env, id, addr string) string {
	t.Helper()
	r, err := e.c.Exec(context.Background(), id, api.ExecRequest{Cmd: []string{"python3", "-c", udpProbe, addr, "7"}, Timeout: api.Duration(20 * time.Second)})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("udp probe: %v %s", err, r.Stderr)
	}
	return strings.TrimSpace(string(r.Stdout))
}

// dnsQuery asks the resolver at server (any address: den redirects DNS)
// for name and prints "rcode answers".
const dnsQuery = `
import socket, struct, sys
server, name, qtype = sys.argv[1], sys.argv[2], int(sys.argv[3])
pkt = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
for label in name.split("."):
    pkt += bytes([len(label)]) + label.encode()
pkt += b"\0" + struct.pack(">HH", qtype, 1)
s = socket.socket(socket.AF_INET6 if ":" in server else socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
s.sendto(pkt, (server, 53))
r = s.recv(512)
print(r[3] & 0x0f, struct.unpack(">H", r[6:8])[0])
`

func dnsAsk(t *testing.T, e *env, id, server, name string, qtype int) string {
	t.Helper()
	r, err := e.c.Exec(context.Background(), id, api.ExecRequest{Cmd: []string{"python3", "-c", dnsQuery, server, name, strconv.Itoa(qtype)}, Timeout: api.Duration(20 * time.Second)})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("dns query: %v %s", err, r.Stderr)
	}
	return strings.TrimSpace(string(r.Stdout))
}

// UDP leaves a sandbox only to the destinations its allow_cidr rules name
// (forwarded and masqueraded), live policy changes included; all other UDP
// but DNS is dropped, and DNS goes to den's DNS whatever its destination.
func TestNetworkUDP(t *testing.T) {
	e, _ := newNetEnv(t)
	ctx := context.Background()
	table := fmt.Sprintf("dentest%d", os.Getpid()%100000)
	withCIDR := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test"},
		AllowCIDR: []string{inetAddr + "/32", inet6Addr + "/128"}}})
	plain := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test"}}})
	if got := udpPing(t, e, withCIDR.ID, inetAddr); got != "echo ping from 198.51.100.1" {
		t.Fatalf("UDP to an allow_cidr destination: %q (want the echo, from the host's masqueraded address)", got)
	}
	// (The control: withCIDR's echo above.)
	udpDropped(t, e, plain.ID, inetAddr, "UDP without an allow_cidr rule")
	// DNS to an allowed address still goes to den's DNS (the test internet
	// has no DNS server: an answer proves it).
	if got := dnsAsk(t, e, withCIDR.ID, inetAddr, "allowed.test", 1); got != "0 1" {
		t.Fatalf("DNS to an allow_cidr address: %q", got)
	}
	// IPv6 under the same rule, where the kernel forwards IPv6 per interface.
	if _, err := os.Stat("/proc/sys/net/ipv6/conf/all/force_forwarding"); err == nil {
		if got := udpPing(t, e, withCIDR.ID, inet6Addr); got != "echo ping from 2001:db8:5::1" {
			t.Fatalf("UDP over IPv6 to an allow_cidr destination: %q", got)
		}
		udpDropped(t, e, plain.ID, inet6Addr, "UDP over IPv6 without an allow_cidr rule")
	} else {
		t.Log("this kernel has no per-interface IPv6 forwarding (force_forwarding, Linux 6.17): IPv6 UDP stays dropped")
		// The control: the host reaches the echo; the sandbox's datagram is
		// not forwarded at all (no forward hook, no counter).
		c, err := net.Dial("udp", net.JoinHostPort(inet6Addr, "7"))
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("ping"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 100)
		n, _ := c.Read(b)
		c.Close()
		reached(t, "the IPv6 UDP echo, from the host", string(b[:n]), "ping from 2001:db8:5::1")
		if got := udpPing(t, e, plain.ID, inet6Addr); got != "timeout" {
			t.Fatalf("UDP over IPv6 without an allow_cidr rule: %q", got)
		}
	}
	// Live: a CIDR added lets UDP out at once; taken away, it stops.
	if _, err := e.c.SetNetwork(ctx, plain.ID, api.NetworkPolicy{Mode: api.NetOpen, AllowCIDR: []string{"198.51.100.0/24"}}); err != nil {
		t.Fatal(err)
	}
	if got := udpPing(t, e, plain.ID, inetAddr); got != "echo ping from 198.51.100.1" {
		t.Fatalf("UDP after a live allow_cidr change: %q", got)
	}
	// Another destination than the CIDR names: reached by plain's wider
	// rule (the control), dropped for withCIDR.
	if got := udpPing(t, e, plain.ID, inetAddr2); got != "echo ping from 198.51.100.1" {
		t.Fatalf("control: UDP to %s under a /24 allow_cidr: %q", inetAddr2, got)
	}
	udpDropped(t, e, withCIDR.ID, inetAddr2, "UDP outside the allow_cidr rule")
	if _, err := e.c.SetNetwork(ctx, plain.ID, api.NetworkPolicy{Mode: api.NetOpen}); err != nil {
		t.Fatal(err)
	}
	udpDropped(t, e, plain.ID, inetAddr, "UDP after the allow_cidr rule was taken away")
	// Removing a sandbox takes its rules away (its teardown runs in the
	// background).
	if err := e.c.Remove(ctx, withCIDR.ID, true); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		out, _ := exec.Command("nft", "list", "set", "inet", table, "udp4").CombinedOutput()
		if !strings.Contains(string(out), withCIDR.Address+" ") {
			break
		}
		if i == 100 {
			t.Fatalf("a removed sandbox keeps its UDP rule:\n%s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// IPv6 follows the same policy as IPv4: TCP goes to the transparent proxy,
// DNS to den's DNS; blocked ranges, the gateway and other sandboxes are
// refused and logged.
func TestNetworkIPv6(t *testing.T) {
	e, in := newNetEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test", "v6.test", "ula.test"}}})
	other := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetOpen}})
	r := e.sh(t, sb.ID, "ip -6 addr show dev eth0 scope global 2>/dev/null || cat /proc/net/if_inet6")
	slot, _ := in.nw.Slot(netip.MustParseAddr(sb.Address))
	mine, _ := in.nw.Addr6(slot)
	if a := strings.ReplaceAll(mine.StringExpanded(), ":", ""); !strings.Contains(string(r.Stdout), mine.String()) && !strings.Contains(string(r.Stdout), a) {
		t.Fatalf("the sandbox has no IPv6 address %s:\n%s%s", mine, r.Stdout, r.Stderr)
	}
	// A name with only an AAAA record, over IPv6, through the transparent
	// proxy (no proxy variables).
	out, code := curl(t, e, sb.ID, "--noproxy", "*", "-w", " remote=%{remote_ip}", "http://v6.test/")
	if code != 0 || !strings.Contains(out, "hello from the test internet, host v6.test") || !strings.Contains(out, "remote="+inet6Addr) {
		t.Fatalf("allowed AAAA-only name over IPv6: %d %s", code, out)
	}
	// DNS over IPv6 to any address is den's: allowed AAAA answered, TXT refused.
	if got := dnsAsk(t, e, sb.ID, "2001:4860:4860::8888", "v6.test", 28); got != "0 1" {
		t.Fatalf("AAAA over IPv6 DNS: %q", got)
	}
	if got := dnsAsk(t, e, sb.ID, "2001:4860:4860::8888", "v6.test", 16); got != "5 0" {
		t.Fatalf("TXT over IPv6 DNS: %q", got)
	}
	if got := dnsAsk(t, e, sb.ID, inetAddr, "ula.test", 28); got == "0 1" {
		t.Fatalf("DNS answered a unique local address: %q", got)
	}
	gw6 := in.nw.Gateway6()
	oslot, _ := in.nw.Slot(netip.MustParseAddr(other.Address))
	other6, _ := in.nw.Addr6(oslot)
	// Controls: a sandbox whose allow_cidr names the test internet's IPv6
	// address, and a host listener on the IPv6 gateway.
	ctl := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, AllowCIDR: []string{inet6Addr + "/128"}}})
	gwPort, gwAccepted := hostListener(t, "tcp6", net.JoinHostPort(gw6.String(), "0"))
	gwTarget := net.JoinHostPort(gw6.String(), strconv.Itoa(gwPort))
	for _, c := range []struct {
		what    string
		args    []string      // curl in sb, after --noproxy '*'
		control func() string // nil: no control possible (see why)
		answer  string
		reason  string
		match   func(egress.Event) bool
	}{
		{"v6 literal", []string{"-g", "http://[" + inet6Addr + "]/"},
			curlFrom(t, e, ctl.ID, "--noproxy", "*", "-g", "http://["+inet6Addr+"]/"),
			webGreeting, "address " + inet6Addr + " not in allow-cidr", connectTo(inet6Addr, 80)},
		{"v6 gateway", []string{"-g", "--http0.9", "http://" + gwTarget + "/"},
			func() string { return hostControl(t, gwTarget, gwAccepted) },
			hostGreeting, "is the host", connectTo(gw6.String(), gwPort)},
		// No control: 10.1.2.3 is outside the test's namespaces.
		{"v4-mapped private", []string{"-g", "http://[::ffff:10.1.2.3]/"},
			nil, "", "private 10.0.0.0/8", connectTo("10.1.2.3", 80)},
		// No control: NAT64 addresses route nowhere here (this one embeds
		// the test internet's address; dialing it would leave the host).
		{"NAT64", []string{"-g", "http://[64:ff9b::c633:640a]/"},
			nil, "", "NAT64 64:ff9b::/96", connectTo("64:ff9b::c633:640a", 80)},
		// No control: fd12:3456::1 is outside the test's namespaces. The
		// name is allowed: only its address can be the reason.
		{"unique local name", []string{"-g", "--resolve", "ula.test:80:[" + inet6Addr + "]", "http://ula.test/"},
			nil, webGreeting, "unique local fc00::/7", connectNamed("ula.test")},
	} {
		if c.control != nil {
			reached(t, c.what, c.control(), c.answer)
		}
		out, _ := curl(t, e, sb.ID, append([]string{"--noproxy", "*"}, c.args...)...)
		refused(t, e, sb.ID, c.what, out, c.answer, c.reason, c.match)
	}
	noneAccepted(t, "v6 gateway", gwAccepted)
	// Another sandbox over IPv6: its server answers den's port proxy and
	// itself (IPv4 and IPv6), never sb.
	sandboxServer(t, e, other.ID, other.Address, other6.String())
	out, _ = curl(t, e, sb.ID, "--noproxy", "*", "-g", "--max-time", "3", "http://["+other6.String()+"]:80/")
	betweenSandboxes(t, e, sb.ID, "v6 other sandbox", out, other6.String())
	// An allow_cidr rule naming the address lets the literal through.
	if _, err := e.c.SetNetwork(ctx, sb.ID, api.NetworkPolicy{Mode: api.NetAllow, AllowCIDR: []string{inet6Addr + "/128"}}); err != nil {
		t.Fatal(err)
	}
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "-g", "http://["+inet6Addr+"]/"); code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("v6 literal named by allow_cidr: %d %s", code, out)
	}
}

// A CONNECT relay inside the sandbox does not get around the policy: its
// own connections are redirected to den's proxy like any other, so what
// it relays to a denied destination is denied and logged, and the sandbox
// keeps working.
func TestNetworkConnectRelay(t *testing.T) {
	e, _ := newNetEnv(t)
	sb := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test"}}})
	e.startProc(t, sb.ID, `exec python3 -c '
import socket, threading
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d: break
            b.sendall(d)
    except OSError: pass
    try: b.shutdown(socket.SHUT_WR)
    except OSError: pass
def handle(c):
    req = b""
    while b"\r\n\r\n" not in req:
        d = c.recv(4096)
        if not d: return c.close()
        req += d
    line = req.split(b"\r\n")[0].split()
    if len(line) < 2 or line[0] != b"CONNECT":
        c.sendall(b"HTTP/1.1 405 CONNECT only\r\n\r\n"); return c.close()
    host, _, port = line[1].decode().rpartition(":")
    try:
        u = socket.create_connection((host.strip("[]"), int(port)), 5)
    except OSError as e:
        c.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n"); return c.close()
    c.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
    pipe(c, u)
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", 8888)); ls.listen(16)
while True:
    c, _ = ls.accept(); threading.Thread(target=handle, args=(c,), daemon=True).start()
'`)
	client := `
import socket, sys
def via(target, host):
    for i in range(50):
        try:
            s = socket.create_connection(("127.0.0.1", 8888), 5); break
        except OSError:
            import time; time.sleep(0.1)
    s.settimeout(10)
    s.sendall(b"CONNECT " + target.encode() + b" HTTP/1.1\r\nHost: " + target.encode() + b"\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(1)
        if not d: return "relay closed"
        head += d
    if b" 200 " not in head.split(b"\r\n")[0]:
        return "relay said " + head.split(b"\r\n")[0].decode()
    s.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\nConnection: close\r\n\r\n")
    body = b""
    try:
        while True:
            d = s.recv(4096)
            if not d: break
            body += d
    except OSError as e:
        return "error " + str(e)
    text = body.decode(errors="replace")
    if text.startswith("HTTP/"): # an HTTP answer: its body
        text = text.split("\r\n\r\n", 1)[-1]
    return text.replace("\n", " ") or "closed without an answer"
print("allowed:", via("` + inetAddr + `:80", "allowed.test"))
print("denied-name:", via("` + inetAddr + `:80", "other.test"))
print("denied-raw:", via("` + inetAddr + `:2222", ""))
print("again:", via("` + inetAddr + `:80", "allowed.test"))
`
	r, err := e.c.Exec(context.Background(), sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", client}, Timeout: api.Duration(60 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, l := range strings.Split(string(r.Stdout), "\n") {
		if k, v, ok := strings.Cut(l, ": "); ok {
			got[k] = v
		}
	}
	if !strings.Contains(got["allowed"], "hello from the test internet, host allowed.test") || !strings.Contains(got["again"], "hello") {
		t.Fatalf("allowed through the relay:\n%s%s", r.Stdout, r.Stderr)
	}
	// The controls: the web server answered "allowed" above, through the
	// relay; the echo on 2222 greets a sandbox whose allow_cidr names it.
	ctl := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, AllowCIDR: []string{inetAddr + "/32"}}})
	reached(t, "the echo on 2222", tcpRead(t, e, ctl.ID, inetAddr, 2222), echoGreeting)
	for k, answer := range map[string]string{"denied-name": webGreeting, "denied-raw": echoGreeting} {
		if v, ok := got[k]; !ok || strings.Contains(v, answer) {
			t.Fatalf("%s through the relay: %q\n%s%s", k, v, r.Stdout, r.Stderr)
		}
	}
	// curl through the relay (it resolves the name itself, through den's DNS).
	if out, code := curl(t, e, sb.ID, "-p", "-x", "http://127.0.0.1:8888", "http://allowed.test/"); code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("curl through the relay: %d %s", code, out)
	}
	if out, code := curl(t, e, sb.ID, "-p", "-x", "http://127.0.0.1:8888", "http://other.test/"); code == 0 && strings.Contains(out, "hello") {
		t.Fatalf("curl through the relay to a denied name: %s", out)
	}
	wantEvent(t, e, sb.ID, "the relayed denied name", func(ev egress.Event) bool {
		return ev.Kind == egress.KindConnect && ev.Name == "other.test" && ev.Verdict == egress.VerdictDeny && strings.Contains(ev.Reason, "name not in allow list")
	})
	wantEvent(t, e, sb.ID, "the relayed raw connection", func(ev egress.Event) bool {
		return connectTo(inetAddr, 2222)(ev) && ev.Verdict == egress.VerdictDeny && strings.Contains(ev.Reason, "not in allow-cidr")
	})
	// The sandbox keeps working, directly too.
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "http://allowed.test/"); code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("the sandbox stopped working: %d %s", code, out)
	}
}

// Denials name the process that made them, as allowed connections do: DNS
// queries refused (over UDP, from a resolver that closes its socket as soon
// as it has the answer, and over TCP) and connections refused at once. An
// event whose process cannot be found says why.
func TestNetworkDenialsAttributed(t *testing.T) {
	e, in := newNetEnv(t)
	sb := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test"}}})
	// byExec matches an event attributed to the agent's process running cmd.
	byExec := func(cmd string) func(egress.Event) bool {
		return func(ev egress.Event) bool {
			id, rest, _ := strings.Cut(ev.Process, " (")
			_, err := strconv.Atoi(strings.TrimPrefix(id, "p"))
			return strings.HasPrefix(id, "p") && err == nil && strings.HasPrefix(rest, cmd+" ") && ev.ProcessUnknown == ""
		}
	}
	both := func(a, b func(egress.Event) bool) func(egress.Event) bool {
		return func(ev egress.Event) bool { return a(ev) && b(ev) }
	}
	// The control: an allowed connection names its exec.
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "http://allowed.test/"); code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("allowed name: %d %s", code, out)
	}
	wantEvent(t, e, sb.ID, "the allowed connection, attributed", both(byExec("curl"), func(ev egress.Event) bool {
		return ev.Kind == egress.KindConnect && ev.Name == "allowed.test" && ev.Verdict == egress.VerdictAllow
	}))
	// DNS: a denied name over UDP (python, as dnsAsk does), the C library's
	// resolver (getent), and over TCP.
	if got := dnsAsk(t, e, sb.ID, "8.8.8.8", "other.test", 1); got != "5 0" {
		t.Fatalf("denied name: %q", got)
	}
	wantEvent(t, e, sb.ID, "the denied DNS query over UDP, attributed", both(byExec("python3"), func(ev egress.Event) bool {
		return ev.Kind == egress.KindDNS && ev.Name == "other.test" && ev.Verdict == egress.VerdictDeny
	}))
	if got := dnsAsk(t, e, sb.ID, "2001:4860:4860::8888", "over-ipv6.test", 28); got != "5 0" {
		t.Fatalf("denied name over IPv6: %q", got)
	}
	wantEvent(t, e, sb.ID, "the denied DNS query over IPv6, attributed", both(byExec("python3"), func(ev egress.Event) bool {
		return ev.Kind == egress.KindDNS && ev.Name == "over-ipv6.test" && ev.Verdict == egress.VerdictDeny
	}))
	if r, err := e.c.Exec(context.Background(), sb.ID, api.ExecRequest{Cmd: []string{"getent", "ahostsv4", "denied-by-libc.test"}, Timeout: api.Duration(20 * time.Second)}); err != nil || r.ExitCode == 0 {
		t.Fatalf("getent of a denied name: %v %+v", err, r)
	}
	wantEvent(t, e, sb.ID, "the C library's denied query, attributed", both(byExec("getent"), func(ev egress.Event) bool {
		return ev.Kind == egress.KindDNS && ev.Name == "denied-by-libc.test" && ev.Verdict == egress.VerdictDeny
	}))
	tcpQuery := `
import socket, struct
q = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"\x0aover-tcp-x\x04test\x00" + struct.pack(">HH", 1, 1)
s = socket.create_connection(("8.8.8.8", 53), 5)
s.sendall(struct.pack(">H", len(q)) + q)
r = s.recv(512)
print(r[5] & 0x0f)
`
	if r, err := e.c.Exec(context.Background(), sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", tcpQuery}, Timeout: api.Duration(20 * time.Second)}); err != nil || strings.TrimSpace(string(r.Stdout)) != "5" {
		t.Fatalf("DNS over TCP: %v %s%s", err, r.Stdout, r.Stderr)
	}
	wantEvent(t, e, sb.ID, "the denied DNS query over TCP, attributed", both(byExec("python3"), func(ev egress.Event) bool {
		return ev.Kind == egress.KindDNS && ev.Name == "over-tcp-x.test" && ev.Verdict == egress.VerdictDeny
	}))
	// Connections refused at once: the gateway (refused before anything
	// is read), a private address literal (after the request is read),
	// and a denied name through the explicit proxy.
	// Each target answers a control first (a sandbox allowed to reach it,
	// or the host), but for 10.1.2.3, outside the test's namespaces.
	gw := in.nw.Gateway().String()
	gwPort, gwAccepted := hostListener(t, "tcp4", gw+":0")
	ctl := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetOpen, AllowCIDR: []string{inet6Addr + "/128"}}})
	for _, c := range []struct {
		what    string
		args    []string
		control func() string
		answer  string
		reason  string
		match   func(egress.Event) bool
	}{
		{"the gateway", []string{"--noproxy", "*", "--http0.9", fmt.Sprintf("http://%s:%d/", gw, gwPort)},
			func() string { return hostControl(t, fmt.Sprintf("%s:%d", gw, gwPort), gwAccepted) },
			hostGreeting, "is the host", connectTo(gw, gwPort)},
		{"a private literal", []string{"--noproxy", "*", "http://10.1.2.3/"},
			nil, "", "private 10.0.0.0/8", connectTo("10.1.2.3", 80)},
		{"the explicit proxy", []string{"http://other.test/"},
			curlFrom(t, e, ctl.ID, "http://other.test/"),
			webGreeting, "name not in allow list", connectNamed("other.test")},
		{"an IPv6 literal", []string{"--noproxy", "*", "telnet://[" + inet6Addr + "]:2222"},
			func() string { return tcpRead(t, e, ctl.ID, inet6Addr, 2222) },
			echoGreeting, "not in allow-cidr", connectTo(inet6Addr, 2222)},
	} {
		if c.control != nil {
			reached(t, c.what, c.control(), c.answer)
		}
		out, _ := curl(t, e, sb.ID, c.args...)
		refused(t, e, sb.ID, c.what+", attributed", out, c.answer, c.reason, both(byExec("curl"), c.match))
	}
	noneAccepted(t, "the gateway", gwAccepted)
	// A query whose process does not wait for the answer: whether den
	// found it or not, the event is never silently without a process.
	fire := `
import socket, struct
q = struct.pack(">HHHHHH", 9, 0x0100, 1, 0, 0, 0) + b"\x0bfire-forget\x04test\x00" + struct.pack(">HH", 1, 1)
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(q, ("8.8.8.8", 53))
`
	if r, err := e.c.Exec(context.Background(), sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", fire}, Timeout: api.Duration(20 * time.Second)}); err != nil || r.ExitCode != 0 {
		t.Fatalf("fire and forget: %v %s", err, r.Stderr)
	}
	wantEvent(t, e, sb.ID, "the query of a process that left, with its process or why not", func(ev egress.Event) bool {
		return ev.Kind == egress.KindDNS && ev.Name == "fire-forget.test" && (ev.Process != "") != (ev.ProcessUnknown != "")
	})
}

// Every TCP connection a sandbox opens to the host over the bridge is
// refused and logged in the sandbox's log, with its reason and process:
// the gateway's IPv4 and IPv6 addresses and the bridge's IPv6 link-local
// address, on a port where the host listens and on den's own DNS and
// proxy ports.
func TestNetworkGatewayRefusalsLogged(t *testing.T) {
	e, in := newNetEnv(t)
	sb := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetOpen}})
	bridge := fmt.Sprintf("dent%d", os.Getpid()%100000)
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		t.Fatal(err)
	}
	// The bridge's link-local address, once its duplicate detection is
	// over (the sandbox's port brought the bridge up).
	var ll netip.Addr
	for i := 0; !ll.IsValid(); i++ {
		addrs, _ := netlink.AddrList(br, netlink.FAMILY_V6)
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				ll, _ = netip.AddrFromSlice(a.IP)
			}
		}
		if i == 100 {
			t.Skipf("the bridge has no IPv6 link-local address (this host makes none): %v", addrs)
		}
		if !ll.IsValid() {
			time.Sleep(100 * time.Millisecond)
		}
	}
	// And the sandbox's own addresses all usable (a link-local address of
	// its own, were there one, past its duplicate detection: a connection
	// to a link-local address would leave from it).
	ns, err := netns.GetFromPid(sb.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	for i := 0; ; i++ {
		eth, err := nh.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		addrs, _ := nh.AddrList(eth, netlink.FAMILY_V6)
		tentative := false
		for _, a := range addrs {
			tentative = tentative || a.Flags&unix.IFA_F_TENTATIVE != 0
		}
		if !tentative {
			break
		}
		if i == 100 {
			t.Fatalf("the sandbox's IPv6 addresses stay tentative: %v", addrs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Listeners of the host's on the three addresses, one port.
	ln4, err := net.Listen("tcp4", net.JoinHostPort(in.nw.Gateway().String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	port := ln4.Addr().(*net.TCPAddr).Port
	targets := []string{in.nw.Gateway().String(), in.nw.Gateway6().String(), ll.String()}
	hostAddr := map[string]string{targets[2]: ll.WithZone(bridge).String()}
	accepted := make(chan string, 100)
	for i, a := range targets {
		ln := ln4
		if i > 0 {
			h := a
			if z, ok := hostAddr[a]; ok {
				h = z
			}
			if ln, err = net.Listen("tcp6", net.JoinHostPort(h, strconv.Itoa(port))); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { ln.Close() })
		go greetAll(ln, accepted)
	}
	// The control: the host reaches each.
	for _, a := range targets {
		h := a
		if z, ok := hostAddr[a]; ok {
			h = z
		}
		c, err := net.Dial("tcp", net.JoinHostPort(h, strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("control: the host cannot reach its own listener on %s: %v", h, err)
		}
		c.Close()
		<-accepted
	}
	// The sandbox tries each: a listening port, den's DNS and transparent
	// proxy ports. (The HTTP proxy's port on the gateway is the explicit
	// proxy, which the sandbox may use.)
	transparent, dnsPort, _ := in.nw.Ports()
	probe := `
import socket, sys
for target in sys.argv[1:]:
    host, _, port = target.rpartition(":")
    try:
        s = socket.create_connection((host, int(port)), 5)
        s.settimeout(5)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        got = s.recv(100)
        print(target, "open " + repr(got) if got else "refused")
    except OSError as e:
        print(target, "refused", e.__class__.__name__)
`
	type attempt struct {
		addr string
		port int
	}
	var tries []attempt
	args := []string{"python3", "-c", probe}
	for _, a := range targets {
		for _, p := range []int{port, dnsPort, transparent} {
			tries = append(tries, attempt{a, p})
			h := a
			if a == ll.String() {
				h = ll.WithZone("eth0").String()
			}
			args = append(args, h+":"+strconv.Itoa(p))
		}
	}
	r, err := e.c.Exec(context.Background(), sb.ID, api.ExecRequest{Cmd: args, Timeout: api.Duration(60 * time.Second)})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("probe: %v %s%s", err, r.Stdout, r.Stderr)
	}
	lines := strings.Split(strings.TrimSpace(string(r.Stdout)), "\n")
	if len(lines) != len(tries) {
		t.Fatalf("probe printed %d lines for %d targets:\n%s%s", len(lines), len(tries), r.Stdout, r.Stderr)
	}
	for _, l := range lines {
		if !strings.Contains(l, " refused") {
			t.Errorf("the sandbox reached the host: %s", l)
		}
	}
	select {
	case from := <-accepted:
		t.Fatalf("a host listener accepted a connection from %s", from)
	default:
	}
	for _, a := range tries {
		wantEvent(t, e, sb.ID, fmt.Sprintf("the refusal of %s port %d", a.addr, a.port), func(ev egress.Event) bool {
			return ev.Kind == egress.KindConnect && ev.Addr == a.addr && ev.Port == a.port && ev.Verdict == egress.VerdictDeny &&
				strings.Contains(ev.Reason, "is the host") && strings.HasPrefix(ev.Process, "p") && strings.Contains(ev.Process, "(python3 ")
		})
	}
}

// An exec's result lists the connections den refused its command: through
// the explicit proxy (an absolute-URI request and a CONNECT) and a direct
// connection the transparent proxy refused, each HTTP refusal's status line
// naming the rule. Neither the command's allowed connection nor the
// denials of a background process running at the same time are listed.
func TestExecDeniedConnections(t *testing.T) {
	e, _ := newNetEnv(t)
	sb := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test"}}})
	ctx := context.Background()
	// Another command of the sandbox, refused all along.
	bg, err := e.c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: ": >/tmp/bg; while :; do curl -s --max-time 2 http://bg.test/ >/dev/null; echo >>/tmp/bg; sleep 0.2; done"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Kill(ctx, sb.ID, bg.ID, "KILL")
	wantEvent(t, e, sb.ID, "the background process's denial", func(ev egress.Event) bool {
		return ev.Name == "bg.test" && ev.Verdict == egress.VerdictDeny && strings.HasPrefix(ev.Process, bg.ID+" (")
	})
	// The command waits for two more of the background process's
	// attempts: one of them ran while it did.
	script := `
n=$(wc -l </tmp/bg); while [ $(wc -l </tmp/bg) -lt $((n+2)) ]; do sleep 0.1; done
curl -sS --max-time 5 -o /dev/null -D - http://other.test/
curl -sv --max-time 5 https://other.test/ 2>&1 | grep '^< HTTP'
curl -sS --max-time 5 -o /dev/null -D - --noproxy '*' http://10.1.2.3/
curl -sS --max-time 5 http://allowed.test/; echo
exit 3`
	start := time.Now()
	res, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: script, Timeout: api.Duration(time.Minute)})
	end := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	out := string(res.Stdout) + string(res.Stderr)
	if res.ExitCode != 3 {
		t.Fatalf("exit %d (want the command's 3): %s", res.ExitCode, out)
	}
	// The control: the allowed name answered.
	if !strings.Contains(out, "hello from the test internet, host allowed.test") {
		t.Fatalf("the allowed request did not get through: %s", out)
	}
	for _, line := range []string{
		"HTTP/1.1 403 den egress: name not in allow list\r\n",   // absolute URI through HTTP_PROXY
		"< HTTP/1.1 403 den egress: name not in allow list\r\n", // CONNECT, as curl -v shows it
		"HTTP/1.1 403 den egress: address not public\r\n",       // the transparent proxy
	} {
		if !strings.Contains(out, line) {
			t.Errorf("no status line %q in:\n%s", line, out)
		}
	}
	want := []api.DeniedConn{
		{Host: "other.test", Port: 80, Proto: "tcp", Rule: "name not in allow list", Reason: "name not in allow list", Count: 1},
		{Host: "other.test", Port: 443, Proto: "tcp", Rule: "name not in allow list", Reason: "name not in allow list", Count: 1},
		{Host: "10.1.2.3", Port: 80, Proto: "tcp", Rule: "address not public"},
	}
	if len(res.Denied) == len(want) {
		want[2].Reason, want[2].Count = res.Denied[2].Reason, 1
	}
	if !reflect.DeepEqual(res.Denied, want) || !strings.Contains(want[2].Reason, "blocked address 10.1.2.3") {
		t.Errorf("denied:\n got %+v\nwant %+v", res.Denied, want)
	}
	// The background process was refused while the command ran: those
	// denials were there to be blamed, and were not.
	n := 0
	for _, ev := range netEvents(t, e, sb.ID) {
		if ev.Name == "bg.test" && ev.Verdict == egress.VerdictDeny && ev.Time.After(start) && ev.Time.Before(end) {
			n++
		}
	}
	if n == 0 {
		t.Errorf("no denial of the background process while the command ran: the check above proves nothing")
	}
	// The streaming form carries the list in its exit status too.
	var so, se strings.Builder
	st, err := e.c.ExecStream(ctx, sb.ID, api.ExecRequest{Cmd: []string{"curl", "-s", "--max-time", "5", "http://other.test/"}}, &so, &se)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Denied) != 1 || st.Denied[0].Host != "other.test" || st.Denied[0].Rule != "name not in allow list" {
		t.Errorf("streamed exec: denied %+v", st.Denied)
	}
	// And a command refused nothing has no list.
	if r, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"curl", "-s", "--max-time", "5", "http://allowed.test/"}}); err != nil || r.ExitCode != 0 || r.Denied != nil {
		t.Errorf("allowed only: %v %+v", err, r)
	}
}
