package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/host"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/instance"
	"github.com/den-dev/den/internal/isolate/linux"
	"github.com/den-dev/den/internal/sandbox"
	"github.com/den-dev/den/internal/storage"
	"github.com/den-dev/den/internal/store"
)

var verbSystem = &verb{
	name:     "system",
	summary:  "manage den on this host: reset",
	synopsis: "COMMAND [flags]",
	example:  "den system reset --yes",
	run:      cmdSystem,
	group:    true,
}

func cmdSystem(c *cli, v *verb, args []string) error { return cmdGroup(c, v, args) }

var verbSystemReset = &verb{
	name:     "system reset",
	summary:  "remove everything a stopped (or crashed) daemon left on this host",
	synopsis: "[--data DIR] [--run DIR] [--bridge NAME] [--purge] [--yes] [--json]",
	details: `Works on this host directly (as root), not through a daemon, and only when
no daemon runs on the data directory: with one running it is refused, naming
its pid (stop it first). It stops every sandbox the data directory's state
records as running (they are recorded stopped: den start boots them again),
unmounts everything under the data and run directories, detaches the loop
devices backed by files in the data directory, deletes the daemon's bridge
and nftables table, removes its cgroup parent from every cgroup hierarchy
(killing anything left in it) and removes its run directory. The run
directory, bridge and cgroup parent are those the daemon recorded in
DATA/daemon.json at its start; --run and --bridge name them for a daemon of an
earlier release. The data itself (images, sandbox files, snapshots, volumes,
the state database) is kept; --purge removes the data directory too. Prints
each thing it removes; a second run prints "nothing to reset". Its main use
is after a kill -9 or crash of den serve, or before removing den.`,
	example: `den system reset --yes
		den system reset --data /srv/den-test --bridge dentest0 --yes --json
		den system reset --purge --yes   # and delete the data directory`,
	run: cmdSystemReset,
}

// resetItem is one thing den system reset removed.
type resetItem struct {
	Kind string `json:"kind"` // sandbox, mount, loop, network, cgroup, run_dir, data_dir
	What string `json:"what"`
}

// resetReport is den system reset --json.
type resetReport struct {
	Data    string      `json:"data"`
	Removed []resetItem `json:"removed"`
	Errors  []string    `json:"errors,omitempty"`
}

func cmdSystemReset(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	data := f.String("data", "", "DIR", "the daemon's data directory (default $DEN_DATA or "+instance.DefaultData+")")
	run := f.String("run", "", "DIR", "its run directory (default: the one it recorded; /run/den for "+instance.DefaultData+")")
	bridge := f.String("bridge", "", "NAME", "its bridge (default: the one it recorded; den0 for "+instance.DefaultData+")")
	purge := f.Bool("purge", "", "remove the data directory too (images, sandbox files, snapshots, volumes, state): den starts from nothing")
	verbose := f.Bool("verbose", "v", "log what the daemon's sandbox manager and tiers do while stopping the sandboxes (to stderr)")
	yes := f.Bool("yes", "y", "do not ask for confirmation (needed when stdin is not a terminal)")
	jsonOut := f.jsonFlag(`print {"data": DIR, "removed": [{"kind": ..., "what": ...}], "errors": [...]}`)
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef(v, "system reset takes no arguments (got %q)", pos[0])
	}
	if f.isSet("host") || c.host != "" {
		return usagef(v, "den system reset works on this host's files, not through a daemon: run it on the daemon's host, without --host")
	}
	if *data == "" {
		*data = envOr("DEN_DATA", instance.DefaultData)
	}
	if os.Geteuid() != 0 {
		return errors.New("den system reset needs root (it unmounts, and removes cgroups and network links): run it as root")
	}
	dir, err := instance.Canonical(*data)
	if err != nil {
		return err
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("no data directory %s: give the daemon's --data with --data DIR", dir)
	}
	// Everything mounted under the directory is unmounted: it must be
	// den's.
	if !isDataDir(dir) {
		return fmt.Errorf("%s is not a den data directory (it has no den.db, daemon.json or token): give the daemon's --data with --data DIR", dir)
	}
	if _, interactive := terminalFd(c.stdin); !*yes && !interactive {
		return usagef(v, "den system reset stops sandboxes and removes what the daemon made: pass --yes to go ahead")
	}
	lock, err := instance.Acquire(dir)
	if err != nil {
		var busy *instance.BusyError
		if errors.As(err, &busy) && busy.Pid > 0 {
			return fmt.Errorf("%w: a running daemon's sandboxes are not reset; stop it first (kill -TERM %d, or systemctl stop den), then run den system reset again", err, busy.Pid)
		}
		return fmt.Errorf("%w: stop it first, then run den system reset again", err)
	}
	defer lock.Release()
	t := resetTarget{data: dir, run: *run, bridge: *bridge, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if *verbose {
		t.log = slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	rec, recorded, err := instance.Read(dir)
	if err != nil {
		return err
	}
	t.fill(rec, recorded)
	if t.run != "" {
		if err := checkRunDir(t.run, t.run == rec.Run); err != nil {
			return err
		}
		// A daemon of an earlier release takes no lock: its socket says
		// whether it runs.
		sock := filepath.Join(t.run, "den.sock")
		if conn, err := net.Dial("unix", sock); err == nil {
			conn.Close()
			return fmt.Errorf("a daemon answers on %s (its run directory): stop it first, then run den system reset again", sock)
		}
	}
	if !*yes {
		fmt.Fprintf(c.stderr, "Reset den on %s: stop its sandboxes, remove its mounts, loop devices, bridge, nftables table, cgroups and run directory%s? [y/N] ", dir, map[bool]string{true: ", and DELETE the data directory", false: ""}[*purge])
		ans, _ := bufio.NewReader(c.stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(ans)); a != "y" && a != "yes" {
			return errors.New("not reset")
		}
	}
	rep := resetReport{Data: dir, Removed: []resetItem{}}
	note := func(kind, what string) {
		rep.Removed = append(rep.Removed, resetItem{kind, what})
		if !*jsonOut {
			fmt.Fprintf(c.stdout, "%-8s %s\n", kind, what)
		}
	}
	fail := func(err error) {
		if err == nil {
			return
		}
		for _, e := range strings.Split(err.Error(), "\n") {
			rep.Errors = append(rep.Errors, e)
			if !*jsonOut {
				fmt.Fprintf(c.stderr, "den: %s\n", e)
			}
		}
	}
	if t.run == "" {
		fail(fmt.Errorf("no run directory recorded in %s: pass the daemon's --run with --run DIR to remove it", filepath.Join(dir, "daemon.json")))
	}
	if t.bridge != "" && t.bridge != rec.Bridge && !host.HasTable(t.table) {
		// Named on the command line, not recorded: den's only if den's
		// table for it is there (never delete another program's bridge).
		fail(fmt.Errorf("bridge %s: no nftables table inet %s, so it is not den's: not removing it", t.bridge, t.table))
		t.bridge, t.table = "", ""
	}
	t.reset(note, fail)
	if *purge {
		lock.Release()
		if err := storage.RemoveTree(dir); err != nil {
			fail(fmt.Errorf("remove the data directory: %w", err))
		} else {
			note("data_dir", dir)
		}
	}
	if *jsonOut {
		if err := c.printJSON(rep); err != nil {
			return err
		}
	} else if len(rep.Removed) == 0 && len(rep.Errors) == 0 {
		fmt.Fprintf(c.stdout, "nothing to reset on %s\n", dir)
	}
	if len(rep.Errors) > 0 {
		return exitError(1)
	}
	return nil
}

// checkRunDir refuses a run directory that is not den's: everything
// mounted under it is unmounted and it is removed. The one the daemon
// recorded is; another must be missing, empty, or hold what den serve
// makes there.
func checkRunDir(run string, recorded bool) error {
	if run == "/" || !filepath.IsAbs(run) {
		return fmt.Errorf("run directory %q: not a den run directory", run)
	}
	if recorded {
		return nil
	}
	ents, err := os.ReadDir(run)
	if err != nil || len(ents) == 0 {
		return nil
	}
	for _, e := range ents {
		switch e.Name() {
		case "den.sock", "linux", "gvisor", "microvm":
			return nil
		}
	}
	return fmt.Errorf("%s is not a den run directory (no den.sock, linux, gvisor or microvm in it): give the daemon's --run with --run DIR", run)
}

// isDataDir says whether dir holds what den serve makes in its data
// directory.
func isDataDir(dir string) bool {
	for _, f := range []string{"den.db", "daemon.json", "token"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return true
		}
	}
	return false
}

// resetTarget is what den system reset removes: a daemon's data
// directory (canonical), run directory, bridge and table, cgroup parent.
type resetTarget struct {
	data, run, bridge, table, cgroup string
	rec                              instance.Record
	log                              *slog.Logger
}

// fill completes t from the daemon's record (flags given win), or from
// den serve's defaults for the default data directory.
func (t *resetTarget) fill(rec instance.Record, recorded bool) {
	t.rec = rec
	def := t.data == instance.DefaultData
	if t.run == "" {
		t.run = rec.Run
		if !recorded && def {
			t.run = "/run/den"
		}
	}
	if t.run != "" {
		if abs, err := filepath.Abs(t.run); err == nil {
			t.run = abs
		}
	}
	switch {
	case t.bridge != "":
		t.table = host.TableName(t.bridge)
	case recorded:
		t.bridge, t.table = rec.Bridge, rec.Table
	case def:
		t.bridge = "den0"
	}
	if t.table == "" && t.bridge != "" {
		t.table = host.TableName(t.bridge)
	}
	t.cgroup = rec.CgroupParent
	if t.cgroup == "" {
		t.cgroup = instance.CgroupParent(t.data)
	}
}

// reset removes what the daemon left, reporting each thing removed to
// note and each failure to fail, and going on after a failure.
func (t *resetTarget) reset(note func(kind, what string), fail func(error)) {
	fail(t.stopSandboxes(note))
	for _, d := range []string{t.run, t.data} {
		if d == "" {
			continue
		}
		gone, err := storage.UnmountUnder(d)
		for _, m := range gone {
			note("mount", m)
		}
		fail(err)
	}
	gone, err := storage.DetachLoops(t.data)
	for _, l := range gone {
		note("loop", l)
	}
	fail(err)
	if t.bridge != "" || t.table != "" {
		gone, err := host.RemoveNetwork(t.bridge, t.table)
		for _, n := range gone {
			note("network", n)
		}
		fail(err)
	}
	gone, err = host.RemoveParent("/sys/fs/cgroup", t.cgroup)
	for _, g := range gone {
		note("cgroup", g)
	}
	fail(err)
	if t.run != "" {
		if _, err := os.Lstat(t.run); err == nil {
			if err := storage.RemoveTree(t.run); err != nil {
				fail(fmt.Errorf("remove the run directory: %w", err))
			} else {
				note("run_dir", t.run)
			}
		}
	}
}

// stopSandboxes stops every sandbox the data directory's state records
// with processes (running, paused, being created), through the daemon's
// own sandbox manager and tiers (which reattach to them as a restarted
// daemon does, and sweep what a crash cut short), so that each is stopped
// as den stop would and recorded stopped.
func (t *resetTarget) stopSandboxes(note func(kind, what string)) error {
	dbPath := filepath.Join(t.data, "den.db")
	if _, err := os.Stat(dbPath); err != nil {
		return nil // no state: nothing recorded
	}
	ctx := context.Background()
	db, err := store.Open(dbPath)
	if err != nil {
		return fmt.Errorf("open state: %w", err)
	}
	defer db.Close()
	all, err := db.ListSandboxes(ctx, nil)
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	live := map[string]*store.Sandbox{}
	for _, s := range all {
		if isLive(s.State) {
			live[s.ID] = s
		}
	}
	if len(live) == 0 {
		return nil
	}
	if t.run == "" {
		return errors.New("sandboxes are recorded running, but the daemon's run directory is unknown: pass --run DIR")
	}
	mode := "dir"
	if _, err := os.Stat(filepath.Join(t.data, "storage.img")); err == nil {
		mode = "btrfs"
	}
	st, err := storage.Open(storage.Config{Dir: t.data, Mode: mode})
	if err != nil {
		return err
	}
	defer st.Close()
	images, err := image.NewStore(filepath.Join(t.data, "images"))
	if err != nil {
		return fmt.Errorf("open image store: %w", err)
	}
	rt, err := linux.New(linux.Config{RunDir: filepath.Join(t.run, "linux"), CgroupName: t.cgroup})
	if err != nil {
		return fmt.Errorf("linux runtime: %w", err)
	}
	enabled := t.rec.Runtimes
	if len(enabled) == 0 {
		enabled = []string{"linux", "gvisor", "microvm"}
	}
	tiers := setupTiers(t.log, rt, t.run, t.data, t.cgroup, nil, enabled, t.rec.Runsc, t.rec.Platform)
	m, err := sandbox.New(ctx, sandbox.Config{DataDir: t.data, Runtime: rt, Tiers: tiers.runtimes, Unavailable: tiers.unavailable,
		Store: db, Images: images, Log: t.log, Storage: st})
	if err != nil {
		return err
	}
	defer m.Close()
	list, err := m.List(ctx, nil)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range list {
		if s.State != api.StateRunning && s.State != api.StatePaused {
			continue
		}
		if _, err := m.Stop(ctx, s.ID); err != nil {
			errs = append(errs, fmt.Errorf("stop sandbox %s: %w", s.ID, err))
		}
	}
	// Each sandbox recorded live before and stopped now: stopped here,
	// or found gone and settled by the manager's start-up sweep.
	after, err := db.ListSandboxes(ctx, nil)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, s := range after {
		if was, ok := live[s.ID]; ok && !isLive(s.State) {
			what := s.ID + " (" + was.Runtime + ")"
			if s.Name != "" {
				what = s.ID + " " + s.Name + " (" + was.Runtime + ")"
			}
			note("sandbox", what)
		} else if ok && s.State != stateWarmRecord {
			errs = append(errs, fmt.Errorf("sandbox %s is still %s", s.ID, s.State))
		}
	}
	return errors.Join(errs...)
}

// stateWarmRecord is the state of a warm-pool sandbox's record (the
// manager removes it when it tears the box down).
const stateWarmRecord = "warm"

// isLive says whether a sandbox in state may have processes.
func isLive(state string) bool {
	switch state {
	case api.StateStopped, api.StateHibernated, api.StateFailed:
		return false
	}
	return true
}
