package main

import (
	"fmt"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// The verbs that act on several names (den stop web db, den image rm a b)
// share these: each name is tried, each failure reported, and the exit
// status is 1 if any failed.

// each runs op on every item, reporting each failure and, unless quiet,
// printing each item op succeeds for; it fails (exit status 1) if any did.
func each[T any](c *cli, v *verb, items []T, quiet bool, op func(T) error) error {
	failed := false
	for _, x := range items {
		if err := op(x); err != nil {
			c.report(v, err)
			failed = true
			continue
		}
		if !quiet {
			fmt.Fprintln(c.stdout, x)
		}
	}
	if failed {
		return exitError(1)
	}
	return nil
}

// eachArg parses args as one or more names (need is the usage error when
// there are none) and runs op on each, as each does.
func (c *cli) eachArg(v *verb, args []string, need string, op func(cl *client.Client, name string) error) error {
	f := newFlags(v)
	names, err := c.atLeastOne(f, v, args, need)
	if err != nil {
		return err
	}
	cl := c.client(f)
	return each(c, v, names, false, func(n string) error { return op(cl, n) })
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
	ids, err := c.atLeastOne(f, v, args, v.name+" needs at least one sandbox ID")
	if err != nil {
		return err
	}
	cl := c.client(f)
	done := []any{}
	err = each(c, v, ids, *jsonOut, func(id string) error {
		sb, err := op(cl, id)
		switch {
		case err != nil:
		case sb != nil:
			done = append(done, sb)
		default:
			done = append(done, id)
		}
		return err
	})
	if *jsonOut {
		if err := c.printJSON(done); err != nil {
			return err
		}
	}
	return err
}

// eachJSON prints, as one JSON array, what get returns for every argument,
// reporting each failure; it fails if any did. need is the usage error
// when there are no arguments.
func (c *cli) eachJSON(v *verb, args []string, need string, get func(*client.Client, string) (any, error)) error {
	f := newFlags(v)
	f.jsonFlag("print JSON (the default and only format)")
	ids, err := c.atLeastOne(f, v, args, need)
	if err != nil {
		return err
	}
	cl := c.client(f)
	out := []any{}
	err = each(c, v, ids, true, func(id string) error {
		x, err := get(cl, id)
		if err == nil {
			out = append(out, x)
		}
		return err
	})
	if err := c.printJSON(out); err != nil {
		return err
	}
	return err
}

// eachName runs op on every argument, printing each one that succeeds and
// reporting each failure; it fails if any did.
func (c *cli) eachName(v *verb, args []string, op func(*client.Client, string) error) error {
	return c.eachSandbox(v, args, func(cl *client.Client, id string) (*api.Sandbox, error) {
		return nil, op(cl, id)
	})
}
