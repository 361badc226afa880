package main

import (
	"context"
	"fmt"
)

var verbImageRm = &verb{
	name:     "image rm",
	summary:  "remove images",
	synopsis: "[flags] NAME...",
	details:  "An image used by a sandbox cannot be removed.",
	example:  "den image rm alpine:3.20",
	run:      cmdImageRm,
}

func cmdImageRm(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	names, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return usagef(v, "image rm needs at least one image name")
	}
	cl := c.client(f)
	failed := false
	for _, name := range names {
		if err := cl.RemoveImage(context.Background(), name); err != nil {
			c.report(v, err)
			failed = true
			continue
		}
		fmt.Fprintln(c.stdout, name)
	}
	if failed {
		return exitError(1)
	}
	return nil
}
