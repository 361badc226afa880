package main

import (
	"context"
	"fmt"

	"github.com/den-dev/den/client"
)

var verbLogs = &verb{
	name:     "logs",
	summary:  "print the output of a background process",
	synopsis: "[flags] ID PROC",
	details: `Prints the output the daemon kept of the process (a bounded buffer: when it
overflowed, a line on stderr says how much was dropped), its stdout to
stdout and its stderr to stderr. With -f den then follows new output until
the process ends and exits with its exit code (128+N when killed by signal
N, 124 on timeout, 137 when out of memory); Ctrl-C stops following and
leaves the process running. Without -f a paused or hibernated sandbox is
left asleep (den logs then says so); with -f it is resumed.`,
	example: `den logs web p1
		den logs -f --tail 20 web p1
		den logs --since 10m web p1`,
	run: cmdLogs,
}

func cmdLogs(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	var opts client.LogsOptions
	f.Var(boolValue{&opts.Follow}, "follow", "f", "", "follow new output until the process ends, then exit with its exit code")
	f.Var(intValue{&opts.Tail}, "tail", "n", "N", "start with only the last N lines (0: only new output)")
	f.Var(sinceValue{&opts.Since}, "since", "", "TIME", "only output since TIME: RFC 3339, a date, or a duration like 10m")
	id, proc, err := c.procArgs(f, v, args)
	if err != nil {
		return err
	}
	if f.isSet("tail") && opts.Tail == 0 {
		opts.Tail = -1 // none of the retained output
	}
	ctx, stop := signalContext()
	defer stop()
	st, err := c.client(f).Logs(ctx, id, proc, opts, c.stdout, c.stderr)
	if err != nil {
		if ctx.Err() != nil {
			return exitError(130) // Ctrl-C while following
		}
		return err
	}
	if !opts.Follow || st == nil {
		return nil
	}
	return c.statusExit(st, 0, false)
}

// procArgs parses the arguments of a process verb with f: ID PROC.
func (c *cli) procArgs(f *flagSet, v *verb, args []string) (id, proc string, err error) {
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return "", "", err
	}
	if len(pos) != 2 {
		return "", "", usagef(v, "%s needs a sandbox ID and a process id or --name (PROC), like: den %s web p1", v.name, v.name)
	}
	return pos[0], pos[1], nil
}

// detached reports the error of a call cut by Ctrl-C as exit code 130,
// saying the process keeps running.
func (c *cli) detached(ctx context.Context, proc string, err error) error {
	if ctx.Err() == nil {
		return err
	}
	fmt.Fprintf(c.stderr, "den: interrupted; process %s keeps running\n", proc)
	return exitError(130)
}
