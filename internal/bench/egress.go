package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// The egress scenario's stand-in for the internet: a network namespace of
// its own (a documentation address, reached from the host over a veth),
// with a small HTTP server. Sandboxes reach it through den's bridge and
// transparent proxy with an allow_cidr rule; the peer is the same client
// run directly on the host.
const (
	inetAddr = "198.51.100.10"
	inetHost = "198.51.100.1"
	egressN  = 200
	bigBytes = 1 << 30
	proxyMs  = 1.0 // proxy adds <= 1 ms to connection setup at p50
	proxyPct = 80  // proxied throughput >= 80% of direct
)

// clientScript is run by python3 in the sandbox and on the host: it times n
// connect+request+response cycles, then one large download (port 80, or
// the fourth argument).
const clientScript = `
import socket, sys, time, json
host, n, big = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
port = int(sys.argv[4]) if len(sys.argv) > 4 else 80
lat = []
for i in range(n):
    t = time.perf_counter()
    s = socket.create_connection((host, port), 5)
    s.sendall(b"GET /small HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n")
    resp = b""
    while True:
        b = s.recv(4096)
        if not b: break
        resp += b
    s.close()
    if not resp.startswith(b"HTTP/1.0 200") or not resp.endswith(b"ok"):
        sys.exit("bad answer: %r" % resp[:200])
    lat.append((time.perf_counter() - t) * 1000)
t = time.perf_counter()
s = socket.create_connection((host, port), 5)
s.sendall(b"GET /big HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n")
got = 0
while True:
    b = s.recv(1 << 20)
    if not b: break
    got += len(b)
dt = time.perf_counter() - t
print(json.dumps({"lat": lat, "bytes": got, "secs": dt}))
`

type inet struct {
	ns   netns.NsHandle
	name string
	veth string
	srv  *http.Server
}

func (b *runner) setupInet() (*inet, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the egress scenario needs root (it makes a network namespace)")
	}
	n := &inet{name: fmt.Sprintf("denbench%d", os.Getpid()%100000), veth: fmt.Sprintf("dbi%d", os.Getpid()%100000)}
	netns.DeleteNamed(n.name)
	runtime.LockOSThread()
	orig, _ := netns.Get()
	ns, err := netns.NewNamed(n.name)
	netns.Set(orig)
	runtime.UnlockOSThread()
	if err != nil {
		return nil, fmt.Errorf("make a namespace: %w", err)
	}
	n.ns = ns
	la := netlink.NewLinkAttrs()
	la.Name = n.veth
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: n.veth + "p"}); err != nil {
		n.close()
		return nil, err
	}
	host, _ := netlink.LinkByName(n.veth)
	peer, _ := netlink.LinkByName(n.veth + "p")
	netlink.AddrAdd(host, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(inetHost), Mask: net.CIDRMask(24, 32)}})
	netlink.LinkSetUp(host)
	netlink.LinkSetNsFd(peer, int(ns))
	h, _ := netlink.NewHandleAt(ns)
	p, _ := h.LinkByName(n.veth + "p")
	h.AddrAdd(p, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(inetAddr), Mask: net.CIDRMask(24, 32)}})
	h.LinkSetUp(p)
	lo, _ := h.LinkByName("lo")
	h.LinkSetUp(lo)
	h.Close()
	runtime.LockOSThread()
	netns.Set(ns)
	ln, err := net.Listen("tcp4", inetAddr+":80")
	netns.Set(orig)
	runtime.UnlockOSThread()
	if err != nil {
		n.close()
		return nil, err
	}
	chunk := make([]byte, 1<<20)
	n.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			for sent := 0; sent < bigBytes; sent += len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		case "/hold":
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			io.WriteString(w, "ok")
		}
	})}
	go n.srv.Serve(ln)
	return n, nil
}

func (n *inet) close() {
	if n.srv != nil {
		n.srv.Close()
	}
	if l, err := netlink.LinkByName(n.veth); err == nil {
		netlink.LinkDel(l)
	}
	n.ns.Close()
	netns.DeleteNamed(n.name)
}

type clientResult struct {
	Lat   []float64 `json:"lat"`
	Bytes int64     `json:"bytes"`
	Secs  float64   `json:"secs"`
	CPU   float64   `json:"-"` // CPU seconds the whole machine spent (busy time) during the run
}

// spliceProxy is the reference for the throughput target: the
// simplest TCP-terminating proxy (Go's io.Copy between two TCP
// connections, which splices in the kernel) on the host's loopback, in
// front of the same server. No proxy that terminates TCP does better on
// this machine: the difference to direct is the second TCP connection.
func spliceProxy() (net.Listener, error) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp4", inetAddr+":80")
				if err != nil {
					return
				}
				defer u.Close()
				go func() { io.Copy(u, c); u.(*net.TCPConn).CloseWrite() }()
				io.Copy(c, u)
			}()
		}
	}()
	return ln, nil
}

// busyCPU is the machine's busy CPU time so far, in seconds (user,
// nice, system, irq, softirq and steal of /proc/stat).
func busyCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var ticks float64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		if i < len(f) {
			v, _ := strconv.ParseFloat(f[i], 64)
			ticks += v
		}
	}
	return ticks / 100 // USER_HZ
}

// egress: connection setup and throughput through den's transparent proxy
// against the same client on the host, and 1,000 concurrent proxied
// connections from 20 sandboxes.
func (b *runner) egress(ctx context.Context) error {
	n := b.iterations(egressN)
	inet, err := b.setupInet()
	if err != nil {
		return err
	}
	defer inet.close()
	sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels(), Network: &api.NetworkPolicy{Mode: api.NetAllow, AllowCIDR: []string{inetAddr + "/32"}}})
	if err != nil {
		return fmt.Errorf("create a networked sandbox (does the daemon run with --net?): %w", err)
	}
	defer b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
	args := []string{"-c", clientScript, inetAddr, strconv.Itoa(n), "0"}
	var viaDen, direct clientResult
	run := func(inside bool, dst *clientResult, extra ...string) error {
		var out []byte
		cpu0 := busyCPU()
		defer func() { dst.CPU = busyCPU() - cpu0 }()
		if inside {
			res, err := b.cl.Exec(ctx, sb.ID, api.ExecRequest{Cmd: append([]string{"python3"}, args...), Timeout: api.Duration(5 * time.Minute)})
			if err != nil {
				return err
			}
			if res.ExitCode != 0 {
				return fmt.Errorf("client in the sandbox: exit %d: %s", res.ExitCode, res.Stderr)
			}
			out = res.Stdout
		} else {
			py, err := exec.LookPath("/usr/bin/python3")
			if err != nil {
				return err
			}
			if out, err = exec.CommandContext(ctx, py, append(slices.Clone(args), extra...)...).Output(); err != nil {
				return fmt.Errorf("client on the host: %w", err)
			}
		}
		return json.Unmarshal(out, dst)
	}
	// Latency rounds, interleaved; then the downloads, interleaved.
	fmt.Fprintf(b.errw, "egress: %d connections each way\n", n)
	if err := run(true, &viaDen); err != nil {
		return err
	}
	if err := run(false, &direct); err != nil {
		return err
	}
	args[4] = "1"
	args[3] = "0"
	// Three interleaved downloads of 1 GiB each way (and through the
	// reference proxy); the medians compare.
	ref, err := spliceProxy()
	if err != nil {
		return err
	}
	defer ref.Close()
	refArgs := func() []string {
		a := slices.Clone(args)
		a[2] = "127.0.0.1"
		return a
	}
	var dens, directs, refs []clientResult
	for i := 0; i < 3; i++ {
		var d, p, r clientResult
		if err := run(true, &d); err != nil {
			return err
		}
		if err := run(false, &p); err != nil {
			return err
		}
		saved := args
		args = refArgs()
		err := run(false, &r, strconv.Itoa(ref.Addr().(*net.TCPAddr).Port))
		args = saved
		if err != nil {
			return err
		}
		dens, directs, refs = append(dens, d), append(directs, p), append(refs, r)
		b.progress("egress download", i+1, 3)
	}
	median := func(rs []clientResult) clientResult {
		sort.Slice(rs, func(i, j int) bool { return float64(rs[i].Bytes)/rs[i].Secs < float64(rs[j].Bytes)/rs[j].Secs })
		return rs[len(rs)/2]
	}
	bigDen, bigDirect, bigRef := median(dens), median(directs), median(refs)
	toDur := func(ms []float64) []time.Duration {
		d := make([]time.Duration, len(ms))
		for i, v := range ms {
			d[i] = time.Duration(v * float64(time.Millisecond))
		}
		return d
	}
	dr := statsRow("egress", "connect+request through den's proxy (sandbox)", toDur(viaDen.Lat))
	pr := statsRow("egress", "connect+request direct (host, peer)", toDur(direct.Lat))
	added := dr.p50() - pr.p50()
	dr.compare(pr, "direct p50")
	dr.judge(fmt.Sprintf("adds ≤ %gms at p50 (adds %.2fms)", proxyMs, added), added, proxyMs)
	mbps := func(r clientResult) float64 { return float64(r.Bytes) / (1 << 20) / r.Secs }
	td := &Row{Scenario: "egress", Subject: "1 GiB download through den's proxy (MiB/s, median of 3)", N: 3, Unit: "MiB/s", Mean: ptr(mbps(bigDen))}
	tp := &Row{Scenario: "egress", Subject: "1 GiB download direct (MiB/s, median of 3, peer)", N: 3, Unit: "MiB/s", Mean: ptr(mbps(bigDirect))}
	pct := 100 * mbps(bigDen) / mbps(bigDirect)
	td.Ratio, td.RatioOf = ptr(pct/100), "direct"
	td.Target, td.Verdict = fmt.Sprintf("≥ %d%% of direct", proxyPct), map[bool]string{true: "PASS", false: "FAIL"}[pct >= proxyPct]
	gib := func(r clientResult) float64 { return r.CPU / (float64(r.Bytes) / (1 << 30)) }
	td.Note = fmt.Sprintf("CPU per GiB, whole machine: %.2f s through den, %.2f s direct, %.2f s through the reference proxy", gib(bigDen), gib(bigDirect), gib(bigRef))
	if bigDen.Bytes < bigBytes || bigDirect.Bytes < bigBytes {
		td.Verdict, td.Note = "FAIL", fmt.Sprintf("short download: %d / %d bytes", bigDen.Bytes, bigDirect.Bytes)
	}
	tr := &Row{Scenario: "egress", Subject: "1 GiB download through a plain splice proxy on loopback (MiB/s, median of 3, reference)", N: 3, Unit: "MiB/s", Mean: ptr(mbps(bigRef))}
	tr.Ratio, tr.RatioOf = ptr(mbps(bigRef)/mbps(bigDirect)), "direct"
	tr.Note = "the ceiling of any TCP-terminating proxy here: Go io.Copy (splice) between two TCP connections, loopback in front"
	b.add(dr, pr, td, tp, tr)
	return b.egressConcurrent(ctx)
}

// egressConcurrent holds 50 connections open from each of 20 sandboxes.
func (b *runner) egressConcurrent(ctx context.Context) error {
	const boxes, each = 20, 50
	hold := fmt.Sprintf(`
import socket, time
socks = []
for i in range(%d):
    s = socket.create_connection(("%s", 80), 10)
    s.sendall(b"GET /hold HTTP/1.1\r\nHost: %s\r\n\r\n")
    if not s.recv(100).startswith(b"HTTP/1.1 200"): raise SystemExit("hold refused")
    socks.append(s)
print(len(socks), flush=True)
time.sleep(600)
`, each, inetAddr, inetAddr)
	var ids []string
	defer func() {
		for _, id := range ids {
			b.cl.Remove(context.WithoutCancel(ctx), id, true)
		}
	}()
	before, _ := b.daemonRSS(ctx)
	start := time.Now()
	var procs []string
	for i := 0; i < boxes; i++ {
		sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels(), Network: &api.NetworkPolicy{Mode: api.NetAllow, AllowCIDR: []string{inetAddr + "/32"}}})
		if err != nil {
			return err
		}
		ids = append(ids, sb.ID)
		p, err := b.cl.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", hold}})
		if err != nil {
			return err
		}
		procs = append(procs, p.ID)
	}
	held := 0
	deadline := time.Now().Add(2 * time.Minute)
	for i, id := range ids {
		for time.Now().Before(deadline) {
			var out strings.Builder
			b.cl.Logs(ctx, id, procs[i], client.LogsOptions{}, &out, io.Discard)
			if v := strings.TrimSpace(out.String()); v != "" {
				k, _ := strconv.Atoi(v)
				held += k
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		b.progress("egress concurrent", i+1, boxes)
	}
	after, _ := b.daemonRSS(ctx)
	r := &Row{Scenario: "egress", Subject: fmt.Sprintf("concurrent proxied connections (%d sandboxes × %d)", boxes, each), N: held, Unit: "count", Mean: ptr(float64(held))}
	r.Target, r.Verdict = fmt.Sprintf("all %d open", boxes*each), map[bool]string{true: "PASS", false: "FAIL"}[held == boxes*each]
	r.Note = fmt.Sprintf("in %v; daemon RSS %.1f → %.1f MiB", time.Since(start).Round(time.Millisecond), before/(1<<20), after/(1<<20))
	b.add(r)
	return nil
}
