package main

import (
	"context"
)

var verbInspect = &verb{
	name:     "inspect",
	summary:  "print sandboxes as JSON",
	synopsis: "[flags] ID...",
	details:  "Prints a JSON array with one object a sandbox, like docker inspect.",
	example:  `den inspect web | jq '.[0].state'`,
	run:      cmdInspect,
}

func cmdInspect(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	f.jsonFlag("print JSON (the default and only format)")
	ids, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return usagef(v, "inspect needs at least one sandbox ID")
	}
	cl := c.client(f)
	out := []any{}
	failed := false
	for _, id := range ids {
		sb, err := cl.Get(context.Background(), id)
		if err != nil {
			c.report(v, err)
			failed = true
			continue
		}
		out = append(out, sb)
	}
	if err := c.printJSON(out); err != nil {
		return err
	}
	if failed {
		return exitError(1)
	}
	return nil
}
