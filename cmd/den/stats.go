package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbStats = &verb{
	name:     "stats",
	summary:  "show sandboxes' resource use and usage totals",
	synopsis: "[flags] [ID...]",
	details: `Prints one line a sandbox (all running and paused sandboxes when no ID
is given; stats leave a paused sandbox paused, and a hibernated one has none):
CPU time and memory of the current run, processes, the bytes of its
writable layer (DISK), network bytes received and sent, and its usage
totals since it was created: CPU seconds (CPU-S), memory GiB-hours
(GIB-H), and the time it was running (ALIVE) and busy with exec, file or
process calls (ACTIVE). A "-" limit is none.

By default den prints once (--no-stream); with -f it prints again every
2 seconds until Ctrl-C (on a terminal, in place).`,
	example: `den stats web
		den stats -f
		den stats --json web | jq '.[0].usage'`,
	run: cmdStats,
}

// statsInterval is the refresh period of den stats -f.
var statsInterval = 2 * time.Second

func cmdStats(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	follow := f.Bool("follow", "f", "print again every 2 seconds until Ctrl-C")
	noStream := f.Bool("no-stream", "", "print once (the default)")
	jsonOut := f.jsonFlag("print the stats as a JSON array (with -f, one JSON object a line)")
	ids, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if *follow && *noStream {
		return usagef(v, "-f and --no-stream do not go together")
	}
	cl := c.client(f)
	if !*follow {
		list, failed, err := c.collectStats(context.Background(), cl, v, ids)
		if err != nil {
			return err
		}
		if *jsonOut {
			if err := c.printJSON(list); err != nil {
				return err
			}
		} else if err := printStats(c.stdout, list); err != nil {
			return err
		}
		if failed {
			return exitError(1)
		}
		return nil
	}

	ctx, stop := signalContext()
	defer stop()
	inPlace := isTerminal(c.stdout) && !*jsonOut
	for round := 0; ; round++ {
		list, _, err := c.collectStats(ctx, cl, v, ids)
		if ctx.Err() != nil {
			return exitError(130)
		}
		if err != nil {
			return err
		}
		switch {
		case *jsonOut:
			enc := json.NewEncoder(c.stdout)
			enc.SetEscapeHTML(false)
			for _, st := range list {
				if err := enc.Encode(st); err != nil {
					return err
				}
			}
		default:
			if inPlace {
				fmt.Fprint(c.stdout, "\x1b[H\x1b[2J")
			} else if round > 0 {
				fmt.Fprintln(c.stdout)
			}
			if err := printStats(c.stdout, list); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return exitError(130)
		case <-time.After(statsInterval):
		}
	}
}

// collectStats gets the stats of each sandbox of ids, or of all running
// and paused sandboxes when there are none. Errors for single sandboxes are reported
// (failed is set); an error for the whole call is returned.
func (c *cli) collectStats(ctx context.Context, cl *client.Client, v *verb, ids []string) (list []*api.Stats, failed bool, err error) {
	list = []*api.Stats{}
	all := len(ids) == 0
	if all {
		sbs, err := cl.List(ctx, nil)
		if err != nil {
			return nil, false, err
		}
		for _, sb := range sbs {
			if sb.State == api.StateRunning || sb.State == api.StatePaused {
				ids = append(ids, sb.ID)
			}
		}
	}
	for _, id := range ids {
		st, err := cl.Stats(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return nil, false, ctx.Err()
			}
			if all {
				continue // stopped or removed meanwhile
			}
			c.report(v, err)
			failed = true
			continue
		}
		list = append(list, st)
	}
	return list, failed, nil
}

// printStats prints the stats table.
func printStats(w io.Writer, list []*api.Stats) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tCPU\tMEM / LIMIT\tPIDS / LIMIT\tDISK\tNET RX / TX\tCPU-S\tGIB-H\tALIVE\tACTIVE")
	for _, st := range list {
		memLimit, pidsLimit := "-", "-"
		if st.MemoryLimit > 0 {
			memLimit = humanSize(int64(st.MemoryLimit))
		}
		if st.PidsLimit > 0 {
			pidsLimit = strconv.Itoa(st.PidsLimit)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s / %s\t%d / %s\t%s\t%s / %s\t%.2f\t%.4f\t%s\t%s\n",
			shortID(st.ID), cpuTime(st.CPU.D()), humanSize(int64(st.Memory)), memLimit, st.Pids, pidsLimit,
			humanSize(int64(st.Disk)), humanSize(st.NetRxBytes), humanSize(st.NetTxBytes),
			st.Usage.CPUSeconds, st.Usage.MemoryGiBHours,
			seconds(st.Usage.AliveSeconds), seconds(st.Usage.ActiveSeconds))
	}
	return tw.Flush()
}

// cpuTime formats CPU time: "0.25s", "12.50s", "3m12s", "2h5m0s".
func cpuTime(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}

// seconds formats a number of seconds as a duration: "45s", "1h2m3s".
func seconds(s float64) string {
	if s < 0 {
		s = 0
	}
	return time.Duration(s * float64(time.Second)).Round(time.Second).String()
}
