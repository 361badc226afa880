package main

import (
	"context"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbInspect = &verb{
	name:     "inspect",
	summary:  "print sandboxes as JSON (with their disk use)",
	synopsis: "[flags] ID...",
	details:  "Prints a JSON array with one object a sandbox, like docker inspect.",
	example:  `den inspect web | jq '.[0].state'`,
	run: func(c *cli, v *verb, args []string) error {
		return c.eachJSON(v, args, func(cl *client.Client, id string) (any, error) {
			return cl.Get(context.Background(), id)
		})
	},
}

// eachJSON prints, as one JSON array, what get returns for every argument,
// reporting each failure; it fails if any did.
func (c *cli) eachJSON(v *verb, args []string, get func(*client.Client, string) (any, error)) error {
	f := newFlags(v)
	f.jsonFlag("print JSON (the default and only format)")
	ids, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return usagef(v, "%s needs at least one argument", v.name)
	}
	cl := c.client(f)
	out := []any{}
	failed := false
	for _, id := range ids {
		x, err := get(cl, id)
		if err != nil {
			c.report(v, err)
			failed = true
			continue
		}
		out = append(out, x)
	}
	if err := c.printJSON(out); err != nil {
		return err
	}
	if failed {
		return exitError(1)
	}
	return nil
}

// eachName runs op on every argument, printing each one that succeeds and
// reporting each failure; it fails if any did.
func (c *cli) eachName(v *verb, args []string, op func(*client.Client, string) error) error {
	return c.eachSandbox(v, args, func(cl *client.Client, id string) (*api.Sandbox, error) {
		return nil, op(cl, id)
	})
}
