package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/storage"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestBenchPercentile(t *testing.T) {
	var xs []float64
	for i := 1; i <= 100; i++ {
		xs = append(xs, float64(i))
	}
	for _, tc := range []struct{ p, want float64 }{
		{0, 1}, {50, 50.5}, {99, 99.01}, {100, 100}, {25, 25.75}, {-5, 1}, {150, 100},
	} {
		if got := percentile(xs, tc.p); !near(got, tc.want) {
			t.Errorf("p%g of 1..100 = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := percentile([]float64{7}, 99); got != 7 {
		t.Errorf("p99 of one sample = %v, want 7", got)
	}
	if got := percentile([]float64{1, 3}, 50); got != 2 {
		t.Errorf("p50 of {1,3} = %v, want 2", got)
	}
	if got := percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("p50 of nothing = %v, want NaN", got)
	}
}

func TestBenchSummarize(t *testing.T) {
	in := []float64{5, 1, 4, 2, 3, 100}
	s := summarize(in)
	if s.N != 6 || s.Min != 1 || s.Max != 100 {
		t.Errorf("summary %+v", s)
	}
	if !near(s.P50, 3.5) {
		t.Errorf("p50 = %v, want 3.5", s.P50)
	}
	if !near(s.Mean, 115.0/6) {
		t.Errorf("mean = %v, want %v", s.Mean, 115.0/6)
	}
	// p99 of 6 samples: rank 4.95 between 5 and 100.
	if !near(s.P99, 5+0.95*95) {
		t.Errorf("p99 = %v, want %v", s.P99, 5+0.95*95)
	}
	if in[0] != 5 || in[5] != 100 {
		t.Errorf("summarize sorted its input: %v", in)
	}
	if e := summarize(nil); e.N != 0 || !math.IsNaN(e.P50) || !math.IsNaN(e.Mean) {
		t.Errorf("empty summary %+v", e)
	}
	ms := millis([]time.Duration{1500 * time.Microsecond, 2 * time.Second})
	if ms[0] != 1.5 || ms[1] != 2000 {
		t.Errorf("millis = %v", ms)
	}
}

func TestBenchRatioVerdict(t *testing.T) {
	if r := quotient(30, 10); r != 3 {
		t.Errorf("ratio 30/10 = %v", r)
	}
	for _, r := range []float64{quotient(1, 0), quotient(1, -1), quotient(math.NaN(), 1), quotient(1, math.NaN())} {
		if !math.IsNaN(r) {
			t.Errorf("ratio with a bad operand = %v, want NaN", r)
		}
	}
	for _, tc := range []struct {
		v, limit float64
		want     string
	}{
		{2.9, 3, "PASS"}, {3, 3, "PASS"}, {3.0001, 3, "FAIL"}, {8.6, 3, "FAIL"},
		{math.NaN(), 3, "n/a"}, {math.Inf(1), 3, "n/a"}, {0, 4, "PASS"}, {-1, 4, "PASS"},
	} {
		if got := verdict(tc.v, tc.limit); got != tc.want {
			t.Errorf("verdict(%v ≤ %v) = %s, want %s", tc.v, tc.limit, got, tc.want)
		}
	}

	// A den row 3.5× slower than bwrap fails "≤ 3×"; one 2.5× passes.
	peer := &Row{P50: ptr(5)}
	slow := &Row{P50: ptr(17.5)}
	ratio := slow.compare(peer, "bwrap p50")
	slow.judge("p50 ≤ 3× bwrap", ratio, coldRatio)
	if slow.Ratio == nil || *slow.Ratio != 3.5 || slow.RatioOf != "bwrap p50" || slow.Verdict != "FAIL" {
		t.Errorf("slow row: ratio %v of %q, verdict %s", slow.Ratio, slow.RatioOf, slow.Verdict)
	}
	fast := &Row{P50: ptr(12.5)}
	fast.judge("p50 ≤ 3× bwrap", fast.compare(peer, "bwrap p50"), coldRatio)
	if fast.Verdict != "PASS" || *fast.Ratio != 2.5 {
		t.Errorf("fast row: ratio %v, verdict %s", *fast.Ratio, fast.Verdict)
	}
	// No peer measurement: no ratio, no verdict either way.
	lone := &Row{P50: ptr(12.5)}
	lone.judge("x", lone.compare(&Row{}, "bwrap p50"), coldRatio)
	if lone.Ratio != nil || lone.Verdict != "n/a" {
		t.Errorf("row without peer: ratio %v verdict %s", lone.Ratio, lone.Verdict)
	}
}

func TestBenchStatsRow(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 200; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	r := statsRow("cold", "den", ds)
	if r.N != 200 || r.Unit != "ms" || !near(*r.P50, 100.5) || !near(*r.P99, 198.01) || !near(*r.Mean, 100.5) {
		t.Errorf("row %+v p50 %v p99 %v mean %v", r, *r.P50, *r.P99, *r.Mean)
	}
	if e := statsRow("cold", "none", nil); e.P50 != nil || e.P99 != nil || e.Mean != nil || e.N != 0 {
		t.Errorf("empty row %+v", e)
	}
}

const meminfoSample = `MemTotal:       24684096 kB
MemFree:        22774520 kB
MemAvailable:   23846300 kB
Buffers:           52828 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
`

func TestBenchParseMeminfo(t *testing.T) {
	m, err := parseMeminfo(strings.NewReader(meminfoSample))
	if err != nil {
		t.Fatal(err)
	}
	if m["MemAvailable"] != 23846300*1024 || m["MemTotal"] != 24684096*1024 {
		t.Errorf("MemAvailable %d MemTotal %d", m["MemAvailable"], m["MemTotal"])
	}
	if v, ok := m["HugePages_Total"]; !ok || v != 0 {
		t.Errorf("a count without unit: %d %v", v, ok)
	}
	if _, err := parseMeminfo(strings.NewReader("MemTotal: lots kB\n")); err == nil {
		t.Error("a bad value parsed")
	}
	if _, err := parseMeminfo(strings.NewReader("MemTotal: 5 MB\n")); err == nil {
		t.Error("an unknown unit parsed")
	}
	if _, err := parseMeminfo(strings.NewReader("")); err == nil {
		t.Error("an empty meminfo parsed")
	}
	// The real file, on Linux.
	if v, err := meminfo("MemAvailable"); err != nil || v <= 0 {
		t.Errorf("/proc/meminfo MemAvailable: %d %v", v, err)
	}
	if _, err := meminfo("NoSuchField"); err == nil {
		t.Error("a missing field did not fail")
	}
}

func TestBenchParseStatus(t *testing.T) {
	status := "Name:\tden\nVmRSS:\t   11844 kB\nRssAnon:\t    2584 kB\nRssFile:\t    1504 kB\nRssShmem:\t    7756 kB\nThreads:\t6\n"
	for field, want := range map[string]int64{"RssAnon": 2584 * 1024, "RssShmem": 7756 * 1024, "Threads": 6} {
		if got, err := parseStatusKB(status, field); err != nil || got != want {
			t.Errorf("%s = %d %v, want %d", field, got, err, want)
		}
	}
	if _, err := parseStatusKB(status, "Rss"); err == nil {
		t.Error("Rss matched a longer field name")
	}
	roll := "55d0c0000000-7ffd5e5f7000 ---p 00000000 00:00 0  [rollup]\nRss:   11612 kB\nPss:   10207 kB\nPss_Anon:   2352 kB\n"
	if got, err := parseStatusKB(roll, "Pss"); err != nil || got != 10207*1024 {
		t.Errorf("smaps_rollup Pss = %d %v", got, err)
	}
	if _, err := parseStatusKB("RssAnon:\tmany kB\n", "RssAnon"); err == nil {
		t.Error("a bad RssAnon parsed")
	}
}

func TestBenchCPUModelAndCgroup(t *testing.T) {
	cpuinfo := "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\nprocessor\t: 1\nmodel name\t: other\n"
	if got := parseCPUModel(cpuinfo); got != "Intel(R) Xeon(R) Processor" {
		t.Errorf("cpu model %q", got)
	}
	if got := parseCPUModel("processor : 0\n"); got != "" {
		t.Errorf("cpu model without one: %q", got)
	}
	v1 := "9:name=systemd:/\n8:pids:/den/13aa\n4:memory:/den/13aa\n1:cpu,cpuacct:/den/13aa\n0::/\n"
	if got, want := memCgroupFile(v1, "/sys/fs/cgroup"), "/sys/fs/cgroup/memory/den/13aa/memory.usage_in_bytes"; got != want {
		t.Errorf("v1: %q, want %q", got, want)
	}
	v2 := "0::/den/13aa\n"
	if got, want := memCgroupFile(v2, "/sys/fs/cgroup"), filepath.Join("/sys/fs/cgroup", "den/13aa", "memory.current"); got != want {
		t.Errorf("v2: %q, want %q", got, want)
	}
	if got := memCgroupFile("0::/\n", "/sys/fs/cgroup"); got != "" {
		t.Errorf("root cgroup: %q, want none", got)
	}
}

func TestBenchQuote(t *testing.T) {
	argv := []string{"/tmp/den", "--host", "unix:///run/den/den.sock", "run", "--rm", "--", "true", "it's", "a b", ""}
	want := `/tmp/den --host unix:///run/den/den.sock run --rm -- true 'it'\''s' 'a b' ''`
	if got := Quote(argv); got != want {
		t.Errorf("quote: %s\nwant:  %s", got, want)
	}
	if got := Quote(bwrapArgv); !strings.HasPrefix(got, "bwrap --unshare-all --die-with-parent --ro-bind /usr /usr") || !strings.HasSuffix(got, "--tmpfs /tmp /bin/true") {
		t.Errorf("bwrap command: %s", got)
	}
}

func TestBenchSelect(t *testing.T) {
	got, err := Select([]string{"exec", "COLD", "exec"})
	if err != nil || strings.Join(got, ",") != "cold,exec" {
		t.Errorf("select: %v %v", got, err)
	}
	if got, _ := Select(nil); len(got) != len(Cases()) || got[0] != "cold" || got[len(got)-1] != "mcp" {
		t.Errorf("default selection %v", got)
	}
	if got, _ := Select([]string{"exec", "all"}); len(got) != len(Cases()) {
		t.Errorf("all: %v", got)
	}
	_, err = Select([]string{"warm"})
	if err == nil || !strings.Contains(err.Error(), "cold-parallel") || !strings.Contains(err.Error(), `unknown scenario "warm"`) {
		t.Errorf("unknown scenario: %v", err)
	}
	if api.KindOf(err) != api.KindInvalid {
		t.Errorf("unknown scenario is a %s error, want invalid", api.KindOf(err))
	}
}

// Every case runs, is described, and its description fits den bench -h.
func TestBenchCases(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range Cases() {
		if c.Name == "" || c.run == nil || seen[c.Name] {
			t.Errorf("case %q: empty, without a run function or twice", c.Name)
		}
		seen[c.Name] = true
		if c.About == "" {
			t.Errorf("case %s has no description", c.Name)
		}
		for _, line := range strings.Split(c.About, "\n") {
			if n := utf8.RuneCountInString(line); n > 61 || line != strings.TrimSpace(line) {
				t.Errorf("case %s: description line of %d columns or with spaces around it: %q", c.Name, n, line)
			}
		}
	}
}

// Bad options are refused before the daemon is asked anything.
func TestBenchRunOptions(t *testing.T) {
	cl := client.New("unix://" + filepath.Join(t.TempDir(), "none.sock"))
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Client: cl, Den: []string{"den"}, Cases: []string{"nosuch"}}, `unknown scenario "nosuch"`},
		{Options{Den: []string{"den"}}, "no client"},
		{Options{Client: cl}, "no den binary"},
		{Options{Client: cl, Den: []string{"den"}, Parallel: -1}, "must not be negative"},
	} {
		rep, err := Run(context.Background(), tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) || api.KindOf(err) != api.KindInvalid || rep != nil {
			t.Errorf("Run(%+v) = %v, %v; want an invalid error with %q", tc.o, rep, err, tc.want)
		}
	}
	// The same options with a client and a den binary get as far as the
	// daemon, which is not there: a report without results and an error.
	rep, err := Run(context.Background(), Options{Client: cl, Den: []string{"den"}, Cases: []string{"exec"}})
	if err == nil || !strings.Contains(err.Error(), "running daemon") || rep == nil || len(rep.Results) != 0 {
		t.Errorf("Run without a daemon = %+v, %v", rep, err)
	}
}

func TestBenchReportJSON(t *testing.T) {
	r := &Row{Scenario: "exec", Subject: "x", N: 3, Unit: "ms", P50: ptr(1.23456789)}
	r.judge("p50 ≤ 3ms", r.p50(), execLimitMs)
	rep := &Report{Results: []*Row{r}}
	var out bytes.Buffer
	if err := rep.WriteJSON(&out); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := doc.Results[0]
	if got["p50"] != 1.2346 || got["verdict"] != "PASS" || got["unit"] != "ms" {
		t.Errorf("json row %v", got)
	}
	if _, ok := got["p99"]; ok {
		t.Errorf("an unset p99 in JSON: %v", got)
	}
	if *r.P50 != 1.23456789 {
		t.Errorf("WriteJSON rounded the report itself: p50 %v", *r.P50)
	}
}

// runsc --network=none leaves its null network namespace bind-mounted in
// its state directory; the run's temporary directory goes anyway.
func TestBenchRemoveTemp(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root")
	}
	dir := t.TempDir()
	ns := filepath.Join(dir, "state", "null-netns")
	if err := os.MkdirAll(filepath.Dir(ns), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc/self/ns/net", ns, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(ns, unix.MNT_DETACH) })
	if mounts := storage.MountsUnder(dir); len(mounts) != 1 || mounts[0] != ns {
		t.Fatalf("mounts under %s: %v, want %s", dir, mounts, ns)
	}
	removeTemp(dir)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s is still there (%v); mounts under it: %v", dir, err, storage.MountsUnder(dir))
	}
}
