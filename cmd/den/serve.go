package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/egress"
	"github.com/den-dev/den/internal/host"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/instance"
	"github.com/den-dev/den/internal/isolate/linux"
	"github.com/den-dev/den/internal/sandbox"
	"github.com/den-dev/den/internal/server"
	"github.com/den-dev/den/internal/storage"
	"github.com/den-dev/den/internal/store"
)

const serveUsage = `den serve: run the den daemon

Usage: den serve [flags]

The daemon answers the HTTP API on a unix socket (root only) and, when
asked, on TCP with a bearer token. The token is created at first start in
DATA/token (mode 0600); clients on the same host read it from there, others
pass it in DEN_TOKEN. State lives in DATA/den.db (SQLite). Sandboxes keep
running when the daemon stops; the next daemon reattaches to them. One
daemon per data directory (DATA/daemon.lock); its sandboxes' cgroups are
under a parent named after it. After a stop or crash, den system reset
removes everything the daemon left on the host (see den system reset -h).

Flags:
`

type listenFlag []string

func (l *listenFlag) String() string     { return strings.Join(*l, ",") }
func (l *listenFlag) Set(v string) error { *l = append(*l, v); return nil }

func cmdServe(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var listens listenFlag
	fs.Var(&listens, "listen", "address to serve: unix:///path or tcp://127.0.0.1:7420 (repeatable; default unix:///run/den/den.sock)")
	data := fs.String("data", envOr("DEN_DATA", "/var/lib/den"), "data directory (state, images, sandbox files)")
	runDir := fs.String("run", "/run/den", "directory for transient mounts and agent sockets")
	defMem := fs.String("default-memory", "2g", "memory limit for sandboxes that set none (0 = unlimited)")
	defPids := fs.Int("default-pids", 4096, "process limit for sandboxes that set none (0 = unlimited)")
	defCPUs := fs.Float64("default-cpus", 0, "CPU limit for sandboxes that set none (0 = unlimited)")
	defDisk := fs.String("default-disk", "auto", "disk quota of sandboxes and volumes that set none, like 10g: auto = 10g or a quarter of den's storage, whichever is smaller; 0 or none = unlimited (needs btrfs storage)")
	netOn := fs.Bool("net", true, "give networked sandboxes (--net allow|open) a veth on den's bridge, egress through den's proxy (needs nftables)")
	bridge := fs.String("bridge", "den0", "bridge for sandbox networking")
	subnet := fs.String("subnet", "10.88.0.0/16", "IPv4 subnet of the sandbox bridge")
	previewDomain := fs.String("preview-domain", "", "serve shared ports as PORT-ID.DOMAIN too (point *.DOMAIN at a TCP --listen address); without it, PORT-ID.localhost when a TCP --listen address is on loopback")
	warm := fs.Int("warm", 2, "fresh host-image sandboxes kept booted so creates are instant (0 = none)")
	storageMode := fs.String("storage", "auto", "where sandbox files live: btrfs (a filesystem den manages in DATA/storage.img, mounted at DATA/fs: instant snapshots and forks, disk quotas), dir (plain directories: snapshots copy, no quotas) or auto (btrfs when possible)")
	storageSize := fs.String("storage-size", "", "size of a new DATA/storage.img, like 200g (default: 90% of the free space where DATA is; the file is sparse)")
	storageReserve := fs.String("storage-reserve", "", "space of den's storage no sandbox, snapshot or volume may use, like 5g, so the filesystem and the daemon keep working when they fill up (default: 10% of it, 256m to 10g)")
	var allowMounts listenFlag
	fs.Var(&allowMounts, "allow-mount", "host directory sandboxes may bind-mount with --mount (repeatable; none by default)")
	defRuntime := fs.String("runtime", "linux", "default isolation tier of new sandboxes: linux, gvisor or microvm (den create --runtime picks per sandbox)")
	runtimes := fs.String("runtimes", "linux,gvisor,microvm", "tiers to offer where this host can run them (den info says which and why not)")
	runscPath := fs.String("runsc", envOr("DEN_RUNSC", ""), "gVisor's runsc binary for the gvisor tier (default: runsc on PATH; den info shows its version and platform)")
	runscPlatform := fs.String("runsc-platform", "", "gVisor platform: systrap, kvm or ptrace (default: the fastest one a trial sandbox shows working here)")
	sshAddr := fs.String("ssh", "", "serve den's SSH gateway on this address, like 127.0.0.1:2222 (ssh -p 2222 ID@host; keys from den ssh-key add)")
	grace := fs.Duration("shutdown-grace", 30*time.Second, "on SIGTERM or SIGINT, how long to finish requests and close down before exiting anyway (sandboxes keep running either way; a second signal exits at once)")
	verbose := fs.Bool("v", false, "log debug messages")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), serveUsage)
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), "\nExample:\n  den serve --listen unix:///run/den/den.sock --listen tcp://127.0.0.1:7420\n")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{verb: "serve", msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	mem, err := api.ParseSize(*defMem)
	if err != nil {
		return &usageError{verb: "serve", msg: "--default-memory: " + err.Error()}
	}
	var stSize, stReserve int64
	for _, f := range []struct {
		name, v string
		dst     *int64
	}{{"storage-size", *storageSize, &stSize}, {"storage-reserve", *storageReserve, &stReserve}} {
		if f.v != "" {
			n, err := api.ParseSize(f.v)
			if err != nil {
				return &usageError{verb: "serve", msg: "--" + f.name + ": " + err.Error()}
			}
			*f.dst = int64(n)
		}
	}
	if _, _, err := parseDefaultDisk(*defDisk); err != nil {
		return &usageError{verb: "serve", msg: "--default-disk: " + err.Error()}
	}
	if len(listens) == 0 {
		listens = listenFlag{"unix://" + filepath.Join(*runDir, "den.sock")}
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	if err := os.MkdirAll(*data, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	// The data directory is this daemon's alone (a second daemon on it
	// would adopt and remove the first one's sandboxes), and its identity:
	// the cgroup parent of its boxes is named after it.
	canon, err := instance.Canonical(*data)
	if err != nil {
		return err
	}
	lock, err := instance.Acquire(canon)
	if err != nil {
		var busy *instance.BusyError
		if errors.As(err, &busy) {
			return fmt.Errorf("%w: stop it first, or give this daemon another --data", err)
		}
		return err
	}
	defer lock.Release()
	cgParent := instance.CgroupParent(canon)
	token, err := loadToken(filepath.Join(*data, "token"))
	if err != nil {
		return err
	}
	db, err := store.Open(filepath.Join(*data, "den.db"))
	if err != nil {
		return fmt.Errorf("open state: %w", err)
	}
	defer db.Close()
	images, err := image.NewStore(filepath.Join(*data, "images"))
	if err != nil {
		return fmt.Errorf("open image store: %w", err)
	}
	st, err := storage.Open(storage.Config{Dir: *data, Size: stSize, Mode: *storageMode, Reserve: stReserve})
	if err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	defer st.Close()
	if st.Kind() != "btrfs" {
		log.Info("sandbox files in plain directories: snapshots copy files, no disk quotas", "why", st.Why())
	}
	disk := defaultDisk(*defDisk, st)
	switch {
	case !st.Quotas():
		disk = 0
		log.Warn("no disk quotas (--default-disk has no effect): one sandbox can fill den's storage; new sandboxes are refused once its free space falls into the reserve", "reserve", api.Size(st.Reserve()), "why", st.Why())
	case !st.ReserveEnforced():
		log.Warn("den's storage reserve is not enforced by the kernel", "why", st.Why())
	}
	log.Info("storage", "kind", st.Kind(), "size", api.Size(st.Size()), "reserve", api.Size(st.Reserve()), "default_disk", api.Size(disk))
	// Recorded before the bridge, the run directory and the cgroup parent
	// are made, so that den system reset finds them all after a crash.
	rec := instance.Record{Started: time.Now().UTC(), Run: *runDir, CgroupParent: cgParent,
		Runtimes: strings.Split(*runtimes, ","), Runsc: *runscPath, Platform: *runscPlatform}
	if abs, err := filepath.Abs(*runDir); err == nil {
		rec.Run = abs
	}
	if *netOn {
		rec.Bridge, rec.Table = *bridge, host.TableName(*bridge)
	} else if prev, ok, _ := instance.Read(canon); ok {
		// No network now: the bridge an earlier start made stays there.
		rec.Bridge, rec.Table = prev.Bridge, prev.Table
	}
	if err := lock.Write(rec); err != nil {
		return fmt.Errorf("record the daemon in %s: %w", *data, err)
	}
	var nw *host.Network
	if *netOn {
		pfx, err := netip.ParsePrefix(*subnet)
		if err != nil {
			return &usageError{verb: "serve", msg: "--subnet: " + err.Error()}
		}
		nw, err = host.NewNetwork(host.NetworkConfig{Bridge: *bridge, Subnet: pfx, Transparent: 15001, DNS: 15053, HTTPProxy: 15080})
		if err != nil {
			log.Warn("sandbox networking is off", "err", err)
			nw = nil
		}
	}
	rt, err := linux.New(linux.Config{RunDir: filepath.Join(*runDir, "linux"), CgroupName: cgParent, Network: nw})
	if err != nil {
		return fmt.Errorf("linux runtime: %w", err)
	}
	// Run last: with no box left, the daemon's cgroup parent goes too.
	defer host.RemoveParentIfEmpty("/sys/fs/cgroup", cgParent)
	tiers := setupTiers(log, rt, *runDir, *data, cgParent, nw, rec.Runtimes, *runscPath, *runscPlatform)
	for _, in := range tiers.info {
		if in.Name == "gvisor" && in.Available {
			// The runsc and platform found, so that den system reset
			// reattaches to the boxes with the same ones.
			rec.Runsc, rec.Platform = in.Details["runsc_path"], in.Details["platform"]
			if err := lock.Write(rec); err != nil {
				return fmt.Errorf("record the daemon in %s: %w", *data, err)
			}
		}
	}
	defRT, err := tiers.defaultTier(*defRuntime)
	if err != nil {
		return err
	}
	ctx := context.Background()
	// Host-name previews: on --preview-domain, or on localhost when a TCP
	// listener is reachable on this host's loopback (browsers resolve
	// *.localhost there), so dev servers get the site's root.
	domain := *previewDomain
	if domain == "" && loopbackTCP(listens) {
		domain = "localhost"
	}
	cfg := sandbox.Config{
		DataDir: *data, Runtime: defRT, Tiers: tiers.runtimes, Unavailable: tiers.unavailable, Store: db, Images: images, Log: log,
		Defaults: api.Limits{Memory: mem, Pids: *defPids, CPUs: *defCPUs, Disk: disk}, WarmPool: *warm,
		PreviewDomain: domain, Storage: st, AllowMounts: allowMounts,
	}
	if nw != nil {
		_, _, hp := nw.Ports()
		cfg.Egress = &sandbox.Egress{Gateway: nw.Gateway(), HTTPProxy: hp, AddrSlot: nw.Slot, SlotAddr: nw.Addr}
	}
	m, err := sandbox.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer m.Close()
	if nw != nil {
		eg, err := startEgress(nw, m)
		if err != nil {
			return err
		}
		defer eg.Close()
	}
	h := server.New(m, db, log, version, rt.CgroupVersion())
	type listener struct {
		ln     net.Listener
		addr   string
		secure bool
	}
	var lns []listener
	for _, l := range listens {
		ln, secure, err := listen(l)
		if err != nil {
			return err
		}
		defer ln.Close()
		addr := l
		if !secure {
			addr = "tcp://" + ln.Addr().String() // the port, when --listen asked for 0
		}
		lns = append(lns, listener{ln, addr, secure})
	}
	info := api.Info{Runtimes: tiers.info, Cgroup: rt.CgroupVersion(), Storage: st.Kind(), Network: nw != nil,
		StorageSize: api.Size(st.Size()), StorageReserve: api.Size(st.Reserve()), PreviewDomain: domain}
	info.DefaultDisk = disk
	for _, l := range lns {
		info.Listeners = append(info.Listeners, l.addr)
	}
	h.SetInfo(info)

	mcpH, stopMCP := mcpHandler(h, log)
	defer stopMCP()
	h.Mount("/mcp", mcpH)
	if *sshAddr != "" {
		gw, err := startSSH(*sshAddr, *data, h, db, log)
		if err != nil {
			return err
		}
		defer gw.Close()
		info.SSH = &gw.info // den ssh pins the host key from here
		h.SetInfo(info)
	}
	var servers []*http.Server
	errc := make(chan error, len(lns))
	for _, l := range lns {
		handler := server.AsAdmin(h)
		if !l.secure {
			handler = h.Authenticate(h, token) // the admin token or a scoped one (den token)
		}
		handler = h.PreviewHost(handler, domain, "localhost")
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 1 << 20}
		servers = append(servers, srv)
		log.Info("listening", "addr", l.addr)
		go func() { errc <- srv.Serve(l.ln) }()
	}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case s := <-sig:
		log.Info("shutting down", "signal", s.String(), "grace", grace.String())
	case err := <-errc:
		log.Error("serve", "err", err)
	}
	// Whatever hangs below (a request that does not end, a teardown
	// stuck in the kernel), the daemon exits within the grace period:
	// the next daemon recovers what this one leaves.
	go boundShutdown(log, *grace, sig)
	sctx, cancel := context.WithTimeout(ctx, *grace)
	defer cancel()
	for _, srv := range servers {
		srv.Shutdown(sctx)
	}
	return nil
}

// boundShutdown exits the process when the grace period is over, or at a
// second signal, saying so.
func boundShutdown(log *slog.Logger, grace time.Duration, sig <-chan os.Signal) {
	t := time.NewTimer(grace)
	select {
	case <-t.C:
		log.Error("shutdown did not finish within the grace period: exiting anyway", "grace", grace.String())
	case s := <-sig:
		log.Error("second signal during shutdown: exiting at once", "signal", s.String())
	}
	os.Exit(1)
}

// parseDefaultDisk reads --default-disk: auto (the default), 0 or none
// (unlimited), or a size.
func parseDefaultDisk(v string) (size api.Size, auto bool, err error) {
	switch v {
	case "auto", "":
		return 0, true, nil
	case "none":
		return 0, false, nil
	}
	n, err := api.ParseSize(v)
	if err != nil {
		return 0, false, fmt.Errorf("%v (want a size like 10g, auto, or 0/none for unlimited)", err)
	}
	if n > 0 && n < 16<<20 {
		return 0, false, fmt.Errorf("%s is below the minimum of 16m", n)
	}
	return n, false, nil
}

// defaultDisk is the disk quota of sandboxes that set none: for auto, 10
// GiB or a quarter of den's storage, whichever is smaller, so that one
// sandbox filling its quota leaves room for the others.
func defaultDisk(v string, st *storage.Store) api.Size {
	n, auto, _ := parseDefaultDisk(v)
	if !auto {
		return n
	}
	return api.Size(min(10<<30, st.Size()/4))
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// listen opens one --listen address. Unix sockets are root-only and need
// no token; TCP needs the bearer token.
func listen(addr string) (net.Listener, bool, error) {
	u, err := url.Parse(addr)
	if err != nil {
		return nil, false, &usageError{verb: "serve", msg: fmt.Sprintf("--listen %q: %v", addr, err)}
	}
	switch u.Scheme {
	case "unix":
		p := u.Path
		if p == "" {
			return nil, false, &usageError{verb: "serve", msg: fmt.Sprintf("--listen %q: no socket path", addr)}
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o711); err != nil {
			return nil, false, err
		}
		if c, err := net.Dial("unix", p); err == nil {
			c.Close()
			return nil, false, fmt.Errorf("another daemon is already serving %s", p)
		}
		os.Remove(p)
		old := syscall.Umask(0o177)
		ln, err := net.Listen("unix", p)
		syscall.Umask(old)
		if err != nil {
			return nil, false, fmt.Errorf("listen on %s: %w", p, err)
		}
		os.Chmod(p, 0o600)
		return ln, true, nil
	case "tcp":
		if u.Host == "" {
			return nil, false, &usageError{verb: "serve", msg: fmt.Sprintf("--listen %q: no host:port", addr)}
		}
		ln, err := net.Listen("tcp", u.Host)
		if err != nil {
			return nil, false, fmt.Errorf("listen on %s: %w", u.Host, err)
		}
		return ln, false, nil
	}
	return nil, false, &usageError{verb: "serve", msg: fmt.Sprintf("--listen %q: want unix:///path or tcp://host:port", addr)}
}

// loopbackTCP reports whether one of the --listen addresses is a TCP one
// reachable on this host's loopback: a loopback address, localhost, or all
// addresses.
func loopbackTCP(listens []string) bool {
	for _, l := range listens {
		u, err := url.Parse(l)
		if err != nil || u.Scheme != "tcp" {
			continue
		}
		h := u.Hostname()
		if ip := net.ParseIP(h); h == "" || h == "localhost" || ip != nil && (ip.IsLoopback() || ip.IsUnspecified()) {
			return true
		}
	}
	return false
}

// loadToken reads the API token, creating it (mode 0600) on first start.
func loadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read token: %w", err)
	}
	var r [32]byte
	rand.Read(r[:])
	t := hex.EncodeToString(r[:])
	if err := os.WriteFile(path, []byte(t+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write token: %w", err)
	}
	return t, nil
}

// startEgress serves den's DNS, transparent proxy and HTTP proxy on the
// bridge's gateway address, for the sandboxes only.
func startEgress(nw *host.Network, m *sandbox.Manager) (*egress.Server, error) {
	tp, dnsPort, hp := nw.Ports()
	eg := egress.New(egress.Config{
		Sandbox: m.SandboxForAddr, Log: m.NetEvent, Deny: []netip.Prefix{nw.Subnet(), nw.Subnet6()},
		CA: m.SandboxCA, Attribute: m.Attribute,
	})
	// An exec's result lists its command's denials: the events of the
	// refusals it saw must have reached the manager when it ends.
	m.SetNetSync(func() { eg.Sync(2 * time.Second) })
	// The same servers on the gateway's IPv4 and IPv6 addresses: nftables
	// sends each family's traffic to its own.
	for _, fam := range []struct {
		tcp, udp string
		gw       netip.Addr
	}{{"tcp4", "udp4", nw.Gateway()}, {"tcp6", "udp6", nw.Gateway6()}} {
		listen := func(port int) (net.Listener, error) {
			return net.Listen(fam.tcp, net.JoinHostPort(fam.gw.String(), strconv.Itoa(port)))
		}
		tl, err := listen(tp)
		if err != nil {
			return nil, fmt.Errorf("egress proxy: %w", err)
		}
		hl, err := listen(hp)
		if err != nil {
			return nil, fmt.Errorf("egress http proxy: %w", err)
		}
		dl, err := listen(dnsPort)
		if err != nil {
			return nil, fmt.Errorf("egress dns: %w", err)
		}
		pc, err := net.ListenPacket(fam.udp, net.JoinHostPort(fam.gw.String(), strconv.Itoa(dnsPort)))
		if err != nil {
			return nil, fmt.Errorf("egress dns: %w", err)
		}
		go eg.ServeTransparent(tl)
		go eg.ServeProxy(hl)
		go eg.ServeDNS(pc, dl)
	}
	return eg, nil
}
