package main

import (
	"context"
	"fmt"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbStop = &verb{
	name:     "stop",
	summary:  "stop sandboxes: kill their processes, keep their files",
	synopsis: "[flags] ID...",
	example:  "den stop web",
	run:      cmdStop,
}

func cmdStop(c *cli, v *verb, args []string) error {
	return c.eachSandbox(v, args, func(cl *client.Client, id string) (*api.Sandbox, error) {
		return cl.Stop(context.Background(), id)
	})
}

// eachSandbox runs op on every ID argument, printing each ID that succeeds
// (or, with --json, the sandboxes) and reporting each failure; it fails if
// any did.
func (c *cli) eachSandbox(v *verb, args []string, op func(*client.Client, string) (*api.Sandbox, error), extra ...func(*flagSet)) error {
	f := newFlags(v)
	for _, x := range extra {
		x(f)
	}
	jsonOut := f.jsonFlag("print the sandboxes as a JSON array")
	ids, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return usagef(v, "%s needs at least one sandbox ID", v.name)
	}
	cl := c.client(f)
	var done []any
	failed := false
	for _, id := range ids {
		sb, err := op(cl, id)
		if err != nil {
			c.report(v, err)
			failed = true
			continue
		}
		if *jsonOut {
			if sb != nil {
				done = append(done, sb)
			} else {
				done = append(done, id)
			}
			continue
		}
		fmt.Fprintln(c.stdout, id)
	}
	if *jsonOut {
		if done == nil {
			done = []any{}
		}
		if err := c.printJSON(done); err != nil {
			return err
		}
	}
	if failed {
		return exitError(1)
	}
	return nil
}
