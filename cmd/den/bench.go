package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/den-dev/den/internal/bench"
)

var verbBench = &verb{
	name:     "bench",
	summary:  "measure den side by side with its peers (bwrap, runsc)",
	synopsis: "[flags] [SCENARIO...]",
	details: `Runs den and its peers in one run, interleaved (den, peer, den, peer, ...),
after one untimed warm-up of each, and reports p50, p99, mean, the ratio to
the peer and the verdict of each target. Scenarios (default: all that this
host supports; a peer whose binary is missing is skipped with the reason):

` + benchScenarioHelp() + `
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

// benchScenarioHelp lists the harness's cases for den bench -h: the name,
// then its description indented to one column.
func benchScenarioHelp() string {
	var b strings.Builder
	for _, c := range bench.Cases() {
		for i, line := range strings.Split(c.About, "\n") {
			name := ""
			if i == 0 {
				name = c.Name
			}
			fmt.Fprintf(&b, "  %-13s  %s\n", name, line)
		}
	}
	return b.String()
}

// benchQuote joins argv as a shell would need it written (den ps's
// COMMAND column uses it too).
var benchQuote = bench.Quote

// benchSSHAddr is the gateway the ssh scenario measures: $DEN_SSH_HOST
// (default 127.0.0.1) and $DEN_SSH_PORT (default 2222).
func benchSSHAddr() string {
	host := envOr("DEN_SSH_HOST", "127.0.0.1")
	return net.JoinHostPort(host, envOr("DEN_SSH_PORT", strconv.Itoa(defaultSSHPort)))
}

func cmdBench(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag("print the results as one JSON document (progress still goes to stderr)")
	iterations := f.Int("iterations", "n", "N", fmt.Sprintf("iterations of cold, exec and runsc (default %d, %d and %d)", bench.DefaultColdN, bench.DefaultExecN, bench.DefaultRunscN))
	parallel := f.Int("parallel", "p", "P", fmt.Sprintf("launches at once in cold-parallel (default %d)", bench.DefaultParallel))
	rounds := f.Int("rounds", "", "R", fmt.Sprintf("batches of cold-parallel (default %d)", bench.DefaultRounds))
	count := f.Int("count", "", "N", fmt.Sprintf("sandboxes created by density (default %d)", bench.DefaultCount))
	strict := f.Bool("strict", "", "exit 1 when a target fails")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	scenarios, err := bench.Select(pos)
	if err != nil {
		return usagef(v, "%v", err)
	}
	// Unset, they are 0: the harness's defaults.
	for _, d := range []struct {
		p    *int
		name string
	}{{parallel, "parallel"}, {rounds, "rounds"}, {count, "count"}} {
		if f.isSet(d.name) && *d.p < 1 {
			return usagef(v, "%s must be at least 1", spell(d.name))
		}
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the den binary: %w", err)
	}
	host := f.host
	if host == "" {
		host = c.host
	}
	den := []string{self}
	if host != "" {
		den = append(den, "--host", host)
	}
	command := []string{"den"}
	if c.host != "" {
		command = append(command, "--host", c.host)
	}
	command = append(append(command, "bench"), args...)
	o := bench.Options{Client: c.client(f), Den: den, Version: version, Cases: scenarios,
		Iterations: *iterations, Parallel: *parallel, Rounds: *rounds, Count: *count,
		SSHAddr: benchSSHAddr(), Command: command, Progress: c.stderr, Terminal: isTerminal(c.stderr)}
	if !*jsonOut {
		o.Started = func(rep *bench.Report) { printBenchHeader(c, rep) }
	}

	ctx, stop := signalContext()
	defer stop()
	rep, err := bench.Run(ctx, o)
	if ctx.Err() != nil {
		fmt.Fprintln(c.stderr, "den: bench interrupted")
		return exitError(130)
	}
	if err != nil {
		return err
	}
	if *jsonOut {
		if err := rep.WriteJSON(c.stdout); err != nil {
			return err
		}
	} else {
		printBenchTable(c, rep)
	}
	switch {
	case len(rep.Errors) > 0:
		return exitError(1)
	case *strict && rep.Failed > 0:
		return exitError(1)
	}
	return nil
}

// printBenchHeader prints the machine, the den measured, the subjects and
// the settings, before the first scenario runs.
func printBenchHeader(c *cli, rep *bench.Report) {
	w := c.stdout
	m := rep.Machine
	fmt.Fprintf(w, "den bench %s\n", rep.Date)
	fmt.Fprintf(w, "command:  %s\n", benchQuote(rep.Command))
	fmt.Fprintf(w, "machine:  %d CPUs, %s, %s RAM\n", m.CPUs, m.CPUModel, humanSize(m.MemTotal))
	fmt.Fprintf(w, "kernel:   %s\n", m.Kernel)
	fmt.Fprintf(w, "load:     %s (1, 5, 15 min) at the start\n", m.LoadStart)
	d := rep.Den
	fmt.Fprintf(w, "den:      client %s, daemon %s (runtimes %s, cgroup %s) at %s\n", d.Client, d.Daemon, strings.Join(d.Runtimes, ","), d.Cgroup, d.Host)
	fmt.Fprintf(w, "subjects:\n")
	for _, p := range rep.Peers {
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
	s := rep.Config
	fmt.Fprintf(w, "settings: cold n=%d, exec n=%d, runsc n=%d, cold-parallel %d× %d rounds, density %d sandboxes, %gs settle; one untimed warm-up each; interleaved\n\n",
		s.Iterations["cold"], s.Iterations["exec"], s.Iterations["runsc"], s.Parallel, s.Rounds, s.Count, s.SettleS)
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

// printBenchTable prints the results, the notes of the rows, what was
// skipped or failed, and the count of verdicts.
func printBenchTable(c *cli, rep *bench.Report) {
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "SCENARIO\tSUBJECT\tN\tP50\tP99\tMEAN\tRATIO\tTARGET\tVERDICT")
	for _, r := range rep.Results {
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
	for _, r := range rep.Results {
		if r.Note != "" && r.Note != "information" {
			fmt.Fprintf(&notes, "  %s / %s: %s\n", r.Scenario, strings.TrimSpace(r.Subject), r.Note)
		}
	}
	if notes.Len() > 0 {
		fmt.Fprintf(c.stdout, "\nnotes:\n%s", notes.String())
	}
	for _, s := range rep.Skipped {
		fmt.Fprintf(c.stdout, "skipped %s: %s\n", s.Scenario, s.Reason)
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(c.stdout, "error in %s: %s\n", e.Scenario, e.Reason)
	}
	fmt.Fprintf(c.stdout, "\ntargets: %d PASS, %d FAIL; %.1fs in all; load %s at the end\n", rep.Passed, rep.Failed, rep.Duration, rep.Machine.LoadEnd)
}
