// Package bench is den's benchmark harness. Its one job: measure den and
// its peers (bwrap, runsc, the host's fork/exec, OpenSSH, a plain proxy)
// side by side in one run, interleaved after an untimed warm-up of each,
// and report p50, p99, mean, the ratio to the peer and the verdict of each
// target.
//
// Run measures a running daemon through the SDK client and this den binary
// as a subprocess, both given in Options; it returns a Report, which
// WriteJSON prints as the `den bench --json` document. `den bench` (in
// cmd/den) is the command line over it: flags, help and the table.
// Results are recorded by hand in docs/benchmarks.md, each with the
// command, the commit, the machine and the load it ran under.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/storage"
)

// Defaults of Options.
const (
	DefaultColdN    = 200 // iterations of cold
	DefaultExecN    = 500 // iterations of exec
	DefaultRunscN   = 100 // iterations of runsc
	DefaultParallel = 20  // launches at once in cold-parallel
	DefaultRounds   = 5   // batches of cold-parallel
	DefaultCount    = 200 // sandboxes created by density
)

// Targets and the defaults of the other cases.
const (
	settle      = 3 * time.Second
	coldRatio   = 3.0 // den p50 <= 3x bwrap p50
	execLimitMs = 3.0 // exec p50 <= 3ms
	densityMiB  = 4.0 // <= 4MiB per idle sandbox
	label       = "den-bench"
	reattachN   = 500
	reattachMs  = 5.0 // reattach to a running process's output: p50 <= 5ms
	procBoxes   = 50  // procs: sandboxes
	procsEach   = 20  // procs: background processes per sandbox
	procsRSSMiB = 256 // procs: the daemon's RSS stays under this
	imageN      = 50  // image-size: creates from each image
	imageRatio  = 1.2 // create from a 1 GiB image <= 1.2x from the small one
	rebuildN    = 10
	rebuildS    = 1.0 // a rebuild with nothing changed <= 1 s
)

// Options is what one run measures and how.
type Options struct {
	// Client is the SDK client of the daemon measured. Required.
	Client *client.Client
	// Den starts this den binary as a CLI of the same daemon: its path and
	// global flags ({"/usr/bin/den", "--host", "unix:///run/den/den.sock"});
	// the cases append a verb (run, exec, mcp). Required.
	Den []string
	// Version is the den client's version, recorded in the report.
	Version string
	// Cases are the names of the cases to run (see Cases); none: all.
	Cases []string
	// Iterations overrides each case's iteration count; 0 keeps them.
	Iterations int
	// Parallel, Rounds and Count size cold-parallel and density; 0 for
	// DefaultParallel, DefaultRounds and DefaultCount.
	Parallel, Rounds, Count int
	// SSHAddr is the SSH gateway (host:port) the ssh case logs in through;
	// "" skips that case.
	SSHAddr string
	// Command is the command line recorded in the report.
	Command []string
	// Progress gets progress lines and the reason of each skipped or failed
	// case as the run goes; nil discards them. With Terminal, progress is
	// one line redrawn in place.
	Progress io.Writer
	Terminal bool
	// Started, when set, is called once the daemon has answered and the
	// peers are known, before the first case runs (den bench prints its
	// header there). Cases may add peers later (sshd, runsc for gvisor).
	Started func(*Report)
}

// Case is one scenario of the harness.
type Case struct {
	// Name selects it in Options.Cases and on den bench's command line.
	Name string
	// About says what it measures, against which peer, and its target,
	// as lines of at most 61 columns (den bench -h indents them).
	About string
	run   func(*runner, context.Context) error
}

// cases are the harness's scenarios in the order a run takes them.
var cases = []Case{
	{"cold", `den run --rm -- true (this den binary, as a subprocess) vs
bwrap; -n iterations (200). Target: den p50 <= 3x bwrap p50.`, (*runner).cold},
	{"cold-parallel", `--parallel launches at once of each, --rounds times:
latency of each launch and wall time of each batch.`, (*runner).coldParallel},
	{"exec", `exec of true in one running sandbox through the SDK (JSON
and stream forms) vs fork/exec of /bin/true on the host;
-n iterations (500). Target: p50 <= 3ms.`, (*runner).exec},
	{"reattach", `den logs --tail 100 of a running background process (the
replay of its output through the API) vs an SDK exec of
true; -n (500). Target: p50 <= 5ms.`, (*runner).reattach},
	{"procs", `1,000 background processes in 50 sandboxes, started
through the SDK; the daemon's RSS before, with all running
and after listing them. Targets: all run; RSS <= 256MiB.`, (*runner).procs},
	{"image-size", `create + exec of true from an image with a 1 GiB layer
vs one with an empty layer, interleaved; -n (50).
Target: 1 GiB p50 <= 1.2x small.`, (*runner).imageSize},
	{"rebuild", `a 7-step Dockerfile built once, rebuilt unchanged -n
times (10), then with its last instruction changed.
Targets: rebuild p50 <= 1s, all steps cached; then only
the last step runs.`, (*runner).rebuild},
	{"egress", `connect+request and 1 GiB downloads through den's
transparent proxy vs the same client on the host (a
network namespace at 198.51.100.10 stands in for the
internet: root and den serve --net); -n (200); then 20
sandboxes hold 50 connections each. Targets: adds <= 1ms
at p50; >= 80% of direct throughput; all 1,000 open.`, (*runner).egress},
	{"snapshot", `snapshot and fork of a sandbox holding 1 GiB vs an empty
one, -n rounds (10), and 10 forks in one call; peer: cp -a
of the same 1 GiB. Targets: p50 <= 300ms; 1 GiB snapshot
<= 2x empty; 10 forks <= 1s.`, (*runner).snapshot},
	{"pause", `pause and resume of a sandbox running a busy loop; -n
(20). Target: p50 <= 20ms each.`, (*runner).pause},
	{"density", `--count idle sandboxes (200): drop of MemAvailable and
RssAnon of their init processes, per sandbox; every one
must answer an exec. Target: <= 4MiB per sandbox.`, (*runner).density},
	{"runsc", `den run --rm -- true vs gVisor's runsc (ptrace platform,
busybox root); -n iterations (100). For information.`, (*runner).runscScenario},
	{"gvisor", `create + exec of true in a gvisor sandbox of a busybox image
vs a raw runsc run of the same root (same platform), -n (20);
then hibernate + resume of an idle one (checkpoint +
restore), 10 times. Targets: <= 1.2x runsc; <= 500ms.`, (*runner).gvisorScenario},
	{"ssh", `ssh ID@host true through den's SSH gateway ($DEN_SSH_HOST,
$DEN_SSH_PORT: 127.0.0.1:2222), key exchange included, vs
OpenSSH's sshd on loopback; -n (100). Target: p50 <= 100ms.`, (*runner).sshScenario},
	{"mcp", `exec of true through MCP: over stdio (this den binary as
den mcp) and the daemon's /mcp (streamable HTTP, with a
unix socket host), vs the same exec through the HTTP API;
-n (500). Target: stdio p50 <= 5ms.`, (*runner).mcpScenario},
}

// Cases returns the harness's cases in the order a run takes them.
func Cases() []Case {
	return append([]Case(nil), cases...)
}

// Select checks case names (none, or "all": every case) and returns them
// in the order a run takes them, without duplicates.
func Select(names []string) ([]string, error) {
	var all []string
	for _, c := range cases {
		all = append(all, c.Name)
	}
	if len(names) == 0 {
		return all, nil
	}
	want := map[string]bool{}
	for _, n := range names {
		n = strings.ToLower(n)
		if n == "all" {
			return all, nil
		}
		known := false
		for _, s := range all {
			known = known || s == n
		}
		if !known {
			return nil, api.Errorf(api.KindInvalid, "unknown scenario %q (want %s)", n, strings.Join(all, ", "))
		}
		want[n] = true
	}
	var out []string
	for _, s := range all {
		if want[s] {
			out = append(out, s)
		}
	}
	return out, nil
}

// bwrapArgv is the bwrap peer: the namespace floor.
var bwrapArgv = []string{"bwrap", "--unshare-all", "--die-with-parent",
	"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
	"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/true"}

// Report is the result of one run (den bench --json prints it).
type Report struct {
	Date     string   `json:"date"`
	Command  []string `json:"command"`
	Machine  Machine  `json:"machine"`
	Den      DenInfo  `json:"den"`
	Peers    []*Peer  `json:"peers"`
	Config   Settings `json:"config"`
	Results  []*Row   `json:"results"`
	Skipped  []Note   `json:"skipped,omitempty"`
	Errors   []Note   `json:"errors,omitempty"`
	Passed   int      `json:"passed"`
	Failed   int      `json:"failed"`
	Duration float64  `json:"duration_s"`
}

// Machine describes the host the run measured on.
type Machine struct {
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpu_model"`
	Kernel   string `json:"kernel"` // uname -srvm
	MemTotal int64  `json:"mem_total_bytes"`
	// LoadStart and LoadEnd are /proc/loadavg's 1, 5 and 15 minute load
	// averages when the run began and ended: other work on the machine
	// skews the numbers.
	LoadStart string `json:"loadavg_start,omitempty"`
	LoadEnd   string `json:"loadavg_end,omitempty"`
}

// DenInfo is the den measured: client, daemon and where it listens.
type DenInfo struct {
	Client   string   `json:"client"`
	Daemon   string   `json:"daemon"`
	Runtimes []string `json:"runtimes,omitempty"`
	Cgroup   string   `json:"cgroup,omitempty"`
	Host     string   `json:"host"`
}

// Settings are the counts the run used.
type Settings struct {
	Iterations map[string]int `json:"iterations"`
	Parallel   int            `json:"parallel"`
	Rounds     int            `json:"rounds"`
	Count      int            `json:"count"`
	SettleS    float64        `json:"settle_s"`
}

// Peer is one thing den is measured against, or den itself.
type Peer struct {
	Name    string `json:"name"`
	Command string `json:"command"`
	Version string `json:"version,omitempty"`
	Note    string `json:"note,omitempty"`
	Missing string `json:"missing,omitempty"` // why it is not measured
	argv    []string
}

// Note is why a case was skipped or could not be measured.
type Note struct {
	Scenario string `json:"scenario"`
	Reason   string `json:"reason"`
}

// Row is one line of the results table. Values are in Unit ("ms", "MiB",
// "MiB/s", "count"); a nil value does not apply to the row.
type Row struct {
	Scenario string   `json:"scenario"`
	Subject  string   `json:"subject"`
	N        int      `json:"n"`
	Unit     string   `json:"unit"`
	P50      *float64 `json:"p50,omitempty"`
	P99      *float64 `json:"p99,omitempty"`
	Mean     *float64 `json:"mean,omitempty"`
	Ratio    *float64 `json:"ratio,omitempty"`
	RatioOf  string   `json:"ratio_of,omitempty"` // the denominator: "bwrap p50"
	Target   string   `json:"target,omitempty"`
	Verdict  string   `json:"verdict,omitempty"` // PASS, FAIL, n/a; "" without a target
	Note     string   `json:"note,omitempty"`
}

// WriteJSON writes the report as one indented JSON document, values
// rounded to four decimals. The report itself is not changed.
func (rep *Report) WriteJSON(w io.Writer) error {
	round := func(p *float64) *float64 {
		if p == nil {
			return nil
		}
		v := math.Round(*p*1e4) / 1e4
		return &v
	}
	out := *rep
	out.Results = make([]*Row, len(rep.Results))
	for i, r := range rep.Results {
		c := *r
		c.P50, c.P99, c.Mean, c.Ratio = round(r.P50), round(r.P99), round(r.Mean), round(r.Ratio)
		out.Results[i] = &c
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(&out)
}

// runner is one run.
type runner struct {
	o     Options
	cl    *client.Client
	errw  io.Writer // Options.Progress
	runID string
	rep   Report
	tmp   string // temporary directory (runsc bundle and state)

	den, bwrap, runsc, hostExec *Peer
	runscSeq                    int
	progressShown               bool
}

// Run measures the cases of o and returns the report. A case that could
// not be measured is in the report's Errors, not an error of Run; Run
// fails on bad Options, when the daemon does not answer, and when ctx
// ends (with what was measured so far).
func Run(ctx context.Context, o Options) (*Report, error) {
	names, err := Select(o.Cases)
	if err != nil {
		return nil, err
	}
	switch {
	case o.Client == nil:
		return nil, api.Errorf(api.KindInvalid, "bench: no client of the daemon to measure")
	case len(o.Den) == 0:
		return nil, api.Errorf(api.KindInvalid, "bench: no den binary to run as a subprocess")
	case o.Iterations < 0 || o.Parallel < 0 || o.Rounds < 0 || o.Count < 0:
		return nil, api.Errorf(api.KindInvalid, "bench: iterations, parallel, rounds and count must not be negative")
	}
	for _, d := range []struct {
		p   *int
		def int
	}{{&o.Parallel, DefaultParallel}, {&o.Rounds, DefaultRounds}, {&o.Count, DefaultCount}} {
		if *d.p == 0 {
			*d.p = d.def
		}
	}
	b := &runner{o: o, cl: o.Client, errw: o.Progress,
		runID: fmt.Sprintf("%d-%d", os.Getpid(), time.Now().Unix())}
	if b.errw == nil {
		b.errw = io.Discard
	}
	err = b.run(ctx, names)
	return &b.rep, err
}

func (b *runner) iterations(def int) int {
	if b.o.Iterations > 0 {
		return b.o.Iterations
	}
	return def
}

func (b *runner) run(ctx context.Context, names []string) error {
	start := time.Now()
	b.rep.Date = start.UTC().Format(time.RFC3339)
	b.rep.Command = b.o.Command
	vi, err := b.cl.Version(ctx)
	if err != nil {
		return fmt.Errorf("den bench measures a running daemon: %w", err)
	}
	b.rep.Den = DenInfo{Client: b.o.Version, Daemon: vi.Version, Runtimes: vi.Runtimes, Cgroup: vi.Cgroup, Host: b.cl.Addr()}
	b.rep.Machine = machineInfo()
	b.rep.Config = Settings{Iterations: map[string]int{"cold": b.iterations(DefaultColdN), "exec": b.iterations(DefaultExecN), "runsc": b.iterations(DefaultRunscN)},
		Parallel: b.o.Parallel, Rounds: b.o.Rounds, Count: b.o.Count, SettleS: settle.Seconds()}
	defer b.cleanup()
	b.setupPeers(names)
	if b.o.Started != nil {
		b.o.Started(&b.rep)
	}
	for _, c := range cases {
		if !slices.Contains(names, c.Name) {
			continue
		}
		s := c.Name
		if reason := b.skipReason(s); reason != "" {
			b.rep.Skipped = append(b.rep.Skipped, Note{s, reason})
			fmt.Fprintf(b.errw, "den bench: skipping %s: %s\n", s, reason)
			continue
		}
		err := c.run(b, ctx)
		b.progressDone()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			b.rep.Errors = append(b.rep.Errors, Note{s, err.Error()})
			fmt.Fprintf(b.errw, "den bench: %s: %v\n", s, err)
		}
	}
	for _, r := range b.rep.Results {
		switch r.Verdict {
		case "PASS":
			b.rep.Passed++
		case "FAIL":
			b.rep.Failed++
		}
	}
	b.rep.Duration = math.Round(time.Since(start).Seconds()*10) / 10
	b.rep.Machine.LoadEnd = loadavg()
	return nil
}

// Machine and peers.

func machineInfo() Machine {
	m := Machine{CPUs: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.CPUModel = parseCPUModel(string(b))
	}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		m.Kernel = strings.Join([]string{cString(u.Sysname[:]), cString(u.Release[:]), cString(u.Version[:]), cString(u.Machine[:])}, " ")
	}
	m.MemTotal, _ = meminfo("MemTotal")
	m.LoadStart = loadavg()
	return m
}

// loadavg returns the three load averages of /proc/loadavg.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func cString[T int8 | uint8](a []T) string {
	b := make([]byte, 0, len(a))
	for _, c := range a {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// programVersion returns the first line of what a program prints for args.
func programVersion(path string, args ...string) string {
	out, _ := exec.Command(path, args...).CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(line)
}

func (b *runner) setupPeers(scenarios []string) {
	denArgv := b.denCommand("run", "--rm", "--", "true")
	b.den = &Peer{Name: "den", Command: Quote(denArgv), Version: b.o.Version, argv: denArgv,
		Note: "this den binary as a subprocess, end to end: create, exec, remove"}
	b.rep.Peers = append(b.rep.Peers, b.den)

	b.bwrap = &Peer{Name: "bwrap", Command: Quote(bwrapArgv), argv: bwrapArgv}
	if p, err := exec.LookPath("bwrap"); err != nil {
		b.bwrap.Missing = "bwrap not found in PATH (apt-get install bubblewrap)"
	} else {
		b.bwrap.Version = programVersion(p, "--version")
	}
	b.rep.Peers = append(b.rep.Peers, b.bwrap)

	b.hostExec = &Peer{Name: "host exec", Command: "fork/exec of /bin/true from den bench (Go os/exec)"}
	b.rep.Peers = append(b.rep.Peers, b.hostExec)

	if !slices.Contains(scenarios, "runsc") {
		return
	}
	b.runsc = &Peer{Name: "runsc"}
	b.rep.Peers = append(b.rep.Peers, b.runsc)
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		b.runsc.Missing = "runsc not found in PATH (apt-get install runsc)"
		b.runsc.Command = "runsc --platform=ptrace --network=none run ID"
		return
	}
	b.runsc.Version = programVersion(runsc, "--version")
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		b.runsc.Missing = "busybox not found in PATH, needed for the runsc root file system (apt-get install busybox-static)"
		b.runsc.Command = "runsc --platform=ptrace --network=none run ID"
		return
	}
	if err := b.makeBundle(runsc, busybox); err != nil {
		b.runsc.Missing = "cannot prepare the runsc bundle: " + err.Error()
		b.runsc.Command = "runsc --platform=ptrace --network=none run ID"
	}
}

// makeBundle prepares an OCI bundle whose root holds only busybox, and the
// runsc command line that runs it.
func (b *runner) makeBundle(runsc, busybox string) error {
	if b.tmp != "" {
		removeTemp(b.tmp)
	}
	tmp, err := os.MkdirTemp("", "den-bench-")
	if err != nil {
		return err
	}
	b.tmp = tmp
	bundle, state := filepath.Join(tmp, "bundle"), filepath.Join(tmp, "state")
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs", "bin"), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		return err
	}
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bundle, "rootfs", "bin", "busybox"), bin, 0o755); err != nil {
		return err
	}
	spec := exec.Command(runsc, "spec", "--", "/bin/busybox", "true")
	spec.Dir = bundle
	if out, err := spec.CombinedOutput(); err != nil {
		return fmt.Errorf("runsc spec: %v: %s", err, strings.TrimSpace(string(out)))
	}
	cfgPath := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return err
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("runsc spec wrote a bad config.json: %v", err)
	}
	proc, ok := cfg["process"].(map[string]any)
	if !ok {
		return errors.New("config.json has no process section")
	}
	proc["terminal"] = false
	if raw, err = json.MarshalIndent(cfg, "", "\t"); err != nil {
		return err
	}
	if err := os.WriteFile(cfgPath, raw, 0o644); err != nil {
		return err
	}
	b.runsc.argv = []string{runsc, "--root", state, "--platform=ptrace", "--network=none", "run", "--bundle", bundle}
	b.runsc.Command = Quote(b.runsc.argv) + " den-bench-N"
	b.runsc.Note = fmt.Sprintf("bundle: rootfs/bin/busybox copied from %s (%s); config.json from `runsc spec -- /bin/busybox true` with process.terminal=false",
		busybox, programVersion(busybox))
	return nil
}

func (b *runner) skipReason(s string) string {
	switch s {
	case "runsc":
		if b.runsc == nil {
			return "not selected"
		}
		return b.runsc.Missing
	case "ssh":
		return b.sshSkipReason()
	}
	// Without bwrap, den alone is still measured and the rows say why.
	return ""
}

func (b *runner) cleanup() {
	b.sweep()
	if b.tmp != "" {
		removeTemp(b.tmp)
	}
}

// removeTemp removes a temporary directory of the run, with nothing
// mounted under it left behind (runsc --network=none bind-mounts its null
// network namespace in its state directory and leaves it there).
func removeTemp(dir string) {
	for _, m := range storage.MountsUnder(dir) {
		unix.Unmount(m, unix.MNT_DETACH)
	}
	os.RemoveAll(dir)
}

// sweep removes the sandboxes this run created through the SDK and left
// behind (an error or Ctrl-C in the middle of a scenario).
func (b *runner) sweep() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	list, err := b.cl.List(ctx, map[string]string{label: b.runID})
	if err != nil {
		return
	}
	for _, sb := range list {
		if err := b.cl.Remove(ctx, sb.ID, true); err != nil {
			fmt.Fprintf(b.errw, "den bench: remove sandbox %s: %v\n", shortID(sb.ID), err)
		}
	}
}

// Progress on stderr: redrawn on a terminal, a line every tenth otherwise.

func (b *runner) progress(what string, i, n int) {
	if b.o.Terminal {
		fmt.Fprintf(b.errw, "\r\033[K%s %d/%d", what, i, n)
		b.progressShown = true
		return
	}
	step := n / 10
	if step < 1 {
		step = 1
	}
	if i == n || i%step == 0 {
		fmt.Fprintf(b.errw, "%s %d/%d\n", what, i, n)
	}
}

func (b *runner) progressDone() {
	if b.o.Terminal && b.progressShown {
		fmt.Fprint(b.errw, "\r\033[K")
		b.progressShown = false
	}
}

// Measuring.

// timeExec runs argv (in dir) once and returns its wall time from start to
// exit. Its stdout goes to /dev/null, its stderr to a file read on failure.
func timeExec(ctx context.Context, argv []string, dir string) (time.Duration, error) {
	errf, err := os.CreateTemp("", "den-bench-stderr-")
	if err != nil {
		return 0, err
	}
	defer os.Remove(errf.Name())
	defer errf.Close()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Stderr = errf
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	t0 := time.Now()
	err = cmd.Run()
	d := time.Since(t0)
	if err != nil {
		msg, _ := os.ReadFile(errf.Name())
		text := strings.TrimSpace(string(msg))
		if len(text) > 600 {
			text = "..." + text[len(text)-600:]
		}
		if text != "" {
			text = ": " + text
		}
		return d, fmt.Errorf("%s: %v%s", Quote(argv), err, text)
	}
	return d, nil
}

// denFailed explains a failed den subprocess.
func denFailed(err error) error {
	return fmt.Errorf("%w\n(is den serve running? `den ls` checks the daemon; try the command by hand)", err)
}

// step is one measured action of an interleaved loop; warm is set on
// the untimed warm-up round.
type step func(ctx context.Context, warm bool) error

// timed makes a step that appends the duration of f to *dst.
func timed(dst *[]time.Duration, f func(ctx context.Context) (time.Duration, error)) step {
	return func(ctx context.Context, warm bool) error {
		d, err := f(ctx)
		if err != nil {
			return err
		}
		if !warm {
			*dst = append(*dst, d)
		}
		return nil
	}
}

// loop runs the steps in turn, n times, after one warm-up round.
func (b *runner) loop(ctx context.Context, what string, n int, steps ...step) error {
	for i := 0; i <= n; i++ {
		for _, s := range steps {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := s(ctx, i == 0); err != nil {
				return err
			}
		}
		if i > 0 {
			b.progress(what, i, n)
		}
	}
	return nil
}

func (b *runner) add(rows ...*Row) {
	b.rep.Results = append(b.rep.Results, rows...)
}

// denCommand is the command line of this den binary running the verb
// args against the daemon measured.
func (b *runner) denCommand(args ...string) []string {
	return append(slices.Clone(b.o.Den), args...)
}

// shortID is the 12-character form of an id, as den's tables show it.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func (b *runner) labels() map[string]string {
	return map[string]string{label: b.runID}
}
