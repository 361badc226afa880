package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// summary summarises samples.
type summary struct {
	N                        int
	P50, P99, Mean, Min, Max float64
}

// percentile returns the p-th percentile (0..100) of sorted samples,
// interpolating linearly between the two nearest ranks (numpy's default),
// or NaN without samples.
func percentile(sorted []float64, p float64) float64 {
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

// summarize returns the statistics of xs (which it does not modify).
func summarize(xs []float64) summary {
	s := summary{N: len(xs)}
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
	s.P50 = percentile(sorted, 50)
	s.P99 = percentile(sorted, 99)
	s.Mean = sum / float64(len(sorted))
	s.Min, s.Max = sorted[0], sorted[len(sorted)-1]
	return s
}

// millis converts durations to milliseconds.
func millis(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}

// quotient returns a/b, or NaN when either is unknown or b is not
// positive.
func quotient(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b <= 0 {
		return math.NaN()
	}
	return a / b
}

// verdict judges a value against an upper limit: PASS when v <= limit,
// FAIL when above, n/a when v is unknown.
func verdict(v, limit float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "n/a"
	case v <= limit:
		return "PASS"
	}
	return "FAIL"
}

func ptr(v float64) *float64 {
	if math.IsNaN(v) {
		return nil
	}
	return &v
}

// statsRow makes a row of millisecond samples.
func statsRow(scenario, subject string, samples []time.Duration) *Row {
	s := summarize(millis(samples))
	return &Row{Scenario: scenario, Subject: subject, N: s.N, Unit: "ms",
		P50: ptr(s.P50), P99: ptr(s.P99), Mean: ptr(s.Mean)}
}

func (r *Row) p50() float64 {
	if r == nil || r.P50 == nil {
		return math.NaN()
	}
	return *r.P50
}

// compare sets the row's ratio of its p50 to the peer row's p50.
func (r *Row) compare(peer *Row, of string) float64 {
	ratio := quotient(r.p50(), peer.p50())
	r.Ratio, r.RatioOf = ptr(ratio), of
	return ratio
}

// judge sets the row's target and verdict for value v against limit.
func (r *Row) judge(target string, v, limit float64) {
	r.Target, r.Verdict = target, verdict(v, limit)
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

// meminfo returns one field of /proc/meminfo in bytes.
func meminfo(field string) (int64, error) {
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

// Quote joins argv as a shell would need it written.
func Quote(argv []string) string {
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

// Select checks the scenario names (none: all of them) and returns
