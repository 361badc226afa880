package main

import (
	"context"
	"fmt"
)

var verbEscalate = &verb{
	name:     "escalate",
	summary:  "move a sandbox to a stronger isolation tier (gvisor or microvm), keeping its id, files, network policy and ports",
	synopsis: "[flags] ID --runtime gvisor|microvm",
	details: `Tiers from weakest to strongest: linux < gvisor < microvm. The sandbox's
processes end (no tier can carry another's); if it was running it starts
again on the new tier with its services. den info lists the tiers this
host can run.`,
	example: "den escalate web --runtime gvisor\nden escalate web --runtime microvm --json",
	run:     cmdEscalate,
}

func cmdEscalate(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	var runtime string
	f.Var(stringValue{&runtime}, "runtime", "", "TIER", "the tier to move to: gvisor or microvm")
	jsonOut := f.jsonFlag("print the sandbox as JSON")
	pos, err := c.exactly(f, v, args, 1, "name one sandbox")
	if err != nil {
		return err
	}
	if runtime == "" {
		return usagef(v, "--runtime is required: gvisor or microvm (see den info)")
	}
	sb, err := c.client(f).Escalate(context.Background(), pos[0], runtime)
	if err != nil {
		return err
	}
	if *jsonOut {
		return c.printJSON(sb)
	}
	fmt.Fprintf(c.stdout, "%s: now on %s (%s)\n", sb.ID[:12], sb.Runtime, sb.State)
	return nil
}
