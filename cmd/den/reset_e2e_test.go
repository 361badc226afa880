package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/instance"
	"github.com/den-dev/den/internal/testenv/e2e"
)

// resetCLI runs den system reset on d's data directory, as root.
func resetCLI(t *testing.T, d *daemon, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(e2e.DenBinary(t), append([]string{"system", "reset", "--data", d.data}, args...)...)
	cmd.Env = []string{"DEN_TEST_RUN_DEN=1", "HOME=/", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if stderr.Len() > 0 {
		t.Logf("den system reset %s: stderr:\n%s", strings.Join(args, " "), stderr.String())
	}
	if err != nil {
		return string(out) + stderr.String(), err
	}
	return string(out), nil
}

// alive reports whether pid is a process that has not exited (a zombie
// has: this host's PID 1 may not reap the orphans it inherits).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && !strings.HasPrefix(rest, "Z")
}

// hostView is what the host's own tools show of one daemon: its mounts
// (/proc/self/mountinfo), loop devices (/sys/block), bridge (ip link),
// nftables table (nft list tables), cgroup groups (the cgroup
// filesystems) and processes (ps).
type hostView struct {
	mounts, loops, links, tables, cgroups, procs []string
}

func (h hostView) empty() bool {
	return len(h.mounts)+len(h.loops)+len(h.links)+len(h.tables)+len(h.cgroups)+len(h.procs) == 0
}

func (h hostView) String() string {
	return fmt.Sprintf("mounts %q\nloops %q\nlinks %q\nnft tables %q\ncgroups %q\nprocesses %q", h.mounts, h.loops, h.links, h.tables, h.cgroups, h.procs)
}

// viewOf lists what of d (bridge br, cgroup parent cg, sandbox init pids)
// the host shows.
func viewOf(t *testing.T, d *daemon, data, br, cg string, pids []int, ports ...string) hostView {
	t.Helper()
	var h hostView
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (under(f[4], data) || under(f[4], d.run)) {
			h.mounts = append(h.mounts, f[4])
		}
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && under(strings.TrimSpace(string(b)), data) {
			h.loops = append(h.loops, f+": "+strings.TrimSpace(string(b)))
		}
	}
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatalf("ip link: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		// The bridge, its ports (the sandboxes' veths), and any link
		// left of a port seen before.
		if name == br || slices.Contains(f, "master") && f[slices.Index(f, "master")+1] == br || slices.Contains(ports, name) {
			h.links = append(h.links, name)
		}
	}
	out, err = exec.Command("nft", "list", "tables").Output()
	if err != nil {
		t.Fatalf("nft list tables: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) == "table inet "+tableOf(br) {
			h.tables = append(h.tables, line)
		}
	}
	hier, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range hier {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", e.Name(), cg)); err == nil {
			h.cgroups = append(h.cgroups, filepath.Join("/sys/fs/cgroup", e.Name(), cg))
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", cg)); err == nil {
		h.cgroups = append(h.cgroups, filepath.Join("/sys/fs/cgroup", cg))
	}
	for _, pid := range pids {
		if alive(pid) {
			h.procs = append(h.procs, fmt.Sprintf("sandbox init %d", pid))
		}
	}
	// runsc's processes name the daemon's run directory (--root).
	out, _ = exec.Command("ps", "-eo", "pid=,args=").Output()
	for _, line := range strings.Split(string(out), "\n") {
		pid, args, _ := strings.Cut(strings.TrimSpace(line), " ")
		if n, err := strconv.Atoi(pid); err == nil && alive(n) && strings.Contains(args, d.run+"/") && !strings.Contains(args, " system reset ") {
			h.procs = append(h.procs, strings.TrimSpace(line))
		}
	}
	return h
}

func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// tableOf is the nftables table den serve --bridge br makes (see
// host.TableName), spelled out here so the test checks the name.
func tableOf(br string) string { return "den_" + br }

// boxCgroup is the memory cgroup of a host pid, from /proc/PID/cgroup.
func boxCgroup(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && (f[1] == "memory" || f[0] == "0" && f[1] == "") {
			if f[2] != "/" {
				return f[2]
			}
		}
	}
	t.Fatalf("pid %d has no memory cgroup:\n%s", pid, b)
	return ""
}

// TestSystemReset runs two daemons at once, each with its own data
// directory, run directory, bridge and sandboxes (networked, on the linux
// tier, and on gvisor where it runs): their boxes' cgroups have different
// parents. After a kill -9 of the first, den system reset on the second's
// data directory is refused (it runs) and changes nothing, while on the
// first's it stops its sandboxes and removes all of it (the host's own
// views say so), the second's left whole and working; a second reset
// finds nothing.
func TestSystemReset(t *testing.T) {
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	n := os.Getpid() % 100000
	type side struct {
		d          *daemon
		data       string
		br, cg     string
		sb         []*api.Sandbox
		pids       []int
		gvisorOnly bool
	}
	var sides [2]*side
	for i, sub := range []string{"10.231.0.0/24", "10.232.0.0/24"} {
		s := &side{br: fmt.Sprintf("dr%c%d", 'a'+i, n)}
		// Registered before the daemon, so that it runs after the
		// daemon's own cleanup: the bridge and cgroup parent stay after
		// den serve ends, and the test leaves nothing behind.
		t.Cleanup(func() {
			if s.d == nil {
				return
			}
			// The data directory is gone by now (t.TempDir): made
			// again with the record of what the daemon made.
			os.MkdirAll(s.d.data, 0o700)
			defer os.RemoveAll(s.d.data)
			l, err := instance.Acquire(s.d.data)
			if err != nil {
				t.Error(err)
				return
			}
			err = l.Write(instance.Record{Run: s.d.run, Bridge: s.br, Table: tableOf(s.br), CgroupParent: s.cg})
			l.Release()
			if err != nil {
				t.Error(err)
			}
			if out, err := resetCLI(t, s.d, "--yes"); err != nil {
				t.Errorf("reset at cleanup: %v\n%s", err, out)
			}
		})
		args := []string{"--net=true", "--bridge", s.br, "--subnet", sub}
		if i == 0 {
			args = append(args, "--runtimes", "linux,gvisor")
		}
		s.d = newDaemonArgs(t, args)
		var err error
		if s.data, err = instance.Canonical(s.d.data); err != nil {
			t.Fatal(err)
		}
		s.cg = instance.CgroupParent(s.data)
		sides[i] = s
	}
	a, b := sides[0], sides[1]
	ctx := context.Background()
	tiers := []string{"linux"}
	if info, err := a.d.c.Info(ctx); err != nil {
		t.Fatal(err)
	} else {
		for _, rt := range info.Runtimes {
			if rt.Name == "gvisor" && rt.Available {
				tiers = append(tiers, "gvisor")
			} else if rt.Name == "gvisor" {
				t.Logf("gvisor is not available here (%s): the linux tier only", rt.Reason)
			}
		}
	}
	for _, s := range sides {
		ts := tiers
		if s == b {
			ts = []string{"linux"}
		}
		for _, tier := range ts {
			sb, err := s.d.c.Create(ctx, api.CreateRequest{Runtime: tier, Network: &api.NetworkPolicy{Mode: "open"}})
			if err != nil {
				t.Fatalf("create on %s: %v\n%s", tier, err, s.d.logText())
			}
			s.sb = append(s.sb, sb)
			if sb.Pid > 0 {
				s.pids = append(s.pids, sb.Pid)
			}
			// The box's cgroup, as the kernel says: under the daemon's
			// own parent.
			if tier == "linux" {
				got := boxCgroup(t, sb.Pid)
				if want := "/" + s.cg + "/" + sb.ID; got != want {
					t.Errorf("%s box of %s: cgroup %s, want %s", tier, s.br, got, want)
				}
			}
		}
		if got := s.d.sh(s.sb[0].ID, "echo up"); got != "up\n" {
			t.Fatalf("sandbox says %q", got)
		}
	}
	if a.cg == b.cg || a.cg == "den" {
		t.Fatalf("two daemons share the cgroup parent %s (or use the default's)", a.cg)
	}
	va, vb := viewOf(t, a.d, a.data, a.br, a.cg, a.pids), viewOf(t, b.d, b.data, b.br, b.cg, b.pids)
	for _, v := range []hostView{va, vb} {
		if len(v.links) < 2 || len(v.tables) == 0 || len(v.cgroups) == 0 || len(v.procs) == 0 || len(v.mounts) == 0 {
			t.Fatalf("a running daemon's things are not all visible:\n%s", v)
		}
	}
	t.Logf("daemon a on the host:\n%s", va)

	a.d.kill9()

	// Refused while b runs: it names b's pid and what to do, and b's
	// sandbox and everything of b stay.
	out, err := resetCLI(t, b.d, "--yes")
	if err == nil {
		t.Fatalf("reset of a running daemon's data directory was not refused:\n%s", out)
	}
	if pid := b.d.proc.cmd.Process.Pid; !strings.Contains(out, fmt.Sprintf("process %d", pid)) || !strings.Contains(out, "stop it first") {
		t.Errorf("refusal does not name the daemon (pid %d) and what to do:\n%s", pid, out)
	}
	if got := b.d.sh(b.sb[0].ID, "echo still"); got != "still\n" {
		t.Fatalf("b's sandbox after the refused reset says %q", got)
	}
	if v := viewOf(t, b.d, b.data, b.br, b.cg, b.pids); len(v.links) == 0 || len(v.tables) == 0 || len(v.cgroups) != len(vb.cgroups) || len(v.procs) != len(vb.procs) {
		t.Fatalf("a refused reset changed b:\nbefore\n%s\nafter\n%s", vb, v)
	}

	// A second daemon on b's data directory is refused too (it would
	// adopt and remove b's sandboxes).
	run2 := t.TempDir()
	ctx2, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx2, e2e.DenBinary(t), "serve", "--data", b.d.data, "--run", run2, "--listen", "unix://"+run2+"/den.sock",
		"--net=false", "--runtimes", "linux", "--warm", "0", "--storage", "dir")
	cmd.Env = append(os.Environ(), "DEN_TEST_RUN_DEN=1")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "is using the data directory") || !strings.Contains(string(out), "stop it first, or give this daemon another --data") {
		t.Errorf("a second den serve on a running daemon's data directory: %v\n%s", err, out)
	}
	// A daemon that holds no lock (of an earlier release: here, its lock
	// file is gone) is found by its socket.
	if err := os.Remove(filepath.Join(b.data, "daemon.lock")); err != nil {
		t.Fatal(err)
	}
	out, err = resetCLI(t, b.d, "--yes")
	if err == nil || !strings.Contains(out, "a daemon answers on "+b.d.run+"/den.sock") || !strings.Contains(out, "stop it first") {
		t.Errorf("reset of a running daemon without a lock: %v\n%s", err, out)
	}
	if got := b.d.sh(b.sb[0].ID, "echo still"); got != "still\n" {
		t.Fatalf("b's sandbox after the refused reset says %q", got)
	}

	// a's sandboxes outlived its kill -9.
	if v := viewOf(t, a.d, a.data, a.br, a.cg, a.pids); len(v.procs) < len(a.sb) {
		t.Fatalf("a's sandboxes did not outlive the daemon:\n%s", v)
	}
	t0 := time.Now()
	out, err = resetCLI(t, a.d, "--yes", "--json", "-v")
	if err != nil {
		t.Fatalf("reset: %v\n%s", err, out)
	}
	t.Logf("den system reset of %d sandboxes (%s) after kill -9: %v", len(a.sb), strings.Join(tiers, ", "), time.Since(t0))
	var rep resetReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("reset --json: %v\n%s", err, out)
	}
	kinds := map[string]int{}
	for _, it := range rep.Removed {
		kinds[it.Kind]++
	}
	if kinds["sandbox"] != len(a.sb) || kinds["cgroup"] == 0 || kinds["network"] < 2 || kinds["run_dir"] != 1 || kinds["mount"] == 0 {
		t.Errorf("reset reports %v, want %d sandboxes, cgroups, the bridge and table, mounts and the run directory:\n%s", kinds, len(a.sb), out)
	}
	if v := viewOf(t, a.d, a.data, a.br, a.cg, a.pids, va.links...); !v.empty() {
		t.Errorf("after reset, the host still has daemon a's:\n%s", v)
	}
	if _, err := os.Stat(a.d.run); !os.IsNotExist(err) {
		t.Errorf("a's run directory %s is still there (%v)", a.d.run, err)
	}
	for _, keep := range []string{"den.db", "token", "images"} {
		if _, err := os.Stat(filepath.Join(a.data, keep)); err != nil {
			t.Errorf("reset (no --purge) removed data: %v", err)
		}
	}
	// b is whole and working.
	if v := viewOf(t, b.d, b.data, b.br, b.cg, b.pids); len(v.links) == 0 || len(v.tables) == 0 || len(v.cgroups) != len(vb.cgroups) || len(v.procs) != len(vb.procs) || len(v.mounts) != len(vb.mounts) {
		t.Errorf("resetting a changed b:\nbefore\n%s\nafter\n%s", vb, v)
	}
	if got := b.d.sh(b.sb[0].ID, "echo alive"); got != "alive\n" {
		t.Errorf("b's sandbox after a's reset says %q", got)
	}

	// Idempotent.
	out, err = resetCLI(t, a.d, "--yes")
	if err != nil || !strings.Contains(out, "nothing to reset") {
		t.Errorf("second reset: %v\n%s", err, out)
	}
	// Without --yes and a terminal to ask on, nothing is done; a
	// directory that is not den's is refused (everything mounted under
	// it would be unmounted).
	if out, err := resetCLI(t, a.d); err == nil || !strings.Contains(out, "pass --yes") {
		t.Errorf("reset without --yes: %v\n%s", err, out)
	}
	other := &daemon{data: t.TempDir()}
	if out, err := resetCLI(t, other, "--yes"); err == nil || !strings.Contains(out, "is not a den data directory") {
		t.Errorf("reset of a directory that is not den's: %v\n%s", err, out)
	}

	// b after a crash: the next daemon on its data directory has the
	// same cgroup parent, so it finds its box's groups again (memory and
	// pids are read from them).
	b.d.kill9()
	os.Remove(filepath.Join(b.d.run, "den.sock"))
	b.d.start()
	if got := boxCgroup(t, b.sb[0].Pid); got != "/"+b.cg+"/"+b.sb[0].ID {
		t.Errorf("b's box after b's restart: cgroup %s", got)
	}
	if st, err := b.d.c.Stats(ctx, b.sb[0].ID); err != nil || st.Pids == 0 || st.Memory == 0 {
		t.Errorf("b's box after b's restart: stats %+v, %v: its groups were not found", st, err)
	}
	if got := b.d.sh(b.sb[0].ID, "echo again"); got != "again\n" {
		t.Errorf("b's sandbox after b's restart says %q", got)
	}

	// The next daemon on a's data finds its sandboxes stopped, with
	// their files, and starts them.
	a.d.start()
	for _, sb := range a.sb {
		got, err := a.d.c.Get(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != api.StateStopped {
			t.Errorf("after reset, %s (%s) is %s, want stopped", sb.ID, sb.Runtime, got.State)
		}
	}
	if _, err := a.d.c.Start(ctx, a.sb[0].ID); err != nil {
		t.Fatalf("start after reset: %v\n%s", err, a.d.logText())
	}
	if got := a.d.sh(a.sb[0].ID, "echo back"); got != "back\n" {
		t.Errorf("restarted sandbox says %q", got)
	}
}

// TestSystemResetOnlyDens checks what reset refuses to touch when told by
// flags rather than by the daemon's record: a run directory that is not
// den's (everything under it would be unmounted and removed), and a
// bridge without den's nftables table; while a bridge with it (the
// control) is removed with its table.
func TestSystemResetOnlyDens(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("den system reset needs root")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	d := &daemon{data: t.TempDir()}
	os.WriteFile(filepath.Join(d.data, "token"), []byte("x\n"), 0o600) // den serve's first file
	notDens := t.TempDir()
	os.WriteFile(filepath.Join(notDens, "precious"), []byte("x"), 0o600)
	out, err := resetCLI(t, d, "--yes", "--run", notDens)
	if err == nil || !strings.Contains(out, "is not a den run directory") {
		t.Errorf("reset with --run of a directory that is not den's: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(notDens, "precious")); err != nil {
		t.Fatalf("reset touched a run directory that is not den's: %v", err)
	}
	run := filepath.Join(t.TempDir(), "run")
	n := os.Getpid() % 100000
	for _, tc := range []struct {
		br   string
		dens bool
	}{{fmt.Sprintf("drn%d", n), false}, {fmt.Sprintf("drd%d", n), true}} {
		if out, err := exec.Command("ip", "link", "add", tc.br, "type", "bridge").CombinedOutput(); err != nil {
			t.Fatalf("ip link add: %v: %s", err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "link", "del", tc.br).Run() })
		if tc.dens {
			if out, err := exec.Command("nft", "add", "table", "inet", tableOf(tc.br)).CombinedOutput(); err != nil {
				t.Fatalf("nft add table: %v: %s", err, out)
			}
			t.Cleanup(func() { exec.Command("nft", "delete", "table", "inet", tableOf(tc.br)).Run() })
		}
		out, err := resetCLI(t, d, "--yes", "--run", run, "--bridge", tc.br)
		_, linkErr := exec.Command("ip", "link", "show", tc.br).CombinedOutput()
		if tc.dens {
			if err != nil || linkErr == nil || !strings.Contains(out, "bridge "+tc.br) || !strings.Contains(out, "nftables table inet "+tableOf(tc.br)) {
				t.Errorf("reset --bridge %s (den's table there): %v, link still there: %v\n%s", tc.br, err, linkErr == nil, out)
			}
		} else if err == nil || linkErr != nil || !strings.Contains(out, "so it is not den's: not removing it") {
			t.Errorf("reset --bridge %s (no den table): %v, link removed: %v\n%s", tc.br, err, linkErr != nil, out)
		}
	}
}
