package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/den-dev/den/api"
)

var verbPs = &verb{
	name:     "ps",
	summary:  "list a sandbox's background processes",
	synopsis: "[flags] ID",
	details: `Lists the processes started with den exec -d, running and recently finished,
oldest first. EXIT is the exit code, or the signal, timeout, oom or failed.
NAME is the name given with den exec -d --name; RESTARTS, for a service
(den exec -d --restart), how often it was started again, and its policy.
DESCENDANTS are the pids of the live processes it started, also those that
called setsid or outlived it (a daemon left by a finished exec): den kill
ends them with it.

A paused or hibernated sandbox is left asleep: den ps lists the processes
it had when it went to sleep, those running then in STATE paused or
hibernated (den resume ID, or any exec, wakes it).`,
	example: `den ps web
		den ps --json web`,
	run: cmdPs,
}

func cmdPs(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	quiet := f.Bool("quiet", "q", "print only process ids")
	jsonOut := f.jsonFlag("print the processes as a JSON array")
	pos, err := c.exactly(f, v, args, 1, "ps needs one sandbox ID")
	if err != nil {
		return err
	}
	list, err := c.client(f).Processes(context.Background(), pos[0])
	if err != nil {
		return err
	}
	sort.SliceStable(list, func(i, j int) bool { return list[i].Started.Before(list[j].Started) })
	now := time.Now()
	return printList(c, list, *jsonOut, *quiet, func(p *api.ProcessInfo) string { return p.ID },
		"PROC\tNAME\tPID\tSTATE\tEXIT\tRESTARTS\tSTARTED\tENDED\tDESCENDANTS\tCOMMAND",
		func(p *api.ProcessInfo) string {
			restarts := ""
			if p.Restart != "" {
				restarts = fmt.Sprintf("%d (%s)", p.Restarts, p.Restart)
			}
			return fmt.Sprintf("%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.ID, p.Name, p.Pid, p.State, exitText(p.Exit),
				restarts, ago(p.Started, now), ago(p.Ended, now), pidList(p.Descendants), benchQuote(p.Cmd))
		})
}

// exitText is how a process ended, for the EXIT column: the exit code, the
// signal that killed it, or the reason; "" while it runs.
func exitText(st *api.ExitStatus) string {
	if st == nil {
		return ""
	}
	switch st.Reason {
	case api.ReasonExited, "":
		return strconv.Itoa(st.ExitCode)
	case api.ReasonSignaled:
		name, _ := signalName(st.Signal)
		return name
	}
	return st.Reason
}

// maxListedPids bounds the DESCENDANTS column; den ps --json has them all.
const maxListedPids = 4

// pidList is the DESCENDANTS column: the first pids and how many more.
func pidList(pids []int) string {
	var b strings.Builder
	for i, pid := range pids {
		if i == maxListedPids {
			fmt.Fprintf(&b, " +%d", len(pids)-i)
			break
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(pid))
	}
	return b.String()
}
