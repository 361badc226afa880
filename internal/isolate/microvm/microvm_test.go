package microvm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/host"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/isolate/isolatetest"
	"github.com/den-dev/den/internal/testenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	if IsGuest() {
		GuestMain()
	}
	os.Exit(m.Run())
}

// testCache keeps what is slow to remake across runs: the KVM verdict,
// erofs images of the test layers, initramfs.
const testCache = "/var/cache/den-microvm-test"

func testConfig() Config {
	return Config{
		RunDir:       filepath.Join("/run/den-test/microvm", strconv.Itoa(os.Getpid())),
		StateDir:     filepath.Join(testCache, "state"),
		Memory:       256 << 20,
		CgroupParent: "den-test",
	}
}

// newRuntime skips unless the machine can run microVMs.
func newRuntime(t testing.TB, mod func(*Config)) *Runtime {
	t.Helper()
	testenv.Tier(t, "microvm")
	cfg := testConfig()
	if os.Getenv("DEN_MICROVM_DEBUG") != "" {
		cfg.extraAppend = "loglevel=7 den.debug"
	}
	if mod != nil {
		mod(&cfg)
	}
	info := Detect(context.Background(), cfg)
	if !info.Available {
		testenv.Unavailable(t, "microvm", info.Reason)
	}
	rt, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("qemu %s, kernel %s, accel %s (%s)", info.QEMUVersion, info.Kernel, info.Accel, info.AccelReason)
	t.Cleanup(func() { os.RemoveAll(cfg.RunDir) })
	return rt
}

// busyboxRoot is a tiny root layer: busybox and its applets, /etc/passwd.
// It lives at a fixed path so its erofs image is cached across runs.
func busyboxRoot(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(testCache, "busybox-root")
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return dir
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("needs /bin/busybox (busybox-static)")
	}
	final := dir
	dir = fmt.Sprintf("%s.%d", final, os.Getpid())
	os.RemoveAll(dir)
	defer func() {
		os.Rename(dir, final) // a concurrent run may have made it first
		os.RemoveAll(dir)
	}()
	for _, d := range []string{"bin", "etc", "root", "tmp", "proc", "sys", "dev", "usr/bin", "srv"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	os.Chmod(filepath.Join(dir, "tmp"), 0o1777)
	os.Chmod(filepath.Join(dir, "root"), 0o700)
	b, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "bin/busybox"), b, 0o755)
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" {
			os.Symlink("busybox", filepath.Join(dir, "bin", a))
		}
	}
	os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "etc/group"), []byte("root:x:0:\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "etc/hidden"), []byte("lower\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "usr/bin/from-root"), []byte("root layer\n"), 0o644)
	os.WriteFile(filepath.Join(dir, ".complete"), nil, 0o644)
	return final
}

// usrLayer is an image layer for /usr with a file and a whiteout.
func usrLayer(t testing.TB) string {
	dir := filepath.Join(testCache, "usr-layer")
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return dir
	}
	os.RemoveAll(dir)
	os.MkdirAll(filepath.Join(dir, "share/den"), 0o755)
	os.WriteFile(filepath.Join(dir, "share/den/hello"), []byte("from the usr layer\n"), 0o644)
	os.Chown(filepath.Join(dir, "share/den/hello"), 1000, 1000)
	os.WriteFile(filepath.Join(dir, ".complete"), nil, 0o644)
	return dir
}

// whiteoutLayer hides /etc/hidden of the root layer.
func whiteoutLayer(t testing.TB) string {
	dir := filepath.Join(testCache, "whiteout-layer")
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return dir
	}
	os.RemoveAll(dir)
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	if err := syscall.Mknod(filepath.Join(dir, "etc/hidden"), syscall.S_IFCHR|0o000, 0); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, ".complete"), nil, 0o644)
	return dir
}

func testSpec(t testing.TB, id string) *isolate.Spec {
	return &isolate.Spec{
		ID: id, Hostname: "box-" + id, Dir: filepath.Join(t.TempDir(), "state"),
		Layers: []isolate.Overlay{{Target: "/", Lowers: []string{busyboxRoot(t)}, Name: "root"}},
		Limits: isolate.Limits{Memory: 256 << 20, CPUs: 1},
	}
}

func sh(t testing.TB, b isolate.Box, script string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := isolatetest.Exec(ctx, b.Agent(), &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatalf("%q: %v", script, err)
	}
	return res.Stdout + res.Stderr, res.Exit.ExitCode
}

func mustSh(t testing.TB, b isolate.Box, script string) string {
	t.Helper()
	out, code := sh(t, b, script)
	if code != 0 {
		t.Fatalf("%q: exit %d: %s", script, code, out)
	}
	return out
}

func TestConformance(t *testing.T) {
	rt := newRuntime(t, nil)
	isolatetest.Run(t, isolatetest.Harness{
		Runtime: rt,
		Spec:    func(t *testing.T, id string) *isolate.Spec { return testSpec(t, id) },
		Timeout: 90 * time.Second,
	})
}

// One VM's life: boot with a /usr overlay and a whiteout layer, Load by
// pid after the runtime object is dropped, checkpoint and restore with a
// background counter, then QEMU killed under the box.
func TestLifecycle(t *testing.T) {
	rt := newRuntime(t, nil)
	ctx := context.Background()
	spec := testSpec(t, "life")
	spec.Layers[0].Lowers = append(spec.Layers[0].Lowers, whiteoutLayer(t))
	spec.Layers = append(spec.Layers, isolate.Overlay{Target: "/usr", Lowers: []string{usrLayer(t)}, Name: "usr"})
	defer rt.Destroy(ctx, spec)
	t0 := time.Now()
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	mustSh(t, b, "true")
	t.Logf("cold start (Start until exec of true answered): %v", time.Since(t0))
	checkBootIdentity(t, b)
	checkQEMUCgroup(t, b.Pid(), spec.ID)
	out := mustSh(t, b, "cat /usr/share/den/hello; stat -c %u:%g /usr/share/den/hello; ls /usr/bin/from-root 2>&1; cat /etc/hidden 2>&1; echo new > /usr/share/den/new; ls /usr/share/den")
	if !strings.Contains(out, "from the usr layer\n1000:1000\n") || !strings.Contains(out, "No such file") || !strings.Contains(out, "hello\nnew") {
		t.Fatalf("usr overlay / whiteout: %q", out)
	}
	if strings.Contains(out, "root layer") || strings.Contains(out, "lower\n") {
		t.Fatalf("the /usr overlay or the whiteout did not hide the lower file: %q", out)
	}
	if _, err := os.Stat(filepath.Join(usrLayer(t), "share/den/new")); err == nil {
		t.Fatal("a write reached the image layer")
	}
	var ps struct{ ID string }
	if err := b.Agent().JSON(ctx, "POST", agent.PathProcs, nil, &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done"}}, &ps); err != nil {
		t.Fatal(err)
	}

	// A new runtime (as after a daemon restart) reattaches by pid once
	// the old one's connections are gone.
	pid := b.Pid()
	b.(*box).qmp.close()
	b.(*box).link.Close()
	rt2, err := New(rt.cfg)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := rt2.Load(ctx, spec, pid)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if out := mustSh(t, b2, "hostname"); out != spec.Hostname+"\n" {
		t.Fatalf("after load: %q", out)
	}
	if _, err := rt2.Load(ctx, spec, os.Getpid()); err == nil {
		t.Fatal("Load accepted a pid that is not the box's QEMU")
	}

	// Checkpoint (stopping) and restore: the counter runs on.
	dir := filepath.Join(t.TempDir(), "ckpt")
	before, _ := strconv.Atoi(strings.TrimSpace(mustSh(t, b2, "cat /tmp/count")))
	t1 := time.Now()
	if err := rt2.Checkpoint(ctx, b2, dir, false); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	ck := time.Since(t1)
	select {
	case <-b2.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("QEMU still runs after a stopping checkpoint")
	}
	mem, _ := os.Stat(filepath.Join(dir, "memory"))
	t2 := time.Now()
	r, err := rt2.Restore(ctx, spec, dir)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	mustSh(t, r, "true")
	checkQEMUCgroup(t, r.Pid(), spec.ID)
	t.Logf("checkpoint %v (memory file %d MiB), restore until exec answered %v", ck, mem.Size()>>20, time.Since(t2))
	after, _ := strconv.Atoi(strings.TrimSpace(mustSh(t, r, "cat /tmp/count")))
	time.Sleep(300 * time.Millisecond)
	later, _ := strconv.Atoi(strings.TrimSpace(mustSh(t, r, "cat /tmp/count; cat /usr/share/den/new")[:2]))
	if after < before || later <= after {
		t.Fatalf("counter %d before the checkpoint, %d after restore, %d later", before, after, later)
	}

	// QEMU killed: Done closes, Stop frees the run directory.
	syscall.Kill(r.Pid(), syscall.SIGKILL)
	select {
	case <-r.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after QEMU was killed")
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rt2.boxRun(spec.ID)); !os.IsNotExist(err) {
		t.Fatalf("run dir left after Stop: %v", err)
	}
	for _, d := range []string{rt2.cg.Dir(spec.ID, "memory"), rt2.cg.Dir(spec.ID, "pids")} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left after Stop: %v", d, err)
		}
	}
}

// checkQEMUCgroup checks, in /proc/PID/cgroup, that a box's QEMU is in
// the group PARENT/ID of the runtime's parent (den-test here).
func checkQEMUCgroup(t *testing.T, pid int, id string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	want := "/den-test/" + id
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && (f[1] == "memory" || f[0] == "0" && f[1] == "") && f[2] != "/" {
			if f[2] != want {
				t.Fatalf("QEMU's cgroup is %s, want %s", f[2], want)
			}
			return
		}
	}
	t.Fatalf("QEMU (pid %d) is in no cgroup of den's:\n%s", pid, b)
}

// checkBootIdentity checks that a booted box's recorded identity is the
// one bootIdentity reads back from its machine, as a restore of a
// checkpoint that recorded none does: the same box then skips the
// identity request.
func checkBootIdentity(t *testing.T, b isolate.Box) {
	t.Helper()
	vm := b.(*box).vm
	want, _ := json.Marshal(vm.Ident)
	got, _ := json.Marshal(bootIdentity(vm))
	if vm.Ident == nil || vm.Ident.Hostname == "" || vm.Net != (vm.Ident.Net != nil && vm.Ident.MAC != "") || string(got) != string(want) {
		t.Fatalf("identity recorded at boot %s, read from the machine %s", want, got)
	}
}

// A guest kernel panic ends the VM and is reported; so is a guest that
// cannot boot.
func TestGuestFailures(t *testing.T) {
	// Commands cannot reach the guest's sysrq (it is read-only inside), so
	// the panic comes through the guest init's control port.
	rt := newRuntime(t, nil)
	ctx := context.Background()
	spec := testSpec(t, "panic")
	defer rt.Destroy(ctx, spec)
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	res, err := isolatetest.Exec(ctx, b.Agent(), &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", "echo c > /proc/sysrq-trigger"}})
	if err != nil || res.Exit.ExitCode == 0 {
		t.Fatalf("a command reached the guest's sysrq: %+v %v", res, err)
	}
	ctl, err := net.Dial("unix", filepath.Join(b.(*box).run, "ctl.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	if _, err := ctl.Write([]byte("crash\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the VM runs on after a kernel panic")
	}
	if f := b.(*box).failure(); !strings.Contains(f, "Kernel panic") {
		t.Fatalf("console after the panic: %s", f)
	}
	b.Stop(ctx)

	bad := newRuntime(t, func(c *Config) { c.extraAppend = "rdinit=/den-missing" })
	_, err = bad.Start(ctx, testSpec(t, "badboot"))
	if err == nil || !strings.Contains(err.Error(), "panic") {
		t.Fatalf("a guest that cannot boot: %v", err)
	}
	t.Logf("reported: %.300s", err)
	if _, err := os.Stat(bad.boxRun("badboot")); !os.IsNotExist(err) {
		t.Fatalf("run dir left after a failed start: %v", err)
	}
	if _, err := rt.Start(ctx, &isolate.Spec{ID: "vol", Dir: t.TempDir(), Layers: spec.Layers, Mounts: []isolate.Mount{{Source: "/tmp", Target: "/mnt"}}}); err == nil || !strings.Contains(err.Error(), "microvm") {
		t.Fatalf("mounts: %v", err)
	}
}

// The guest owns its slot's address on den's bridge: its connections
// leave through the slot's veth and are redirected to the egress proxy's
// port, seen there from the slot's address.
func TestNetwork(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nftables")
	}
	id := os.Getpid() % 10000
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	ncfg := host.NetworkConfig{
		Bridge: fmt.Sprintf("dmv%d", id), Table: fmt.Sprintf("denmv%d", id),
		Subnet:      netip.MustParsePrefix(fmt.Sprintf("10.232.%d.0/24", id%250)),
		Transparent: port, DNS: port + 1, HTTPProxy: port + 2,
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	t.Cleanup(func() {
		exec.Command("nft", "delete", "table", "inet", ncfg.Table).Run()
		if l, err := netlink.LinkByName(ncfg.Bridge); err == nil {
			netlink.LinkDel(l)
		}
	})
	n, err := host.NewNetwork(ncfg)
	if err != nil {
		t.Fatal(err)
	}
	rt := newRuntime(t, func(c *Config) { c.Network = n })
	ctx := context.Background()
	spec := testSpec(t, "net")
	spec.Net, spec.NetSlot, spec.NetBandwidth = true, 5, 10<<20
	defer rt.Destroy(ctx, spec)
	// Every connection is answered "pong from ADDR" (its source) and
	// reported as "ADDR WHAT-IT-SENT".
	got := make(chan string, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				b := make([]byte, 64)
				k, _ := io.ReadAtLeast(c, b, 5)
				from := c.RemoteAddr().(*net.TCPAddr).IP.String()
				fmt.Fprintf(c, "pong from %s\n", from)
				select {
				case got <- from + " " + string(b[:k]):
				default:
				}
			}()
		}
	}()
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	checkBootIdentity(t, b)
	addr, _ := n.Addr(spec.NetSlot)
	out := mustSh(t, b, "ip -4 addr show eth0 | grep inet; echo hello | nc -w 5 198.51.100.7 80")
	if !strings.Contains(out, addr.String()+"/") || !strings.Contains(out, "pong from "+addr.String()) {
		t.Fatalf("guest network: %q (want %s and the proxy's answer)", out, addr)
	}
	select {
	case s := <-got:
		if !strings.HasPrefix(s, addr.String()+" hello") {
			t.Fatalf("the proxy saw %q, want a connection from %s", s, addr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the connection did not reach the egress port")
	}
	// No IPv6 link-local address (a connection to the bridge's fe80::
	// address would leave from it, naming no sandbox), but its own.
	if out := mustSh(t, b, "cat /proc/net/if_inet6"); strings.Contains(out, "fe80") || !strings.Contains(out, "eth0") {
		t.Fatalf("the guest's IPv6 addresses:\n%s", out)
	}
	st, err := b.(isolate.Statser).Stats()
	if err != nil || st.NetTxBytes == 0 || st.NetRxBytes == 0 {
		t.Fatalf("stats: %+v %v", st, err)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(rt.boxRun(spec.ID), "netns")); !os.IsNotExist(err) {
		t.Fatalf("netns left after Stop: %v", err)
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if m := l.Attrs().MasterIndex; m != 0 {
			if br, _ := netlink.LinkByIndex(m); br != nil && br.Attrs().Name == ncfg.Bridge {
				t.Fatalf("veth %s left on the bridge after Stop", l.Attrs().Name)
			}
		}
	}

	// A fork: a checkpoint of a networked box restored into another box
	// (slot 7, its files a copy) and into the source again (slot 6), both
	// running. Each has its own slot's address and its own MAC, and its
	// connections leave from that address.
	src := testSpec(t, "netsrc")
	src.Net, src.NetSlot = true, 6
	defer rt.Destroy(ctx, src)
	sb, err := rt.Start(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	mustSh(t, sb, "echo hello | nc -w 5 198.51.100.7 80")
	<-got
	ck := filepath.Join(t.TempDir(), "ckpt")
	if err := rt.Checkpoint(ctx, sb, ck, false); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	fork := testSpec(t, "netfork")
	fork.Net, fork.NetSlot = true, 7
	defer rt.Destroy(ctx, fork)
	os.RemoveAll(fork.Dir)
	if out, err := exec.Command("cp", "-a", "--reflink=auto", src.Dir, fork.Dir).CombinedOutput(); err != nil {
		t.Fatalf("copy the box's files: %v: %s", err, out)
	}
	t0 := time.Now()
	fb, err := rt.Restore(ctx, fork, ck)
	if err != nil {
		t.Fatalf("restore into the fork: %v", err)
	}
	defer fb.Stop(ctx)
	t.Logf("fork restored in %v, identity step %v", time.Since(t0), fb.(*box).identified)
	t0 = time.Now()
	rb, err := rt.Restore(ctx, src, ck)
	if err != nil {
		t.Fatalf("restore into the source: %v", err)
	}
	defer rb.Stop(ctx)
	t.Logf("source restored in %v, identity step %v", time.Since(t0), rb.(*box).identified)
	if fb.(*box).identified == 0 || rb.(*box).identified != 0 {
		t.Fatalf("identity step: %v in the fork, %v in the source (want one in the fork only: the source's identity is unchanged)", fb.(*box).identified, rb.(*box).identified)
	}
	for _, c := range []struct {
		b    isolate.Box
		spec *isolate.Spec
	}{{fb, fork}, {rb, src}} {
		a, _ := n.Addr(c.spec.NetSlot)
		out := mustSh(t, c.b, "cat /sys/class/net/eth0/address; ip -4 addr show eth0 | grep -c inet; ip -4 addr show eth0 | grep inet; echo hello | nc -w 5 198.51.100.7 80")
		want := guestMAC(c.spec.ID) + "\n1\n"
		if !strings.HasPrefix(out, want) || !strings.Contains(out, " "+a.String()+"/") || !strings.HasSuffix(out, "pong from "+a.String()+"\n") {
			t.Fatalf("%s after the fork: %q (want MAC %s, only the address %s, and the connection seen from it)", c.spec.ID, out, guestMAC(c.spec.ID), a)
		}
		// IPv6 too, where the slot has it: its global address only.
		if a6, err := n.Addr6(c.spec.NetSlot); err == nil && c.b.(*box).vm.Ident.Net.GW6 != "" {
			out := mustSh(t, c.b, "ip -6 addr show dev eth0 | grep inet6")
			if strings.Count(out, "inet6") != 1 || !strings.Contains(out, " "+a6.String()+"/") {
				t.Fatalf("%s after the fork: IPv6 %q, want only %s (no link-local address)", c.spec.ID, out, a6)
			}
		}
		select {
		case s := <-got:
			if s != a.String()+" hello\n" {
				t.Fatalf("%s: the listener saw %q, want a connection from %s", c.spec.ID, s, a)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the connection was not reported", c.spec.ID)
		}
	}
}

// BenchmarkRawBoot boots the same kernel and initramfs with a bare QEMU
// command to the guest init, which powers off at once: the floor under
// Start.
func BenchmarkRawBoot(b *testing.B) {
	rt := newRuntime(b, nil)
	initrd, err := initramfs(rt.cfg.StateDir, rt.cfg.Exe, rt.info.KernelVer)
	if err != nil {
		b.Fatal(err)
	}
	cpu := "max"
	if rt.info.Accel == "kvm" {
		cpu = "host"
	}
	appendLine := "console=ttyS0 quiet panic=-1 reboot=t den.probe"
	if rt.info.Accel == "tcg" {
		appendLine += fmt.Sprintf(" tsc_early_khz=%d tsc=reliable", hostTSCkHz())
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out, err := exec.Command(rt.info.QEMU, "-M", "microvm,x-option-roms=off,isa-serial=on,rtc=off,acpi=on",
			"-accel", rt.info.Accel, "-cpu", cpu, "-m", "256", "-nodefaults", "-no-user-config", "-nographic",
			"-serial", "stdio", "-kernel", rt.info.Kernel, "-initrd", initrd,
			"-append", appendLine, "-no-reboot").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "den-guest-ready") {
			b.Fatalf("%v: %s", err, out)
		}
	}
}

// BenchmarkColdStart is Start until the agent answers an exec of true.
func BenchmarkColdStart(b *testing.B) {
	rt := newRuntime(b, nil)
	ctx := context.Background()
	spec := testSpec(b, "bench")
	defer rt.Destroy(ctx, spec)
	for i := 0; i < b.N; i++ {
		bx, err := rt.Start(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		mustSh(b, bx, "true")
		bx.Stop(ctx)
	}
}

// The redirect towards eth0 passes only the frames from the box's MAC: a
// guest restored from another box's checkpoint sends nothing as that box
// before it has taken its own identity. Frames sent on a1 enter a0, whose
// redirect to b0 is the tap's; b1 sees what passed.
func TestMACFilter(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	dir := filepath.Join("/run/den-test/microvm-mac", strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	nsPath := filepath.Join(dir, "netns")
	if err := host.CreateNetNS(nsPath); err != nil {
		t.Fatalf("make a network namespace: %v", err)
	}
	defer host.RemoveNetNS(nsPath)
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links := map[string]netlink.Link{}
	for _, p := range [][2]string{{"a0", "a1"}, {"b0", "b1"}} {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p[0]}, PeerName: p[1]}); err != nil {
			t.Fatal(err)
		}
		for _, name := range p {
			l, err := h.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			h.LinkSetUp(l)
			links[name] = l
		}
	}
	mine := net.HardwareAddr{0x02, 0xde, 0x01, 0x02, 0x03, 0x04}
	other := net.HardwareAddr{0x02, 0xde, 0x01, 0x02, 0x03, 0x05}
	if err := redirect(h, links["a0"], links["b0"], mine); err != nil {
		t.Fatal(err)
	}
	const etherType = 0x88b5 // local experimental
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the namespace
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		rx, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(etherType)))
		if err != nil {
			done <- err
			return
		}
		defer unix.Close(rx)
		if err := unix.Bind(rx, &unix.SockaddrLinklayer{Protocol: htons(etherType), Ifindex: links["b1"].Attrs().Index}); err != nil {
			done <- err
			return
		}
		unix.SetsockoptTimeval(rx, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
		tx, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			done <- err
			return
		}
		defer unix.Close(tx)
		for _, src := range []net.HardwareAddr{other, mine} {
			frame := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, src...)
			frame = append(frame, etherType>>8, etherType&0xff)
			frame = append(frame, make([]byte, 46)...)
			if err := unix.Sendto(tx, frame, 0, &unix.SockaddrLinklayer{Ifindex: links["a1"].Attrs().Index, Halen: 6}); err != nil {
				done <- err
				return
			}
		}
		buf := make([]byte, 1500)
		for {
			n, _, err := unix.Recvfrom(rx, buf, 0)
			if err != nil {
				done <- fmt.Errorf("no frame from the box's MAC came through: %w", err)
				return
			}
			switch src := net.HardwareAddr(buf[6:12]); {
			case n < 14:
			case src.String() == other.String():
				done <- fmt.Errorf("a frame from another MAC (%s) came through", src)
				return
			case src.String() == mine.String():
				done <- nil
				return
			}
		}
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The agent's virtio-serial port (and the init's control port) stay out
// of commands' reach: no command holds the agent's descriptor of it (it
// was fd 3 of every command), the box's /dev has no node for either, and
// neither root nor an unprivileged user reaches one through any
// descriptor /proc shows them.
func TestPortsOutOfReach(t *testing.T) {
	rt := newRuntime(t, nil)
	ctx := context.Background()
	spec := testSpec(t, "ports")
	defer rt.Destroy(ctx, spec)
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	// The ports exist (what is refused below is not refused for want of them).
	if out := mustSh(t, b, "cat /sys/class/virtio-ports/*/name"); !strings.Contains(out, agentPort+"\n") || !strings.Contains(out, ctlPort+"\n") {
		t.Fatalf("virtio-serial ports in the guest: %q", out)
	}
	// The shell's own descriptors are listed by another, exec'd process;
	// then every descriptor the user can resolve in /proc, and the device
	// nodes the port names would have.
	const probe = `/bin/busybox ls /proc/$$/fd; echo --; ` +
		`for f in /proc/[0-9]*/fd/*; do l=$(readlink $f) && echo "$f -> $l"; done; ` +
		`for p in /sys/class/virtio-ports/*; do n=/dev/${p##*/}; [ -e $n ] && echo "node $n"; done; echo end`
	for _, user := range []string{"root", "65534"} {
		ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		res, err := isolatetest.Exec(ctx, b.Agent(), &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", probe}, User: user})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		fds, rest, ok := strings.Cut(res.Stdout, "--\n")
		if res.Exit.ExitCode != 0 || !ok || !strings.HasSuffix(rest, "end\n") {
			t.Fatalf("probe as %s: %+v", user, res)
		}
		if got := strings.Fields(fds); !slices.Equal(got, []string{"0", "1", "2"}) {
			t.Errorf("as %s a command holds descriptors %v, want 0 1 2:\n%s", user, got, res.Stdout)
		}
		if !strings.Contains(rest, "/fd/0 -> /dev/null\n") {
			t.Fatalf("as %s /proc shows no descriptor at all, so the check below shows nothing:\n%s", user, rest)
		}
		for _, l := range strings.Split(rest, "\n") {
			if strings.Contains(l, "vport") || strings.HasPrefix(l, "node ") {
				t.Errorf("as %s a command reaches a virtio-serial port: %s", user, l)
			}
		}
	}
}

// The guest's wall clock follows the host's: at boot (1970 before den
// set it), after a pause (the guest's clock stood still meanwhile) and
// after a restore made later than its checkpoint (the saved memory holds
// the checkpoint's time). TestMicrovmClock (internal/server) has openssl
// verify a certificate inside.
func TestClock(t *testing.T) {
	rt := newRuntime(t, nil)
	ctx := context.Background()
	spec := testSpec(t, "clock")
	spec.Layers = append(spec.Layers, isolate.Overlay{Target: "/opt", Lowers: []string{clockProbeLayer(t)}, Name: "opt"})
	defer rt.Destroy(ctx, spec)
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	checkClock(t, b, "after boot")
	// The kernel read it from the RTC at boot too.
	before := time.Now().Unix()
	out, _ := sh(t, b, "cat /sys/class/rtc/rtc0/since_epoch 2>&1")
	rtc := strings.TrimSpace(out)
	if v, err := strconv.ParseInt(rtc, 10, 64); err != nil || v < before-2 || v > time.Now().Unix()+2 {
		t.Errorf("the guest's RTC reads %q, the host's clock %d", rtc, before)
	}

	if err := b.(*box).Pause(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if err := b.(*box).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	checkClock(t, b, "after a 5 s pause")

	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := rt.Checkpoint(ctx, b, dir, false); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	time.Sleep(5 * time.Second)
	r, err := rt.Restore(ctx, spec, dir)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	defer r.Stop(ctx)
	checkClock(t, r, "after a restore 5 s after the checkpoint")
}

// A running guest's clock that went astray is stepped back to the
// host's: here one set an hour back through the control port (as a
// guest clock that drifted, only further).
func TestClockResync(t *testing.T) {
	rt := newRuntime(t, func(c *Config) { c.clockSync = time.Second })
	ctx := context.Background()
	spec := testSpec(t, "clocksync")
	defer rt.Destroy(ctx, spec)
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(ctx)
	readClock := func() (guest, host int64) {
		out := strings.TrimSpace(mustSh(t, b, "date +%s"))
		g, err := strconv.ParseInt(out, 10, 64)
		if err != nil {
			t.Fatalf("date +%%s printed %q", out)
		}
		return g, time.Now().Unix()
	}
	// The box's lock keeps the periodic step out while the clock is set
	// back and read.
	bx := b.(*box)
	bx.mu.Lock()
	err = bx.control(ctx, "time "+strconv.FormatInt(time.Now().Add(-time.Hour).UnixNano(), 10))
	g, h := readClock()
	bx.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if h-g < 3500 {
		t.Fatalf("the guest's clock was set an hour back, it reads %d s behind", h-g)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		g, h = readClock()
		if g >= h-2 && g <= h+2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest's clock is still %d s off the host's a minute later", h-g)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// checkClock checks the guest's clock (isolatetest.CheckClock) and logs
// how far off it is, finer than date's seconds.
func checkClock(t *testing.T, b isolate.Box, when string) {
	t.Helper()
	isolatetest.CheckClock(t, context.Background(), b, when)
	t0 := time.Now()
	out := strings.TrimSpace(mustSh(t, b, clockEnv+"=1 /opt/bin/clockprobe"))
	t1 := time.Now()
	if ns, err := strconv.ParseInt(out, 10, 64); err == nil {
		mid := t0.Add(t1.Sub(t0) / 2)
		t.Logf("%s: guest clock - host clock = %v (± %v, the exec's half round trip)", when, time.Unix(0, ns).Sub(mid), t1.Sub(t0)/2)
	}
}

// clockEnv makes the test binary print its clock in Unix nanoseconds and
// exit (busybox's date has no %N).
const clockEnv = "DEN_TEST_PRINT_CLOCK"

func init() {
	if os.Getenv(clockEnv) != "" {
		fmt.Println(time.Now().UnixNano())
		os.Exit(0)
	}
}

// clockProbeLayer is a layer for /opt holding this test binary (static),
// which prints its clock when clockEnv is set.
func clockProbeLayer(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(testCache, "clockprobe-layer")
	exe, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	// Rewritten only when the binary changed: its erofs image is cached by
	// the tree's metadata.
	if have, err := os.ReadFile(filepath.Join(dir, "bin/clockprobe")); err == nil && string(have) == string(exe) {
		return dir
	}
	os.RemoveAll(dir)
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/clockprobe"), exe, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
