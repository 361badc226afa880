package microvm

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/confine"
	"github.com/den-dev/den/internal/host"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The guest side. The den binary is the initramfs's /init (PID 1 of the
// VM). It loads the modules, mounts the disks and the root overlays,
// configures the network, and starts the agent in a new pid and mount
// namespace rooted in the box's root (so the box sees its own processes
// only, not the guest kernel's threads or the init), then waits: when the
// agent ends, the VM ends.

// agentArg is the hidden argv[1] of the agent process the guest init
// starts; its argv[0] is agentName.
const (
	agentArg  = "__den-microvm-agent"
	agentName = "den-agent"
)

// Paths inside the guest (in the initramfs).
const (
	guestRoot  = "/den/root"
	guestRW    = "/den/rw"
	guestLower = "/den/lower"
	agentPort  = "den.agent"
	// ctlPort carries the daemon's requests to the guest init itself,
	// one line each, answered with one line, "ok" or "error: why":
	// "sync" flushes the guest's filesystems (killing QEMU loses its page
	// cache); "identity <base64 JSON guestIdentity>" gives a restored
	// guest its box's hostname, MAC and network; "time <ns>" steps the
	// guest's wall clock to the host's (Unix nanoseconds: a guest's clock
	// stands still while it is paused or saved, and starts at 1970 where
	// no RTC is read); "crash" panics the guest
	// kernel (how the tests check that a guest panic is reported; the
	// host could end the VM anyway, and no command inside reaches it).
	ctlPort = "den.ctl"
)

// guestConfig is what the host tells the guest init, on the kernel
// command line (den.cfg=<base64 JSON>).
type guestConfig struct {
	Hostname string       `json:"h"`
	Disk     string       `json:"d"` // serial of the writable disk
	Layers   []guestLayer `json:"l"`
	Net      *guestNet    `json:"n,omitempty"`
	Shm      int64        `json:"s,omitempty"` // /dev/shm's size (0: the default)
}

// guestIdentity is what a restored guest is told to become (control
// request "identity <base64 JSON>"): the box it now is may not be the one
// whose checkpoint it runs from.
type guestIdentity struct {
	Hostname string    `json:"h"`
	Net      *guestNet `json:"n,omitempty"`
	MAC      string    `json:"mac,omitempty"`
}

type guestLayer struct {
	Target string   `json:"t"`
	Lowers []string `json:"l"` // disk serials, bottom first
	Name   string   `json:"n"`
}

type guestNet struct {
	Addrs []string `json:"a"` // CIDR
	GW    string   `json:"g,omitempty"`
	GW6   string   `json:"g6,omitempty"`
	MTU   int      `json:"m,omitempty"`
}

// IsGuest reports whether this process is den's guest init in a microVM
// (PID 1 run as /init from the initramfs) or the agent it starts (argv
// "den-agent __den-microvm-agent").
func IsGuest() bool {
	if len(os.Args) > 1 && os.Args[0] == agentName && os.Args[1] == agentArg {
		return true
	}
	return os.Getpid() == 1 && len(os.Args) > 0 && os.Args[0] == "/init"
}

// GuestMain is the body of the guest init or of its agent. It never
// returns.
func GuestMain() {
	if len(os.Args) > 1 && os.Args[1] == agentArg {
		agentMain()
	}
	initMain()
}

var guestDebug bool

func debugf(format string, args ...any) {
	if guestDebug {
		fmt.Fprintf(os.Stderr, "den-init: "+format+"\n", args...)
	}
}

func guestFail(err error) {
	fmt.Fprintf(os.Stderr, "den-init: %v\n", err)
	unix.Sync()
	// With panic=-1 and -no-reboot, QEMU exits.
	unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	os.Exit(1)
}

func initMain() {
	for _, m := range []struct{ src, dst, typ string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
	} {
		if err := unix.Mount(m.src, m.dst, m.typ, unix.MS_NOSUID, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			guestFail(fmt.Errorf("mount %s: %w", m.dst, err))
		}
	}
	cmdline, _ := os.ReadFile("/proc/cmdline")
	var cfgArg string
	probe := false
	for _, f := range strings.Fields(string(cmdline)) {
		if v, ok := strings.CutPrefix(f, "den.cfg="); ok {
			cfgArg = v
		}
		if f == "den.probe" {
			probe = true
		}
		if f == "den.debug" {
			guestDebug = true
		}
	}
	if probe {
		// A boot-time measurement: the init is up; end the VM.
		fmt.Println("den-guest-ready")
		unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	}
	var cfg guestConfig
	raw, err := base64.RawURLEncoding.DecodeString(cfgArg)
	if err == nil {
		err = json.Unmarshal(raw, &cfg)
	}
	if err != nil {
		guestFail(fmt.Errorf("no configuration on the kernel command line (den.cfg): %v", err))
	}
	if err := loadModules(); err != nil {
		guestFail(err)
	}
	debugf("modules loaded")
	if err := mountRoot(&cfg); err != nil {
		guestFail(err)
	}
	debugf("root mounted")
	if err := setupNet(cfg.Net); err != nil {
		guestFail(err)
	}
	debugf("network up")
	if err := agent.SetHostname(cfg.Hostname, guestRoot); err != nil {
		guestFail(err)
	}
	port, err := openPort(agentPort)
	if err != nil {
		guestFail(err)
	}
	cmd := exec.Command("/init", agentArg, strconv.FormatInt(cfg.Shm, 10))
	cmd.Args[0] = agentName
	cmd.Env = []string{"GOGC=50", "GODEBUG=madvdontneed=1", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{port}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNS, Setsid: true}
	if err := cmd.Start(); err != nil {
		guestFail(fmt.Errorf("start agent: %w", err))
	}
	port.Close()
	debugf("agent started (pid %d)", cmd.Process.Pid)
	os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", cmd.Process.Pid), []byte("-1000"), 0)
	go serveCtl()
	err = cmd.Wait()
	guestFail(fmt.Errorf("the agent ended: %v", err))
}

// serveCtl answers the daemon's requests on the control port, one line
// each, with one line: "ok" or what went wrong.
func serveCtl() {
	f, err := openPort(ctlPort)
	if err != nil {
		fmt.Fprintf(os.Stderr, "den-init: %v\n", err)
		return
	}
	// The port signals SIGIO when the host connects or sends: no daemon
	// connected, the loop sleeps until then (a restore's identity request
	// is answered at once) instead of polling often.
	connected := make(chan os.Signal, 1)
	signal.Notify(connected, unix.SIGIO)
	if _, err := unix.FcntlInt(f.Fd(), unix.F_SETOWN, os.Getpid()); err == nil {
		if fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); err == nil {
			unix.FcntlInt(f.Fd(), unix.F_SETFL, fl|unix.O_ASYNC)
		}
	}
	r := bufio.NewReaderSize(f, 4096)
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			if len(line) > maxCtlLine {
				// Skip the rest of it, then say why.
				for errors.Is(err, bufio.ErrBufferFull) {
					_, err = r.ReadSlice('\n')
				}
				if err == nil {
					fmt.Fprintf(f, "error: a request longer than %d bytes\n", maxCtlLine)
				}
				line = line[:0]
			}
			continue
		}
		if err != nil {
			// No daemon connected, or it left mid-line: wait for one.
			line = line[:0]
			select {
			case <-connected:
			case <-time.After(time.Second):
			}
			continue
		}
		if reply := ctlRequest(strings.TrimSpace(string(line))); reply != "" {
			f.Write([]byte(reply + "\n"))
		}
		line = line[:0]
	}
}

// maxCtlLine bounds a control request.
const maxCtlLine = 64 << 10

// ctlRequest carries out one control request and says how it went.
func ctlRequest(line string) string {
	cmd, arg, _ := strings.Cut(line, " ")
	switch cmd {
	case "":
		return ""
	case "sync":
		unix.Sync()
		return "ok"
	case "time":
		if err := setClock(arg); err != nil {
			return "error: time: " + err.Error()
		}
		return "ok"
	case "crash":
		os.WriteFile("/proc/sysrq-trigger", []byte("c"), 0)
		return "error: the guest did not panic"
	case "identity":
		var id guestIdentity
		raw, err := base64.RawURLEncoding.DecodeString(arg)
		if err == nil {
			err = json.Unmarshal(raw, &id)
		}
		if err != nil {
			return "error: identity: " + err.Error()
		}
		if err := applyIdentity(&id); err != nil {
			return "error: identity: " + err.Error()
		}
		return "ok"
	}
	return "error: unknown request " + strconv.Quote(cmd)
}

// setClock steps the guest's wall clock to arg, Unix nanoseconds.
func setClock(arg string) error {
	ns, err := strconv.ParseInt(arg, 10, 64)
	if err != nil || ns <= 0 {
		return fmt.Errorf("%q is not a time in Unix nanoseconds", arg)
	}
	ts := unix.NsecToTimespec(ns)
	return unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
}

// applyIdentity makes a running guest (restored from a checkpoint,
// perhaps of another box) the box id describes: its hostname (the agent
// shares the init's UTS namespace), and eth0's MAC, addresses, routes
// and MTU. What already matches is left alone, so a restore into the same
// box keeps its connections. Then the guest forgets its neighbours (its
// next packet to the gateway asks for it again, which teaches the
// gateway the guest's MAC, IPv4 and IPv6) and announces its IPv4
// addresses with a gratuitous ARP (the bridge learns the MAC's port).
func applyIdentity(id *guestIdentity) error {
	if id.Hostname != "" {
		if err := agent.SetHostname(id.Hostname, guestRoot); err != nil {
			return err
		}
	}
	if id.Net == nil {
		return nil
	}
	eth, err := netlink.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("network interface: %w", err)
	}
	// Addresses first: until the MAC changes, the host drops the guest's
	// frames, so none leaves with the new MAC and an old address.
	if err := configureEth(eth, id.Net); err != nil {
		return err
	}
	if id.MAC != "" && eth.Attrs().HardwareAddr.String() != id.MAC {
		mac, err := net.ParseMAC(id.MAC)
		if err != nil {
			return err
		}
		// virtio-net changes it live (VIRTIO_NET_CTRL_MAC_ADDR_SET), and
		// QEMU filters received frames by the new one.
		if err := netlink.LinkSetHardwareAddr(eth, mac); err != nil {
			return fmt.Errorf("set the MAC: %w", err)
		}
		if eth, err = netlink.LinkByName("eth0"); err != nil {
			return err
		}
	}
	neighs, _ := netlink.NeighList(eth.Attrs().Index, netlink.FAMILY_ALL)
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT == 0 {
			netlink.NeighDel(&n)
		}
	}
	return announce(eth, id.Net.Addrs)
}

// announce broadcasts a gratuitous ARP request for each IPv4 address
// in addrs from eth.
func announce(eth netlink.Link, addrs []string) error {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
	if err != nil {
		return fmt.Errorf("gratuitous ARP: %w", err)
	}
	defer unix.Close(fd)
	mac := eth.Attrs().HardwareAddr
	to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: eth.Attrs().Index, Halen: 6, Addr: [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}
	for _, a := range addrs {
		ip, _, err := net.ParseCIDR(a)
		if err != nil || ip.To4() == nil || len(mac) != 6 {
			continue
		}
		// Ethernet/IPv4 request whose sender and target are the address.
		p := []byte{0, 1, 8, 0, 6, 4, 0, 1}
		p = append(p, mac...)
		p = append(p, ip.To4()...)
		p = append(p, 0, 0, 0, 0, 0, 0)
		p = append(p, ip.To4()...)
		if err := unix.Sendto(fd, p, 0, to); err != nil {
			return fmt.Errorf("gratuitous ARP for %s: %w", ip, err)
		}
	}
	return nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// loadModules loads /modules/order, in order.
func loadModules() error {
	b, err := os.ReadFile("/modules/order")
	if err != nil {
		return fmt.Errorf("module list: %w", err)
	}
	for _, name := range strings.Fields(string(b)) {
		f, err := os.Open("/modules/" + name)
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return nil
}

// diskBySerial waits for the virtio disks and maps their serials to
// device paths.
func disksBySerial(want []string) (map[string]string, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := map[string]string{}
		ents, _ := os.ReadDir("/sys/block")
		for _, e := range ents {
			s, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "serial"))
			if err == nil {
				got[strings.TrimSpace(string(s))] = "/dev/" + e.Name()
			}
		}
		missing := ""
		for _, w := range want {
			if _, ok := got[w]; !ok {
				missing = w
			}
		}
		if missing == "" {
			return got, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("disk %s did not appear (found %v)", missing, got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mountRoot(cfg *guestConfig) error {
	want := []string{cfg.Disk}
	for _, l := range cfg.Layers {
		want = append(want, l.Lowers...)
	}
	disks, err := disksBySerial(want)
	if err != nil {
		return err
	}
	for _, d := range []string{guestRoot, guestRW} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(disks[cfg.Disk], guestRW, "ext4", unix.MS_NOATIME, "noinit_itable,errors=remount-ro"); err != nil {
		return fmt.Errorf("mount the writable disk: %w", err)
	}
	mounted := map[string]bool{}
	for i, l := range cfg.Layers {
		var lowers []string
		for j := len(l.Lowers) - 1; j >= 0; j-- {
			s := l.Lowers[j]
			mp := filepath.Join(guestLower, s)
			if !mounted[s] {
				if err := os.MkdirAll(mp, 0o755); err != nil {
					return err
				}
				if err := unix.Mount(disks[s], mp, "erofs", unix.MS_RDONLY, ""); err != nil {
					return fmt.Errorf("mount lower %s (%s): %w", s, disks[s], err)
				}
				mounted[s] = true
			}
			lowers = append(lowers, mp)
		}
		upper := filepath.Join(guestRW, "upper", l.Name)
		work := filepath.Join(guestRW, "work", l.Name)
		for _, d := range []string{upper, work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("create %s: %w", d, err)
			}
		}
		target := guestRoot
		if i > 0 {
			target = filepath.Join(guestRoot, l.Target)
			if err := os.MkdirAll(target, 0o755); err != nil {
				return fmt.Errorf("create mount point %s: %w", l.Target, err)
			}
		}
		if len(lowers) == 0 {
			// overlayfs needs a lower: an empty one.
			empty := filepath.Join(guestLower, "empty")
			os.MkdirAll(empty, 0o755)
			lowers = []string{empty}
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,metacopy=off,redirect_dir=off,xino=off",
			strings.Join(lowers, ":"), upper, work)
		if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
			return fmt.Errorf("mount overlay at %s: %w", l.Target, err)
		}
	}
	return nil
}

func setupNet(n *guestNet) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	if n == nil {
		return nil
	}
	var eth netlink.Link
	for i := 0; ; i++ {
		eth, err = netlink.LinkByName("eth0")
		if err == nil {
			break
		}
		if i > 1000 {
			return fmt.Errorf("network interface: %w", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return configureEth(eth, n)
}

// configureEth gives eth n's MTU, global addresses (and no others) and
// default routes, changing only what differs.
func configureEth(eth netlink.Link, n *guestNet) error {
	if n.MTU > 0 && eth.Attrs().MTU != n.MTU {
		netlink.LinkSetMTU(eth, n.MTU)
	}
	var want []*netlink.Addr
	for _, a := range n.Addrs {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return err
		}
		if addr.IP.To4() == nil {
			addr.Flags = unix.IFA_F_NODAD
		}
		want = append(want, addr)
	}
	kept := map[string]bool{}
	have, _ := netlink.AddrList(eth, netlink.FAMILY_ALL)
	for _, a := range have {
		if a.Scope != unix.RT_SCOPE_UNIVERSE {
			continue
		}
		if slices.ContainsFunc(want, func(w *netlink.Addr) bool { return w.IPNet.String() == a.IPNet.String() }) {
			kept[a.IPNet.String()] = true
			continue
		}
		if err := netlink.AddrDel(eth, &a); err != nil {
			return fmt.Errorf("remove address %s: %w", a.IPNet, err)
		}
	}
	for _, a := range want {
		if kept[a.IPNet.String()] {
			continue
		}
		if err := netlink.AddrAdd(eth, a); err != nil {
			return fmt.Errorf("address %s: %w", a.IPNet, err)
		}
	}
	// No link-local address, as on the linux tier (see host.NoLinkLocal).
	if n.GW6 != "" {
		if err := host.NoLinkLocal(&netlink.Handle{}, eth); err != nil {
			return err
		}
	}
	if err := netlink.LinkSetUp(eth); err != nil {
		return err
	}
	gws := map[int]net.IP{}
	if n.GW != "" {
		gws[netlink.FAMILY_V4] = net.ParseIP(n.GW)
	}
	if n.GW6 != "" {
		gws[netlink.FAMILY_V6] = net.ParseIP(n.GW6)
	}
	routes, _ := netlink.RouteList(eth, netlink.FAMILY_ALL)
	for _, r := range routes {
		if r.Dst != nil && !r.Dst.IP.IsUnspecified() {
			continue
		}
		if gw := gws[r.Family]; gw == nil || !gw.Equal(r.Gw) {
			netlink.RouteDel(&r)
		}
	}
	for fam, gw := range gws {
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw, Family: fam}); err != nil {
			return fmt.Errorf("default route via %s: %w", gw, err)
		}
	}
	return nil
}

// openPort opens the virtio-serial port named name and removes its device
// node.
func openPort(name string) (*os.File, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ents, _ := os.ReadDir("/sys/class/virtio-ports")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/sys/class/virtio-ports", e.Name(), "name"))
			if err == nil && strings.TrimSpace(string(b)) == name {
				node := "/dev/" + e.Name()
				f, err := os.OpenFile(node, os.O_RDWR, 0)
				if err != nil {
					return nil, fmt.Errorf("open port %s: %w", name, err)
				}
				// Opened once, by the init, for the life of the VM: no
				// one else gets to open it.
				if err := os.Remove(node); err != nil {
					f.Close()
					return nil, fmt.Errorf("remove the device node of port %s: %w", name, err)
				}
				return f, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no virtio-serial port named %s", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// agentMain runs in the agent process: PID 1 of a new pid namespace, in
// a mount namespace of its own. It mounts the box's /proc, /sys and /dev
// on the root, moves into it, and serves the agent on its port (fd 3).
func agentMain() {
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "den-agent: %v\n", err)
		os.Exit(1)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fail(fmt.Errorf("make mounts private: %w", err))
	}
	var shm int64
	if len(os.Args) > 2 {
		shm, _ = strconv.ParseInt(os.Args[2], 10, 64)
	}
	if err := boxMounts(guestRoot, shm); err != nil {
		fail(err)
	}
	// The initramfs cannot be pivoted away from: move the root over it
	// and chroot, as switch_root does. Nothing stays reachable below.
	if err := unix.Chdir(guestRoot); err != nil {
		fail(err)
	}
	if err := unix.Mount(guestRoot, "/", "", unix.MS_MOVE, ""); err != nil {
		fail(fmt.Errorf("move root: %w", err))
	}
	if err := unix.Chroot("."); err != nil {
		fail(fmt.Errorf("chroot: %w", err))
	}
	unix.Chdir("/")
	port := os.NewFile(3, "agent-port")
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	a, err := agent.New(agent.Options{Confine: func() error { return confine.Apply(guestPolicy()) }})
	if err != nil {
		fail(fmt.Errorf("start agent: %w", err))
	}
	err = a.ServeLink(port, port)
	fail(fmt.Errorf("agent link: %v", err))
}

// boxMounts gives the root its /proc (of the agent's pid namespace),
// /sys, and a /dev with the usual nodes, /dev/pts, /dev/shm and
// /dev/mqueue; /tmp is a directory of the root.
func boxMounts(root string, shmSize int64) error {
	// The guest's kernel interfaces are hidden as on the linux tier
	// (MountSystem masks them): a command must not crash or reboot the
	// guest through sysrq, or read its kernel's memory.
	return host.MountSystem(root, shmSize, func(dst, name string) error {
		if err := unix.Mknod(dst, unix.S_IFCHR|0o666, int(unix.Mkdev(guestDevices[name][0], guestDevices[name][1]))); err != nil {
			return err
		}
		return os.Chmod(dst, 0o666)
	}, nil)
}

// guestDevices are the device numbers of the nodes MountSystem asks for.
var guestDevices = map[string][2]uint32{"null": {1, 3}, "zero": {1, 5}, "full": {1, 7}, "random": {1, 8}, "urandom": {1, 9}, "tty": {5, 0}}

// guestPolicy is den's default confinement without CAP_MKNOD: the guest
// kernel has no device cgroup, so a device node made inside would open the
// VM's disks raw (the linux tier's user namespace refuses mknod already).
func guestPolicy() confine.Policy {
	p := confine.Default()
	caps := p.Caps[:0:0]
	for _, c := range p.Caps {
		if c != confine.CapMknod {
			caps = append(caps, c)
		}
	}
	p.Caps = caps
	return p
}
