package main

import (
	"archive/tar"
	"bufio"
	"bytes"
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
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbBench = &verb{
	name:     "bench",
	summary:  "measure den side by side with its peers (bwrap, runsc)",
	synopsis: "[flags] [SCENARIO...]",
	details: `Runs den and its peers in one run, interleaved (den, peer, den, peer, ...),
after one untimed warm-up of each, and reports p50, p99, mean, the ratio to
the peer and the verdict of each target. Scenarios (default: all that this
host supports; a peer whose binary is missing is skipped with the reason):

  cold           den run --rm -- true (this den binary, as a subprocess) vs
                 bwrap; -n iterations (200). Target: den p50 <= 3x bwrap p50.
  cold-parallel  --parallel launches at once of each, --rounds times:
                 latency of each launch and wall time of each batch.
  exec           exec of true in one running sandbox through the SDK (JSON
                 and stream forms) vs fork/exec of /bin/true on the host;
                 -n iterations (500). Target: p50 <= 3ms.
  density        --count idle sandboxes (200): drop of MemAvailable and
                 RssAnon of their init processes, per sandbox; every one
                 must answer an exec. Target: <= 4MiB per sandbox.
  runsc          den run --rm -- true vs gVisor's runsc (ptrace platform,
                 busybox root); -n iterations (100). For information.
  gvisor         create + exec of true in a gvisor sandbox of a busybox image
                 vs a raw runsc run of the same root (same platform), -n (20);
                 then hibernate + resume of an idle one (checkpoint +
                 restore), 10 times. Targets: <= 1.2x runsc; <= 500ms.
  ssh            ssh ID@host true through den's SSH gateway ($DEN_SSH_HOST,
                 $DEN_SSH_PORT: 127.0.0.1:2222), key exchange included, vs
                 OpenSSH's sshd on loopback; -n (100). Target: p50 <= 100ms.
  mcp            exec of true through MCP: over stdio (this den binary as
                 den mcp) and the daemon's /mcp (streamable HTTP, with a
                 unix socket host), vs the same exec through the HTTP API;
                 -n (500). Target: stdio p50 <= 5ms.

The microVM's cold start against a raw QEMU boot of the same kernel and
initramfs is measured by go test -bench 'RawBoot|ColdStart'
./internal/isolate/microvm (see docs/benchmarks.md).

Progress goes to stderr. den bench exits 0 even when a target fails, unless
--strict; it exits 1 when a scenario could not be measured.`,
	example: `den bench
		den bench -n 50 cold exec
		den bench --json density --count 50`,
	run: cmdBench,
}

// Defaults and targets.
const (
	benchColdN       = 200
	benchExecN       = 500
	benchRunscN      = 100
	benchParallelN   = 20
	benchRoundsN     = 5
	benchCountN      = 200
	benchSettle      = 3 * time.Second
	benchColdRatio   = 3.0 // den p50 <= 3x bwrap p50
	benchExecLimitMs = 3.0 // exec p50 <= 3ms
	benchDensityMiB  = 4.0 // <= 4MiB per idle sandbox
	benchLabel       = "den-bench"
	benchReattachN   = 500
	benchReattachMs  = 5.0 // reattach to a running process's output: p50 <= 5ms
	benchProcBoxes   = 50  // procs: sandboxes
	benchProcsEach   = 20  // procs: background processes per sandbox
	benchProcsRSSMiB = 256 // procs: the daemon's RSS stays under this
	benchImageN      = 50  // image-size: creates from each image
	benchImageRatio  = 1.2 // create from a 1 GiB image <= 1.2x from the small one
	benchRebuildN    = 10
	benchRebuildS    = 1.0 // a rebuild with nothing changed <= 1 s
)

var benchScenarioNames = []string{"cold", "cold-parallel", "exec", "reattach", "procs", "image-size", "rebuild", "egress", "snapshot", "pause", "density", "runsc", "gvisor", "ssh", "mcp"}

// benchBwrapArgv is the bwrap peer: the namespace floor.
var benchBwrapArgv = []string{"bwrap", "--unshare-all", "--die-with-parent",
	"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
	"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/true"}

// benchConfig is what the command line asked for.
type benchConfig struct {
	iterations int // -n; 0 for each scenario's default
	parallel   int
	rounds     int
	count      int
	strict     bool
	host       string // --host, "" for the default
	self       string // this den binary
	argv       []string
}

// benchReport is the result of one den bench run (the --json document).
type benchReport struct {
	Date     string       `json:"date"`
	Command  []string     `json:"command"`
	Machine  benchMachine `json:"machine"`
	Den      benchDen     `json:"den"`
	Peers    []*benchPeer `json:"peers"`
	Config   benchParams  `json:"config"`
	Results  []*benchRow  `json:"results"`
	Skipped  []benchNote  `json:"skipped,omitempty"`
	Errors   []benchNote  `json:"errors,omitempty"`
	Passed   int          `json:"passed"`
	Failed   int          `json:"failed"`
	Duration float64      `json:"duration_s"`
}

type benchMachine struct {
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

type benchDen struct {
	Client   string   `json:"client"`
	Daemon   string   `json:"daemon"`
	Runtimes []string `json:"runtimes,omitempty"`
	Cgroup   string   `json:"cgroup,omitempty"`
	Host     string   `json:"host"`
}

type benchParams struct {
	Iterations map[string]int `json:"iterations"`
	Parallel   int            `json:"parallel"`
	Rounds     int            `json:"rounds"`
	Count      int            `json:"count"`
	SettleS    float64        `json:"settle_s"`
}

// benchPeer is one thing den is measured against, or den itself.
type benchPeer struct {
	Name    string `json:"name"`
	Command string `json:"command"`
	Version string `json:"version,omitempty"`
	Note    string `json:"note,omitempty"`
	Missing string `json:"missing,omitempty"` // why it is not measured
	argv    []string
	dir     string
}

type benchNote struct {
	Scenario string `json:"scenario"`
	Reason   string `json:"reason"`
}

// benchRow is one line of the results table. Values are in Unit ("ms" or
// "MiB"); a nil value does not apply to the row.
type benchRow struct {
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

// benchStats summarises samples.
type benchStats struct {
	N                        int
	P50, P99, Mean, Min, Max float64
}

// benchPercentile returns the p-th percentile (0..100) of sorted samples,
// interpolating linearly between the two nearest ranks (numpy's default),
// or NaN without samples.
func benchPercentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	h := float64(n-1) * p / 100
	lo := int(math.Floor(h))
	if lo+1 >= n {
		return sorted[n-1]
	}
	return sorted[lo] + (h-float64(lo))*(sorted[lo+1]-sorted[lo])
}

// benchSummarize returns the statistics of xs (which it does not modify).
func benchSummarize(xs []float64) benchStats {
	s := benchStats{N: len(xs)}
	if len(xs) == 0 {
		nan := math.NaN()
		s.P50, s.P99, s.Mean, s.Min, s.Max = nan, nan, nan, nan, nan
		return s
	}
	sorted := append([]float64(nil), xs...)
	sort.Float64s(sorted)
	sum := 0.0
	for _, x := range sorted {
		sum += x
	}
	s.P50 = benchPercentile(sorted, 50)
	s.P99 = benchPercentile(sorted, 99)
	s.Mean = sum / float64(len(sorted))
	s.Min, s.Max = sorted[0], sorted[len(sorted)-1]
	return s
}

// benchMs converts durations to milliseconds.
func benchMs(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}

// benchRatio returns a/b, or NaN when either is unknown or b is not
// positive.
func benchRatio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b <= 0 {
		return math.NaN()
	}
	return a / b
}

// benchVerdict judges a value against an upper limit: PASS when v <= limit,
// FAIL when above, n/a when v is unknown.
func benchVerdict(v, limit float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "n/a"
	case v <= limit:
		return "PASS"
	}
	return "FAIL"
}

func benchPtr(v float64) *float64 {
	if math.IsNaN(v) {
		return nil
	}
	return &v
}

// benchStatsRow makes a row of millisecond samples.
func benchStatsRow(scenario, subject string, samples []time.Duration) *benchRow {
	s := benchSummarize(benchMs(samples))
	return &benchRow{Scenario: scenario, Subject: subject, N: s.N, Unit: "ms",
		P50: benchPtr(s.P50), P99: benchPtr(s.P99), Mean: benchPtr(s.Mean)}
}

func (r *benchRow) p50() float64 {
	if r == nil || r.P50 == nil {
		return math.NaN()
	}
	return *r.P50
}

// compare sets the row's ratio of its p50 to the peer row's p50.
func (r *benchRow) compare(peer *benchRow, of string) float64 {
	ratio := benchRatio(r.p50(), peer.p50())
	r.Ratio, r.RatioOf = benchPtr(ratio), of
	return ratio
}

// judge sets the row's target and verdict for value v against limit.
func (r *benchRow) judge(target string, v, limit float64) {
	r.Target, r.Verdict = target, benchVerdict(v, limit)
}

// Parsing of /proc.

// parseMeminfo parses /proc/meminfo into bytes per field.
func parseMeminfo(r io.Reader) (map[string]int64, error) {
	m := map[string]int64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("meminfo: bad value for %s: %q", k, strings.TrimSpace(v))
		}
		if len(f) > 1 {
			switch strings.ToLower(f[1]) {
			case "kb":
				n *= 1024
			default:
				return nil, fmt.Errorf("meminfo: unknown unit %q for %s", f[1], k)
			}
		}
		m[strings.TrimSpace(k)] = n
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(m) == 0 {
		return nil, errors.New("meminfo: no fields")
	}
	return m, nil
}

// benchMeminfo returns one field of /proc/meminfo in bytes.
func benchMeminfo(field string) (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	m, err := parseMeminfo(f)
	if err != nil {
		return 0, err
	}
	v, ok := m[field]
	if !ok {
		return 0, fmt.Errorf("/proc/meminfo has no %s (kernel too old?)", field)
	}
	return v, nil
}

// parseStatusKB returns a "Name:   123 kB" field of /proc/PID/status (or
// smaps_rollup) in bytes.
func parseStatusKB(text, field string) (int64, error) {
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != field {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			break
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bad %s value %q", field, strings.TrimSpace(v))
		}
		if len(f) > 1 && strings.EqualFold(f[1], "kB") {
			n *= 1024
		}
		return n, nil
	}
	return 0, fmt.Errorf("no %s field", field)
}

// parseCPUModel returns the first "model name" of /proc/cpuinfo.
func parseCPUModel(cpuinfo string) string {
	for _, line := range strings.Split(cpuinfo, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// memCgroupFile returns the file holding the memory usage of the cgroup
// named in a /proc/PID/cgroup text: memory.usage_in_bytes of the v1 memory
// controller, else memory.current of the v2 hierarchy.
func memCgroupFile(procCgroup, root string) string {
	v2 := ""
	for _, line := range strings.Split(procCgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				return filepath.Join(root, "memory", parts[2], "memory.usage_in_bytes")
			}
		}
	}
	if v2 != "" && v2 != "/" {
		return filepath.Join(root, v2, "memory.current")
	}
	return ""
}

// benchQuote joins argv as a shell would need it written.
func benchQuote(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
		}) < 0 {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}

// benchSelect checks the scenario names (none: all of them) and returns
// them in the canonical order, without duplicates.
func benchSelect(v *verb, names []string) ([]string, error) {
	if len(names) == 0 {
		return append([]string(nil), benchScenarioNames...), nil
	}
	want := map[string]bool{}
	for _, n := range names {
		n = strings.ToLower(n)
		if n == "all" {
			return append([]string(nil), benchScenarioNames...), nil
		}
		known := false
		for _, s := range benchScenarioNames {
			known = known || s == n
		}
		if !known {
			return nil, usagef(v, "unknown scenario %q (want %s)", n, strings.Join(benchScenarioNames, ", "))
		}
		want[n] = true
	}
	var out []string
	for _, s := range benchScenarioNames {
		if want[s] {
			out = append(out, s)
		}
	}
	return out, nil
}

func cmdBench(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag("print the results as one JSON document (progress still goes to stderr)")
	iterations := f.Int("iterations", "n", "N", fmt.Sprintf("iterations of cold, exec and runsc (default %d, %d and %d)", benchColdN, benchExecN, benchRunscN))
	parallel := f.Int("parallel", "p", "P", fmt.Sprintf("launches at once in cold-parallel (default %d)", benchParallelN))
	rounds := f.Int("rounds", "", "R", fmt.Sprintf("batches of cold-parallel (default %d)", benchRoundsN))
	count := f.Int("count", "", "N", fmt.Sprintf("sandboxes created by density (default %d)", benchCountN))
	strict := f.Bool("strict", "", "exit 1 when a target fails")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	scenarios, err := benchSelect(v, pos)
	if err != nil {
		return err
	}
	cfg := benchConfig{iterations: *iterations, parallel: *parallel, rounds: *rounds, count: *count, strict: *strict, host: f.host}
	if cfg.host == "" {
		cfg.host = c.host
	}
	for _, d := range []struct {
		p    *int
		name string
		def  int
	}{{&cfg.parallel, "parallel", benchParallelN}, {&cfg.rounds, "rounds", benchRoundsN}, {&cfg.count, "count", benchCountN}} {
		if !f.isSet(d.name) {
			*d.p = d.def
		} else if *d.p < 1 {
			return usagef(v, "%s must be at least 1", spell(d.name))
		}
	}
	if cfg.self, err = os.Executable(); err != nil {
		return fmt.Errorf("find the den binary: %w", err)
	}
	cfg.argv = []string{"den"}
	if c.host != "" {
		cfg.argv = append(cfg.argv, "--host", c.host)
	}
	cfg.argv = append(append(cfg.argv, "bench"), args...)

	ctx, stop := signalContext()
	defer stop()
	b := &bench{cfg: cfg, cl: c.client(f), out: c.stdout, errw: c.stderr, tty: isTerminal(c.stderr), json: *jsonOut,
		runID: fmt.Sprintf("%d-%d", os.Getpid(), time.Now().Unix())}
	err = b.run(ctx, scenarios)
	if ctx.Err() != nil {
		fmt.Fprintln(c.stderr, "den: bench interrupted")
		return exitError(130)
	}
	return err
}

// bench is one run of den bench.
type bench struct {
	cfg   benchConfig
	cl    *client.Client
	out   io.Writer
	errw  io.Writer
	tty   bool
	json  bool
	runID string
	rep   benchReport
	tmp   string // temporary directory (runsc bundle and state)

	den, bwrap, runsc, hostExec *benchPeer
	runscSeq                    int
	progressShown               bool
}

func (b *bench) iterations(def int) int {
	if b.cfg.iterations > 0 {
		return b.cfg.iterations
	}
	return def
}

func (b *bench) run(ctx context.Context, scenarios []string) error {
	start := time.Now()
	b.rep.Date = start.UTC().Format(time.RFC3339)
	b.rep.Command = b.cfg.argv
	vi, err := b.cl.Version(ctx)
	if err != nil {
		return fmt.Errorf("den bench measures a running daemon: %w", err)
	}
	b.rep.Den = benchDen{Client: version, Daemon: vi.Version, Runtimes: vi.Runtimes, Cgroup: vi.Cgroup, Host: b.cl.Addr()}
	b.rep.Machine = benchMachineInfo()
	b.rep.Config = benchParams{Iterations: map[string]int{"cold": b.iterations(benchColdN), "exec": b.iterations(benchExecN), "runsc": b.iterations(benchRunscN)},
		Parallel: b.cfg.parallel, Rounds: b.cfg.rounds, Count: b.cfg.count, SettleS: benchSettle.Seconds()}
	defer b.cleanup()
	b.setupPeers(scenarios)
	if !b.json {
		b.printHeader()
	}
	for _, s := range scenarios {
		if reason := b.skipReason(s); reason != "" {
			b.rep.Skipped = append(b.rep.Skipped, benchNote{s, reason})
			fmt.Fprintf(b.errw, "den bench: skipping %s: %s\n", s, reason)
			continue
		}
		var err error
		switch s {
		case "cold":
			err = b.cold(ctx)
		case "cold-parallel":
			err = b.coldParallel(ctx)
		case "exec":
			err = b.exec(ctx)
		case "reattach":
			err = b.reattach(ctx)
		case "procs":
			err = b.procs(ctx)
		case "egress":
			err = b.egress(ctx)
		case "image-size":
			err = b.imageSize(ctx)
		case "rebuild":
			err = b.rebuild(ctx)
		case "snapshot":
			err = b.snapshot(ctx)
		case "pause":
			err = b.pause(ctx)
		case "density":
			err = b.density(ctx)
		case "runsc":
			err = b.runscScenario(ctx)
		case "gvisor":
			err = b.gvisorScenario(ctx)
		case "mcp":
			err = b.mcpScenario(ctx)
		case "ssh":
			err = b.sshScenario(ctx)
		}
		b.progressDone()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			b.rep.Errors = append(b.rep.Errors, benchNote{s, err.Error()})
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
	b.rep.Machine.LoadEnd = benchLoadavg()
	if b.json {
		if err := b.printJSON(); err != nil {
			return err
		}
	} else {
		b.printTable()
	}
	switch {
	case len(b.rep.Errors) > 0:
		return exitError(1)
	case b.cfg.strict && b.rep.Failed > 0:
		return exitError(1)
	}
	return nil
}

// Machine and peers.

func benchMachineInfo() benchMachine {
	m := benchMachine{CPUs: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.CPUModel = parseCPUModel(string(b))
	}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		m.Kernel = strings.Join([]string{benchCString(u.Sysname[:]), benchCString(u.Release[:]), benchCString(u.Version[:]), benchCString(u.Machine[:])}, " ")
	}
	m.MemTotal, _ = benchMeminfo("MemTotal")
	m.LoadStart = benchLoadavg()
	return m
}

// benchLoadavg returns the three load averages of /proc/loadavg.
func benchLoadavg() string {
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

func benchCString[T int8 | uint8](a []T) string {
	b := make([]byte, 0, len(a))
	for _, c := range a {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// benchVersion returns the first line of what a program prints for args.
func benchVersion(path string, args ...string) string {
	out, _ := exec.Command(path, args...).CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(line)
}

func (b *bench) setupPeers(scenarios []string) {
	denArgv := []string{b.cfg.self}
	if b.cfg.host != "" {
		denArgv = append(denArgv, "--host", b.cfg.host)
	}
	denArgv = append(denArgv, "run", "--rm", "--", "true")
	b.den = &benchPeer{Name: "den", Command: benchQuote(denArgv), Version: version, argv: denArgv,
		Note: "this den binary as a subprocess, end to end: create, exec, remove"}
	b.rep.Peers = append(b.rep.Peers, b.den)

	b.bwrap = &benchPeer{Name: "bwrap", Command: benchQuote(benchBwrapArgv), argv: benchBwrapArgv}
	if p, err := exec.LookPath("bwrap"); err != nil {
		b.bwrap.Missing = "bwrap not found in PATH (apt-get install bubblewrap)"
	} else {
		b.bwrap.Version = benchVersion(p, "--version")
	}
	b.rep.Peers = append(b.rep.Peers, b.bwrap)

	b.hostExec = &benchPeer{Name: "host exec", Command: "fork/exec of /bin/true from den bench (Go os/exec)"}
	b.rep.Peers = append(b.rep.Peers, b.hostExec)

	want := false
	for _, s := range scenarios {
		want = want || s == "runsc"
	}
	if !want {
		return
	}
	b.runsc = &benchPeer{Name: "runsc"}
	b.rep.Peers = append(b.rep.Peers, b.runsc)
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		b.runsc.Missing = "runsc not found in PATH (apt-get install runsc)"
		b.runsc.Command = "runsc --platform=ptrace --network=none run ID"
		return
	}
	b.runsc.Version = benchVersion(runsc, "--version")
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
func (b *bench) makeBundle(runsc, busybox string) error {
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
	b.runsc.Command = benchQuote(b.runsc.argv) + " den-bench-N"
	b.runsc.Note = fmt.Sprintf("bundle: rootfs/bin/busybox copied from %s (%s); config.json from `runsc spec -- /bin/busybox true` with process.terminal=false",
		busybox, benchVersion(busybox))
	return nil
}

func (b *bench) skipReason(s string) string {
	switch s {
	case "runsc":
		if b.runsc == nil {
			return "not selected"
		}
		return b.runsc.Missing
	case "ssh":
		return sshSkipReason()
	}
	// Without bwrap, den alone is still measured and the rows say why.
	return ""
}

func (b *bench) cleanup() {
	b.sweep()
	if b.tmp != "" {
		os.RemoveAll(b.tmp)
	}
}

// sweep removes the sandboxes this run created through the SDK and left
// behind (an error or Ctrl-C in the middle of a scenario).
func (b *bench) sweep() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	list, err := b.cl.List(ctx, map[string]string{benchLabel: b.runID})
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

func (b *bench) progress(what string, i, n int) {
	if b.tty {
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

func (b *bench) progressDone() {
	if b.tty && b.progressShown {
		fmt.Fprint(b.errw, "\r\033[K")
		b.progressShown = false
	}
}

// Measuring.

// benchExec runs argv (in dir) once and returns its wall time from start to
// exit. Its stdout goes to /dev/null, its stderr to a file read on failure.
func benchExec(ctx context.Context, argv []string, dir string) (time.Duration, error) {
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
		return d, fmt.Errorf("%s: %v%s", benchQuote(argv), err, text)
	}
	return d, nil
}

// benchDenFailed explains a failed den subprocess.
func benchDenFailed(err error) error {
	return fmt.Errorf("%w\n(is den serve running? `den ls` checks the daemon; try the command by hand)", err)
}

// benchStep is one measured action of an interleaved loop; warm is set on
// the untimed warm-up round.
type benchStep func(ctx context.Context, warm bool) error

// benchTimed makes a step that appends the duration of f to *dst.
func benchTimed(dst *[]time.Duration, f func(ctx context.Context) (time.Duration, error)) benchStep {
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
func (b *bench) loop(ctx context.Context, what string, n int, steps ...benchStep) error {
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

func (b *bench) add(rows ...*benchRow) {
	b.rep.Results = append(b.rep.Results, rows...)
}

func (b *bench) labels() map[string]string {
	return map[string]string{benchLabel: b.runID}
}

// cold: den run --rm -- true end to end vs bwrap, with the SDK calls that
// make up a den run timed in-process for comparison.
func (b *bench) cold(ctx context.Context) error {
	n := b.iterations(benchColdN)
	var den, bw, create, execd, remove, sdk []time.Duration
	steps := []benchStep{benchTimed(&den, func(ctx context.Context) (time.Duration, error) {
		d, err := benchExec(ctx, b.den.argv, "")
		if err != nil {
			return d, benchDenFailed(err)
		}
		return d, nil
	})}
	if b.bwrap.Missing == "" {
		steps = append(steps, benchTimed(&bw, func(ctx context.Context) (time.Duration, error) {
			return benchExec(ctx, b.bwrap.argv, "")
		}))
	}
	steps = append(steps, func(ctx context.Context, warm bool) error {
		ds, err := b.sdkCycle(ctx)
		if err != nil {
			return err
		}
		if !warm {
			create, execd, remove = append(create, ds[0]), append(execd, ds[1]), append(remove, ds[2])
			sdk = append(sdk, ds[0]+ds[1]+ds[2])
		}
		return nil
	})
	err := b.loop(ctx, "cold", n, steps...)
	if len(den) == 0 {
		return err
	}
	dr := benchStatsRow("cold", "den run --rm -- true", den)
	b.add(dr)
	if b.bwrap.Missing == "" {
		br := benchStatsRow("cold", "bwrap (peer)", bw)
		ratio := dr.compare(br, "bwrap p50")
		dr.judge(fmt.Sprintf("p50 ≤ %g× bwrap", benchColdRatio), ratio, benchColdRatio)
		b.add(br)
	} else {
		dr.Target, dr.Verdict, dr.Note = fmt.Sprintf("p50 ≤ %g× bwrap", benchColdRatio), "n/a", b.bwrap.Missing
	}
	first := benchStatsRow("cold", "  SDK create", create)
	first.Note = "the SDK rows are timed in-process in the same loop, to show where den run's time goes"
	b.add(first,
		benchStatsRow("cold", "  SDK exec true (stream)", execd),
		benchStatsRow("cold", "  SDK remove", remove),
		benchStatsRow("cold", "  SDK create+exec+remove", sdk))
	return err
}

// sdkCycle creates a sandbox, runs true in it and removes it, like den
// run --rm, timing each call.
func (b *bench) sdkCycle(ctx context.Context) ([3]time.Duration, error) {
	var ds [3]time.Duration
	t0 := time.Now()
	sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
	ds[0] = time.Since(t0)
	if err != nil {
		return ds, fmt.Errorf("create a sandbox: %w", err)
	}
	t1 := time.Now()
	st, err := b.cl.ExecStream(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}, nil, nil)
	ds[1] = time.Since(t1)
	if err == nil && (st.Reason != api.ReasonExited || st.ExitCode != 0) {
		err = fmt.Errorf("true ended %s %d %s", st.Reason, st.ExitCode, st.Error)
	}
	t2 := time.Now()
	rerr := b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
	ds[2] = time.Since(t2)
	if err != nil {
		return ds, fmt.Errorf("exec in sandbox %s: %w", shortID(sb.ID), err)
	}
	if rerr != nil {
		return ds, fmt.Errorf("remove sandbox %s: %w", shortID(sb.ID), rerr)
	}
	return ds, nil
}

// coldParallel launches P of each at once, rounds times, den and bwrap
// batches interleaved.
func (b *bench) coldParallel(ctx context.Context) error {
	p, rounds := b.cfg.parallel, b.cfg.rounds
	var denLat, bwLat, denWall, bwWall []time.Duration
	batch := func(argv []string, lat, wall *[]time.Duration, isDen bool) benchStep {
		return func(ctx context.Context, warm bool) error {
			ds, w, err := benchBatch(ctx, argv, p)
			if err != nil {
				if isDen {
					return benchDenFailed(err)
				}
				return err
			}
			if !warm {
				*lat = append(*lat, ds...)
				*wall = append(*wall, w)
			}
			return nil
		}
	}
	steps := []benchStep{batch(b.den.argv, &denLat, &denWall, true)}
	if b.bwrap.Missing == "" {
		steps = append(steps, batch(b.bwrap.argv, &bwLat, &bwWall, false))
	}
	err := b.loop(ctx, "cold-parallel round", rounds, steps...)
	if len(denLat) == 0 {
		return err
	}
	name := fmt.Sprintf("%d× ", p)
	dl := benchStatsRow("cold-parallel", name+"den run --rm -- true: each", denLat)
	dw := benchStatsRow("cold-parallel", name+"den run --rm -- true: batch wall", denWall)
	b.add(dl, dw)
	if b.bwrap.Missing == "" {
		bl := benchStatsRow("cold-parallel", name+"bwrap (peer): each", bwLat)
		bwr := benchStatsRow("cold-parallel", name+"bwrap (peer): batch wall", bwWall)
		dl.compare(bl, "bwrap p50")
		dw.compare(bwr, "bwrap wall p50")
		b.add(bl, bwr)
	} else {
		dl.Note = b.bwrap.Missing
	}
	return err
}

// benchBatch starts p copies of argv at once and returns each one's
// latency and the wall time of the batch.
func benchBatch(ctx context.Context, argv []string, p int) ([]time.Duration, time.Duration, error) {
	var wg sync.WaitGroup
	ds := make([]time.Duration, p)
	errs := make([]error, p)
	gate := make(chan struct{})
	for i := 0; i < p; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			ds[i], errs[i] = benchExec(ctx, argv, "")
		}()
	}
	t0 := time.Now()
	close(gate)
	wg.Wait()
	wall := time.Since(t0)
	return ds, wall, errors.Join(errs...)
}

// exec: exec of true in one running sandbox through the SDK, both forms,
// vs a fork/exec of /bin/true on the host, and the den exec command line
// for reference.
func (b *bench) exec(ctx context.Context) error {
	n := b.iterations(benchExecN)
	sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
	if err != nil {
		return fmt.Errorf("create a sandbox: %w", err)
	}
	defer b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
	req := api.ExecRequest{Cmd: []string{"true"}}
	check := func(st *api.ExitStatus) error {
		if st.Reason != api.ReasonExited || st.ExitCode != 0 {
			return fmt.Errorf("true in sandbox %s ended %s, exit code %d %s", shortID(sb.ID), st.Reason, st.ExitCode, st.Error)
		}
		return nil
	}
	cliArgv := []string{b.cfg.self}
	if b.cfg.host != "" {
		cliArgv = append(cliArgv, "--host", b.cfg.host)
	}
	cliArgv = append(cliArgv, "exec", sb.ID, "--", "true")
	var js, stream, host, cliD []time.Duration
	err = b.loop(ctx, "exec", n,
		benchTimed(&js, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			res, err := b.cl.Exec(ctx, sb.ID, req)
			d := time.Since(t0)
			if err != nil {
				return d, fmt.Errorf("exec (JSON form): %w", err)
			}
			return d, check(&res.ExitStatus)
		}),
		benchTimed(&stream, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			st, err := b.cl.ExecStream(ctx, sb.ID, req, nil, nil)
			d := time.Since(t0)
			if err != nil {
				return d, fmt.Errorf("exec (stream form): %w", err)
			}
			return d, check(st)
		}),
		benchTimed(&host, func(ctx context.Context) (time.Duration, error) {
			cmd := exec.CommandContext(ctx, "/bin/true")
			t0 := time.Now()
			err := cmd.Run()
			return time.Since(t0), err
		}),
		benchTimed(&cliD, func(ctx context.Context) (time.Duration, error) {
			d, err := benchExec(ctx, cliArgv, "")
			if err != nil {
				return d, benchDenFailed(err)
			}
			return d, nil
		}),
	)
	if len(js) == 0 {
		return err
	}
	target := fmt.Sprintf("p50 ≤ %gms", benchExecLimitMs)
	jr := benchStatsRow("exec", "den SDK Exec true (JSON)", js)
	sr := benchStatsRow("exec", "den SDK ExecStream true", stream)
	hr := benchStatsRow("exec", "host fork/exec /bin/true (peer)", host)
	cr := benchStatsRow("exec", "den exec ID -- true (CLI process)", cliD)
	for _, r := range []*benchRow{jr, sr} {
		r.compare(hr, "host p50")
		r.judge(target, r.p50(), benchExecLimitMs)
	}
	cr.compare(hr, "host p50")
	cr.Note = "for reference: includes starting the den binary"
	b.add(jr, sr, hr, cr)
	return err
}

// density: count idle sandboxes, their memory cost and liveness.
func (b *bench) density(ctx context.Context) (err error) {
	n := b.cfg.count
	var sbs []*api.Sandbox
	var removed []time.Duration
	defer func() {
		// Always remove them, even after an error or Ctrl-C.
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		b.progressDone()
		var rerr error
		for i, sb := range sbs {
			t0 := time.Now()
			if e := b.cl.Remove(rctx, sb.ID, true); e != nil {
				rerr = errors.Join(rerr, fmt.Errorf("remove sandbox %s: %w", shortID(sb.ID), e))
			} else {
				removed = append(removed, time.Since(t0))
			}
			b.progress("density remove", i+1, len(sbs))
		}
		b.progressDone()
		if len(removed) > 0 && ctx.Err() == nil {
			r := benchStatsRow("density", "SDK remove (each)", removed)
			r.Note = "information"
			b.add(r)
		}
		if err == nil {
			err = rerr
		}
	}()

	// Let the memory freed by earlier scenarios settle.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(benchSettle):
	}
	before, err := benchMeminfo("MemAvailable")
	if err != nil {
		return err
	}
	var created []time.Duration
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		t0 := time.Now()
		sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
		if err != nil {
			return fmt.Errorf("create sandbox %d of %d: %w", i+1, n, err)
		}
		created = append(created, time.Since(t0))
		sbs = append(sbs, sb)
		b.progress("density create", i+1, n)
	}
	b.progressDone()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(benchSettle):
	}
	after, err := benchMeminfo("MemAvailable")
	if err != nil {
		return err
	}
	const mib = 1 << 20
	var anon, pss, cg []float64
	var missing []string
	for _, sb := range sbs {
		if sb.Pid == 0 {
			if got, err := b.cl.Get(ctx, sb.ID); err == nil {
				sb.Pid = got.Pid
			}
		}
		if sb.Pid == 0 {
			missing = append(missing, shortID(sb.ID))
			continue
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", sb.Pid))
		if err != nil {
			missing = append(missing, shortID(sb.ID))
			continue
		}
		v, err := parseStatusKB(string(status), "RssAnon")
		if err != nil {
			return fmt.Errorf("/proc/%d/status: %w", sb.Pid, err)
		}
		anon = append(anon, float64(v)/mib)
		if roll, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", sb.Pid)); err == nil {
			if v, err := parseStatusKB(string(roll), "Pss"); err == nil {
				pss = append(pss, float64(v)/mib)
			}
		}
		if cgText, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sb.Pid)); err == nil {
			if file := memCgroupFile(string(cgText), "/sys/fs/cgroup"); file != "" {
				if raw, err := os.ReadFile(file); err == nil {
					if v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64); err == nil {
						cg = append(cg, float64(v)/mib)
					}
				}
			}
		}
	}
	target := fmt.Sprintf("≤ %gMiB/sandbox", benchDensityMiB)
	drop := float64(before-after) / mib / float64(n)
	dr := &benchRow{Scenario: "density", Subject: "MemAvailable drop / sandbox", N: n, Unit: "MiB", Mean: benchPtr(drop),
		Note: fmt.Sprintf("MemAvailable %.1fMiB before the first create, %.1fMiB %.0fs after the last", float64(before)/mib, float64(after)/mib, benchSettle.Seconds())}
	dr.judge(target, drop, benchDensityMiB)
	if drop < 0 {
		dr.Note += "; negative: other processes freed more memory than the sandboxes took, so this figure is noise (use a larger --count)"
	}
	b.add(dr)
	if len(anon) > 0 {
		s := benchSummarize(anon)
		r := &benchRow{Scenario: "density", Subject: "init RssAnon / sandbox", N: s.N, Unit: "MiB",
			P50: benchPtr(s.P50), P99: benchPtr(s.P99), Mean: benchPtr(s.Mean)}
		r.judge(target, s.Mean, benchDensityMiB)
		r.Note = "sum of RssAnon of the init processes / N (the mean)"
		if len(missing) > 0 {
			r.Note += fmt.Sprintf("; no init process found for %d sandboxes", len(missing))
		}
		b.add(r)
	} else {
		return fmt.Errorf("found no init process of the sandboxes in /proc (api.Sandbox.Pid): is den bench running on the daemon's host, in its pid namespace?")
	}
	for _, x := range []struct {
		name, note string
		v          []float64
	}{
		{"init Pss / sandbox", "information: proportional set size of init, all mappings (anon, shmem, file)", pss},
		{"memory cgroup usage / sandbox", "information: the sandbox's memory cgroup, kernel memory included", cg},
	} {
		if len(x.v) == 0 {
			continue
		}
		s := benchSummarize(x.v)
		b.add(&benchRow{Scenario: "density", Subject: x.name, N: s.N, Unit: "MiB",
			P50: benchPtr(s.P50), P99: benchPtr(s.P99), Mean: benchPtr(s.Mean), Note: x.note})
	}
	cr := benchStatsRow("density", "SDK create (each)", created)
	cr.Note = "information"
	b.add(cr)

	// Every sandbox must answer while all are alive.
	var lat []time.Duration
	var failed []string
	for i, sb := range sbs {
		if err := ctx.Err(); err != nil {
			return err
		}
		ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
		t0 := time.Now()
		res, err := b.cl.Exec(ectx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
		d := time.Since(t0)
		cancel()
		switch {
		case err != nil:
			failed = append(failed, fmt.Sprintf("%s: %v", shortID(sb.ID), err))
		case res.Reason != api.ReasonExited || res.ExitCode != 0:
			failed = append(failed, fmt.Sprintf("%s: %s %d %s", shortID(sb.ID), res.Reason, res.ExitCode, res.Error))
		default:
			lat = append(lat, d)
		}
		b.progress("density exec", i+1, len(sbs))
	}
	b.progressDone()
	er := benchStatsRow("density", fmt.Sprintf("exec true in each of %d alive", n), lat)
	er.Target = "all answer"
	er.Verdict = "PASS"
	er.Note = fmt.Sprintf("%d/%d answered", len(lat), n)
	if len(failed) > 0 {
		er.Verdict = "FAIL"
		if len(failed) > 3 {
			failed = append(failed[:3], "...")
		}
		er.Note += "; " + strings.Join(failed, "; ")
	}
	b.add(er)
	return nil
}

// runscScenario: den run --rm -- true vs runsc run, for information.
func (b *bench) runscScenario(ctx context.Context) error {
	n := b.iterations(benchRunscN)
	var den, rs []time.Duration
	err := b.loop(ctx, "runsc", n,
		benchTimed(&den, func(ctx context.Context) (time.Duration, error) {
			d, err := benchExec(ctx, b.den.argv, "")
			if err != nil {
				return d, benchDenFailed(err)
			}
			return d, nil
		}),
		benchTimed(&rs, func(ctx context.Context) (time.Duration, error) {
			b.runscSeq++
			id := fmt.Sprintf("den-bench-%s-%d", b.runID, b.runscSeq)
			d, err := benchExec(ctx, append(append([]string(nil), b.runsc.argv...), id), "")
			if err != nil {
				// Leave no container behind.
				del := append(append([]string(nil), b.runsc.argv[:3]...), "delete", "--force", id)
				exec.Command(del[0], del[1:]...).Run()
			}
			return d, err
		}),
	)
	if len(den) == 0 || len(rs) == 0 {
		return err
	}
	dr := benchStatsRow("runsc", "den run --rm -- true", den)
	rr := benchStatsRow("runsc", "runsc run (ptrace, busybox) (peer)", rs)
	dr.compare(rr, "runsc p50")
	dr.Target, dr.Note = "information", "den p50 / runsc p50"
	b.add(dr, rr)
	return err
}

// Output.

func (b *bench) printHeader() {
	w := b.out
	m := b.rep.Machine
	fmt.Fprintf(w, "den bench %s\n", b.rep.Date)
	fmt.Fprintf(w, "command:  %s\n", benchQuote(b.rep.Command))
	fmt.Fprintf(w, "machine:  %d CPUs, %s, %s RAM\n", m.CPUs, m.CPUModel, humanSize(m.MemTotal))
	fmt.Fprintf(w, "kernel:   %s\n", m.Kernel)
	fmt.Fprintf(w, "load:     %s (1, 5, 15 min) at the start\n", m.LoadStart)
	d := b.rep.Den
	fmt.Fprintf(w, "den:      client %s, daemon %s (runtimes %s, cgroup %s) at %s\n", d.Client, d.Daemon, strings.Join(d.Runtimes, ","), d.Cgroup, d.Host)
	fmt.Fprintf(w, "subjects:\n")
	for _, p := range b.rep.Peers {
		fmt.Fprintf(w, "  %-9s  %s\n", p.Name, p.Command)
		if p.Version != "" && p.Name != "den" {
			fmt.Fprintf(w, "  %-9s  version: %s\n", "", p.Version)
		}
		if p.Note != "" {
			fmt.Fprintf(w, "  %-9s  %s\n", "", p.Note)
		}
		if p.Missing != "" {
			fmt.Fprintf(w, "  %-9s  SKIPPED: %s\n", "", p.Missing)
		}
	}
	c := b.rep.Config
	fmt.Fprintf(w, "settings: cold n=%d, exec n=%d, runsc n=%d, cold-parallel %d× %d rounds, density %d sandboxes, %gs settle; one untimed warm-up each; interleaved\n\n",
		c.Iterations["cold"], c.Iterations["exec"], c.Iterations["runsc"], c.Parallel, c.Rounds, c.Count, c.SettleS)
}

// benchFmt formats a value of unit for the table.
func benchFmt(v *float64, unit string) string {
	if v == nil {
		return "-"
	}
	x := *v
	switch unit {
	case "ms":
		switch {
		case x < 1:
			return fmt.Sprintf("%.3fms", x)
		case x < 10:
			return fmt.Sprintf("%.2fms", x)
		case x < 1000:
			return fmt.Sprintf("%.1fms", x)
		}
		return fmt.Sprintf("%.2fs", x/1000)
	case "MiB":
		return fmt.Sprintf("%.2fMiB", x)
	}
	return strconv.FormatFloat(x, 'g', 4, 64)
}

func (b *bench) printTable() {
	tw := newTable(b.out)
	fmt.Fprintln(tw, "SCENARIO\tSUBJECT\tN\tP50\tP99\tMEAN\tRATIO\tTARGET\tVERDICT")
	for _, r := range b.rep.Results {
		ratio := "-"
		if r.Ratio != nil {
			ratio = fmt.Sprintf("%.2f× %s", *r.Ratio, r.RatioOf)
		}
		target, verdict := r.Target, r.Verdict
		if target == "" {
			target = "-"
		}
		if verdict == "" {
			verdict = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Scenario, r.Subject, r.N,
			benchFmt(r.P50, r.Unit), benchFmt(r.P99, r.Unit), benchFmt(r.Mean, r.Unit), ratio, target, verdict)
	}
	tw.Flush()
	var notes bytes.Buffer
	for _, r := range b.rep.Results {
		if r.Note != "" && r.Note != "information" {
			fmt.Fprintf(&notes, "  %s / %s: %s\n", r.Scenario, strings.TrimSpace(r.Subject), r.Note)
		}
	}
	if notes.Len() > 0 {
		fmt.Fprintf(b.out, "\nnotes:\n%s", notes.String())
	}
	for _, s := range b.rep.Skipped {
		fmt.Fprintf(b.out, "skipped %s: %s\n", s.Scenario, s.Reason)
	}
	for _, e := range b.rep.Errors {
		fmt.Fprintf(b.out, "error in %s: %s\n", e.Scenario, e.Reason)
	}
	fmt.Fprintf(b.out, "\ntargets: %d PASS, %d FAIL; %.1fs in all; load %s at the end\n", b.rep.Passed, b.rep.Failed, b.rep.Duration, b.rep.Machine.LoadEnd)
}

func (b *bench) printJSON() error {
	round := func(p *float64) {
		if p != nil {
			*p = math.Round(*p*1e4) / 1e4
		}
	}
	for _, r := range b.rep.Results {
		round(r.P50)
		round(r.P99)
		round(r.Mean)
		round(r.Ratio)
	}
	enc := json.NewEncoder(b.out)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(&b.rep)
}

// reattach: replaying a running background process's output (the last
// 100 lines) through the API, as a client coming back would.
func (b *bench) reattach(ctx context.Context) error {
	n := b.iterations(benchReattachN)
	sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
	if err != nil {
		return fmt.Errorf("create a sandbox: %w", err)
	}
	defer b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
	p, err := b.cl.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "i=0; while :; do echo line $i; i=$((i+1)); sleep 0.01; done"})
	if err != nil {
		return fmt.Errorf("start a background process: %w", err)
	}
	time.Sleep(time.Second) // let it write a few screens of output
	var re, ex []time.Duration
	err = b.loop(ctx, "reattach", n,
		benchTimed(&re, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			_, err := b.cl.Logs(ctx, sb.ID, p.ID, client.LogsOptions{Tail: 100}, io.Discard, io.Discard)
			return time.Since(t0), err
		}),
		benchTimed(&ex, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			_, err := b.cl.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
			return time.Since(t0), err
		}),
	)
	if len(re) == 0 {
		return err
	}
	rr := benchStatsRow("reattach", "den logs --tail 100 of a running process", re)
	er := benchStatsRow("reattach", "den SDK Exec true (reference)", ex)
	rr.compare(er, "exec p50")
	rr.judge(fmt.Sprintf("p50 ≤ %gms", benchReattachMs), rr.p50(), benchReattachMs)
	b.add(rr, er)
	return err
}

// daemonRSS reads the daemon's resident memory from its /metrics.
func (b *bench) daemonRSS(ctx context.Context) (float64, error) {
	text, err := b.cl.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, "den_daemon_rss_bytes "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("the daemon's /metrics has no den_daemon_rss_bytes")
}

// procs: 1,000 background processes across 50 sandboxes, with the
// daemon's RSS before, with all of them running, and after listing them.
func (b *bench) procs(ctx context.Context) (err error) {
	var ids []string
	defer func() {
		for _, id := range ids {
			b.cl.Remove(context.WithoutCancel(ctx), id, true)
		}
	}()
	before, err := b.daemonRSS(ctx)
	if err != nil {
		return err
	}
	var starts []time.Duration
	total := benchProcBoxes * benchProcsEach
	for i := 0; i < benchProcBoxes; i++ {
		sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
		if err != nil {
			return fmt.Errorf("create sandbox %d: %w", i+1, err)
		}
		ids = append(ids, sb.ID)
		for j := 0; j < benchProcsEach; j++ {
			t0 := time.Now()
			if _, err := b.cl.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "echo started; exec sleep 3600"}); err != nil {
				return fmt.Errorf("start process %d in sandbox %d: %w", j+1, i+1, err)
			}
			starts = append(starts, time.Since(t0))
			b.progress("procs", len(starts), total)
		}
	}
	running, err := b.daemonRSS(ctx)
	if err != nil {
		return err
	}
	seen := 0
	for _, id := range ids {
		ps, err := b.cl.Processes(ctx, id)
		if err != nil {
			return err
		}
		for _, p := range ps {
			if p.State == api.ProcRunning {
				seen++
			}
		}
	}
	after, err := b.daemonRSS(ctx)
	if err != nil {
		return err
	}
	sr := benchStatsRow("procs", fmt.Sprintf("start a background process (%d in %d sandboxes)", total, benchProcBoxes), starts)
	mib := func(v float64) *float64 { return benchPtr(v / (1 << 20)) }
	live := &benchRow{Scenario: "procs", Subject: "processes running", N: seen, Unit: "count", Mean: benchPtr(float64(seen))}
	live.judge(fmt.Sprintf("all %d running", total), float64(total-seen), 0)
	rows := []*benchRow{sr, live}
	for _, m := range []struct {
		what string
		v    float64
	}{{"daemon RSS before", before}, {"daemon RSS with all running", running}, {"daemon RSS after listing all", after}} {
		r := &benchRow{Scenario: "procs", Subject: m.what, N: 1, Unit: "MiB", Mean: mib(m.v)}
		if m.what != "daemon RSS before" {
			r.judge(fmt.Sprintf("≤ %d MiB", benchProcsRSSMiB), m.v/(1<<20), benchProcsRSSMiB)
		}
		rows = append(rows, r)
	}
	b.add(rows...)
	return nil
}

// imageSize: boot time does not depend on the image's size. Two images
// made the same way (a commit of a host sandbox), one empty and one with
// a 1 GiB file, are started from interleaved; neither comes from the warm
// pool, which serves the plain host image only.
func (b *bench) imageSize(ctx context.Context) (err error) {
	n := b.iterations(benchImageN)
	tag := fmt.Sprintf("den-bench-%d", os.Getpid())
	small, big := tag+"-small", tag+"-1g"
	defer func() {
		for _, name := range []string{small, big} {
			b.cl.RemoveImage(context.WithoutCancel(ctx), name)
		}
	}()
	for _, img := range []struct{ name, fill string }{
		{small, "true"},
		{big, "head -c 1073741824 /dev/urandom > /var/tmp/big.bin"},
	} {
		fmt.Fprintf(b.errw, "image-size: making %s\n", img.name)
		sb, err := b.filled(ctx, img.fill)
		if sb == nil {
			return err
		}
		if err == nil {
			_, err = b.cl.Commit(ctx, sb.ID, api.CommitRequest{Name: img.name})
		}
		b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
		if err != nil {
			return fmt.Errorf("make %s: %w", img.name, err)
		}
	}
	boot := func(name string, dst *[]time.Duration) benchStep {
		return benchTimed(dst, func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			sb, err := b.cl.Create(ctx, api.CreateRequest{Image: name, Labels: b.labels()})
			if err != nil {
				return 0, err
			}
			_, err = b.cl.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
			d := time.Since(t0)
			b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
			return d, err
		})
	}
	var ds, db []time.Duration
	err = b.loop(ctx, "image-size", n, boot(small, &ds), boot(big, &db))
	if len(ds) == 0 {
		return err
	}
	sr := benchStatsRow("image-size", "create+exec from a small image (host + empty layer)", ds)
	br := benchStatsRow("image-size", "create+exec from a 1 GiB image (host + 1 GiB layer)", db)
	br.compare(sr, "small image p50")
	br.judge(fmt.Sprintf("p50 ≤ %g× small", benchImageRatio), *br.Ratio, benchImageRatio)
	b.add(br, sr)
	return err
}

// rebuild: a Dockerfile rebuilt with nothing changed comes from the cache.
func (b *bench) rebuild(ctx context.Context) error {
	n := b.iterations(benchRebuildN)
	files := map[string]string{
		"Dockerfile": "FROM host\nENV APP=/app\nWORKDIR /app\nCOPY src/ ./src/\nRUN ls -R src > listing\nRUN echo built > stamp\nCMD [\"cat\", \"stamp\"]\n",
	}
	for i := 0; i < 200; i++ {
		files[fmt.Sprintf("src/pkg%d/file%d.txt", i%10, i)] = strings.Repeat("x", 1000+i)
	}
	contextTar := func() io.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		names := make([]string, 0, len(files))
		for k := range files {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, name := range names {
			tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(files[name])), ModTime: time.Unix(1700000000, 0)})
			tw.Write([]byte(files[name]))
		}
		tw.Close()
		return &buf
	}
	tag := fmt.Sprintf("den-bench-%d-rebuild", os.Getpid())
	defer b.cl.RemoveImage(context.WithoutCancel(ctx), tag)
	var first bytes.Buffer
	t0 := time.Now()
	if _, err := b.cl.BuildImage(ctx, contextTar(), client.BuildOptions{Tag: tag}, &first); err != nil {
		return fmt.Errorf("first build: %w", err)
	}
	firstD := time.Since(t0)
	var rebuilds []time.Duration
	cached := true
	err := b.loop(ctx, "rebuild", n, benchTimed(&rebuilds, func(ctx context.Context) (time.Duration, error) {
		var out bytes.Buffer
		t0 := time.Now()
		_, err := b.cl.BuildImage(ctx, contextTar(), client.BuildOptions{Tag: tag}, &out)
		d := time.Since(t0)
		if strings.Count(out.String(), "using cache") != 4 {
			cached = false
		}
		return d, err
	}))
	if len(rebuilds) == 0 {
		return err
	}
	// Change the last instruction: only it runs again.
	files["Dockerfile"] = strings.Replace(files["Dockerfile"], `CMD ["cat", "stamp"]`, "RUN echo changed > stamp2", 1)
	var last bytes.Buffer
	t0 = time.Now()
	_, lerr := b.cl.BuildImage(ctx, contextTar(), client.BuildOptions{Tag: tag}, &last)
	lastD := time.Since(t0)
	fr := &benchRow{Scenario: "rebuild", Subject: "first build (7 steps, 200 files)", N: 1, Unit: "ms", Mean: benchPtr(float64(firstD.Microseconds()) / 1000)}
	rr := benchStatsRow("rebuild", "rebuild, nothing changed", rebuilds)
	rr.judge(fmt.Sprintf("p50 ≤ %gs, all steps cached", benchRebuildS), rr.p50()/1000, benchRebuildS)
	if !cached {
		rr.Verdict, rr.Note = "FAIL", "a rebuild ran a step instead of using the cache"
	}
	lr := &benchRow{Scenario: "rebuild", Subject: "last instruction changed", N: 1, Unit: "ms", Mean: benchPtr(float64(lastD.Microseconds()) / 1000)}
	onlyLast := lerr == nil && strings.Count(last.String(), "using cache") == 4 && strings.Contains(last.String(), "Step 7/7 : RUN echo changed")
	lr.Target, lr.Verdict = "only that step runs", map[bool]string{true: "PASS", false: "FAIL"}[onlyLast]
	b.add(fr, rr, lr)
	return err
}
