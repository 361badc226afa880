package main

import (
	"context"
	"strings"
)

var verbKill = &verb{
	name:     "kill",
	summary:  "send a signal to background processes",
	synopsis: "[flags] ID PROC...",
	details: `The signal goes to each process's whole tree: its process group and the
descendants that left it (setsid) or outlived it (see DESCENDANTS in den ps);
for a process that has exited, to what it left running. SIGNAL is a name
with or without SIG (TERM, SIGINT) or a number; the default is KILL. den
prints each PROC it signalled. A signal never ends a service's restart
policy (den exec -d --restart): a service it ends runs again; den stop
or den rm of the sandbox end its services.`,
	example: `den kill web p1
		den kill -s TERM web p1 p2`,
	run: cmdKill,
}

func cmdKill(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	signal := f.String("signal", "s", "SIGNAL", "the signal to send, like TERM, SIGINT or 9 (default KILL)")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usagef(v, "kill needs a sandbox ID and a process id or --name (PROC), like: den kill web p1")
	}
	sig := strings.TrimSpace(*signal)
	if f.isSet("signal") && sig == "" {
		return usagef(v, "bad value %q for --signal: want a signal name or number", *signal)
	}
	if sig == "" {
		sig = "KILL"
	}
	cl := c.client(f)
	return each(c, v, pos[1:], false, func(proc string) error {
		return cl.Kill(context.Background(), pos[0], proc, sig)
	})
}
