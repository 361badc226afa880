package main

import (
	"fmt"
)

var verbWait = &verb{
	name:     "wait",
	summary:  "wait for a background process to end",
	synopsis: "[flags] ID PROC",
	details: `Blocks until the process ends, prints its exit code and exits with it
(128+N when killed by signal N, 124 on timeout, 137 when out of memory).
Ctrl-C stops waiting; the process keeps running.`,
	example: `den wait web p1
		den wait --json web p1`,
	run: cmdWait,
}

func cmdWait(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag("print the exit status as JSON")
	id, proc, err := c.procArgs(f, v, args)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	st, err := c.client(f).Wait(ctx, id, proc)
	if err != nil {
		return c.detached(ctx, proc, err)
	}
	if *jsonOut {
		if err := c.printJSON(st); err != nil {
			return err
		}
		return c.statusExit(st, 0, true)
	}
	code, why := exitCode(st, 0)
	fmt.Fprintln(c.stdout, code)
	if why != "" {
		fmt.Fprintf(c.stderr, "den: %s\n", why)
	}
	if code != 0 {
		return exitError(code)
	}
	return nil
}
