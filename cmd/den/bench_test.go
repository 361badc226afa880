package main

import (
	"bytes"
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func benchClose(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestBenchPercentile(t *testing.T) {
	var xs []float64
	for i := 1; i <= 100; i++ {
		xs = append(xs, float64(i))
	}
	for _, tc := range []struct{ p, want float64 }{
		{0, 1}, {50, 50.5}, {99, 99.01}, {100, 100}, {25, 25.75}, {-5, 1}, {150, 100},
	} {
		if got := benchPercentile(xs, tc.p); !benchClose(got, tc.want) {
			t.Errorf("p%g of 1..100 = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := benchPercentile([]float64{7}, 99); got != 7 {
		t.Errorf("p99 of one sample = %v, want 7", got)
	}
	if got := benchPercentile([]float64{1, 3}, 50); got != 2 {
		t.Errorf("p50 of {1,3} = %v, want 2", got)
	}
	if got := benchPercentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("p50 of nothing = %v, want NaN", got)
	}
}

func TestBenchSummarize(t *testing.T) {
	in := []float64{5, 1, 4, 2, 3, 100}
	s := benchSummarize(in)
	if s.N != 6 || s.Min != 1 || s.Max != 100 {
		t.Errorf("summary %+v", s)
	}
	if !benchClose(s.P50, 3.5) {
		t.Errorf("p50 = %v, want 3.5", s.P50)
	}
	if !benchClose(s.Mean, 115.0/6) {
		t.Errorf("mean = %v, want %v", s.Mean, 115.0/6)
	}
	// p99 of 6 samples: rank 4.95 between 5 and 100.
	if !benchClose(s.P99, 5+0.95*95) {
		t.Errorf("p99 = %v, want %v", s.P99, 5+0.95*95)
	}
	if in[0] != 5 || in[5] != 100 {
		t.Errorf("benchSummarize sorted its input: %v", in)
	}
	if e := benchSummarize(nil); e.N != 0 || !math.IsNaN(e.P50) || !math.IsNaN(e.Mean) {
		t.Errorf("empty summary %+v", e)
	}
	ms := benchMs([]time.Duration{1500 * time.Microsecond, 2 * time.Second})
	if ms[0] != 1.5 || ms[1] != 2000 {
		t.Errorf("benchMs = %v", ms)
	}
}

func TestBenchRatioVerdict(t *testing.T) {
	if r := benchRatio(30, 10); r != 3 {
		t.Errorf("ratio 30/10 = %v", r)
	}
	for _, r := range []float64{benchRatio(1, 0), benchRatio(1, -1), benchRatio(math.NaN(), 1), benchRatio(1, math.NaN())} {
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
		if got := benchVerdict(tc.v, tc.limit); got != tc.want {
			t.Errorf("verdict(%v ≤ %v) = %s, want %s", tc.v, tc.limit, got, tc.want)
		}
	}

	// A den row 3.5× slower than bwrap fails "≤ 3×"; one 2.5× passes.
	peer := &benchRow{P50: benchPtr(5)}
	slow := &benchRow{P50: benchPtr(17.5)}
	ratio := slow.compare(peer, "bwrap p50")
	slow.judge("p50 ≤ 3× bwrap", ratio, benchColdRatio)
	if slow.Ratio == nil || *slow.Ratio != 3.5 || slow.RatioOf != "bwrap p50" || slow.Verdict != "FAIL" {
		t.Errorf("slow row: ratio %v of %q, verdict %s", slow.Ratio, slow.RatioOf, slow.Verdict)
	}
	fast := &benchRow{P50: benchPtr(12.5)}
	fast.judge("p50 ≤ 3× bwrap", fast.compare(peer, "bwrap p50"), benchColdRatio)
	if fast.Verdict != "PASS" || *fast.Ratio != 2.5 {
		t.Errorf("fast row: ratio %v, verdict %s", *fast.Ratio, fast.Verdict)
	}
	// No peer measurement: no ratio, no verdict either way.
	lone := &benchRow{P50: benchPtr(12.5)}
	lone.judge("x", lone.compare(&benchRow{}, "bwrap p50"), benchColdRatio)
	if lone.Ratio != nil || lone.Verdict != "n/a" {
		t.Errorf("row without peer: ratio %v verdict %s", lone.Ratio, lone.Verdict)
	}
}

func TestBenchStatsRow(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 200; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	r := benchStatsRow("cold", "den", ds)
	if r.N != 200 || r.Unit != "ms" || !benchClose(*r.P50, 100.5) || !benchClose(*r.P99, 198.01) || !benchClose(*r.Mean, 100.5) {
		t.Errorf("row %+v p50 %v p99 %v mean %v", r, *r.P50, *r.P99, *r.Mean)
	}
	if e := benchStatsRow("cold", "none", nil); e.P50 != nil || e.P99 != nil || e.Mean != nil || e.N != 0 {
		t.Errorf("empty row %+v", e)
	}
}

const benchMeminfoSample = `MemTotal:       24684096 kB
MemFree:        22774520 kB
MemAvailable:   23846300 kB
Buffers:           52828 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
`

func TestBenchParseMeminfo(t *testing.T) {
	m, err := parseMeminfo(strings.NewReader(benchMeminfoSample))
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
	if v, err := benchMeminfo("MemAvailable"); err != nil || v <= 0 {
		t.Errorf("/proc/meminfo MemAvailable: %d %v", v, err)
	}
	if _, err := benchMeminfo("NoSuchField"); err == nil {
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

func TestBenchFormatting(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		unit string
		want string
	}{
		{0.4567, "ms", "0.457ms"}, {2.345, "ms", "2.35ms"}, {43.12, "ms", "43.1ms"}, {1234, "ms", "1.23s"}, {3.999, "MiB", "4.00MiB"},
	} {
		if got := benchFmt(benchPtr(tc.v), tc.unit); got != tc.want {
			t.Errorf("benchFmt(%v %s) = %q, want %q", tc.v, tc.unit, got, tc.want)
		}
	}
	if got := benchFmt(nil, "ms"); got != "-" {
		t.Errorf("nil = %q", got)
	}
	argv := []string{"/tmp/den", "--host", "unix:///run/den/den.sock", "run", "--rm", "--", "true", "it's", "a b", ""}
	want := `/tmp/den --host unix:///run/den/den.sock run --rm -- true 'it'\''s' 'a b' ''`
	if got := benchQuote(argv); got != want {
		t.Errorf("quote: %s\nwant:  %s", got, want)
	}
	if got := benchQuote(benchBwrapArgv); !strings.HasPrefix(got, "bwrap --unshare-all --die-with-parent --ro-bind /usr /usr") || !strings.HasSuffix(got, "--tmpfs /tmp /bin/true") {
		t.Errorf("bwrap command: %s", got)
	}
}

func TestBenchSelectAndFlags(t *testing.T) {
	got, err := benchSelect(verbBench, []string{"exec", "COLD", "exec"})
	if err != nil || strings.Join(got, ",") != "cold,exec" {
		t.Errorf("select: %v %v", got, err)
	}
	if got, _ := benchSelect(verbBench, nil); len(got) != len(benchScenarioNames) {
		t.Errorf("default selection %v", got)
	}
	if _, err := benchSelect(verbBench, []string{"warm"}); err == nil || !strings.Contains(err.Error(), "cold-parallel") {
		t.Errorf("unknown scenario: %v", err)
	}

	var out, errb bytes.Buffer
	if code := run([]string{"bench", "nosuch"}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown scenario "nosuch"`) {
		t.Errorf("den bench nosuch: exit %d, %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"bench", "--parallel", "0", "cold"}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--parallel") {
		t.Errorf("den bench --parallel 0: exit %d, %q", code, errb.String())
	}
	// No daemon: say what to do.
	errb.Reset()
	sock := filepath.Join(t.TempDir(), "none.sock")
	if code := run([]string{"--host", "unix://" + sock, "bench", "exec"}, nil, &out, &errb); code != 1 || !strings.Contains(errb.String(), "den serve") {
		t.Errorf("den bench without a daemon: exit %d, %q", code, errb.String())
	}
}

func TestBenchReportJSON(t *testing.T) {
	r := &benchRow{Scenario: "exec", Subject: "x", N: 3, Unit: "ms", P50: benchPtr(1.23456789)}
	r.judge("p50 ≤ 3ms", r.p50(), benchExecLimitMs)
	var out bytes.Buffer
	b := &bench{out: &out}
	b.add(r)
	if err := b.printJSON(); err != nil {
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
}
