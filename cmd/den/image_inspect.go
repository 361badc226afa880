package main

import (
	"context"
)

var verbImageInspect = &verb{
	name:     "image inspect",
	summary:  "print images as JSON",
	synopsis: "[flags] NAME...",
	details:  "Prints a JSON array with one object an image, like docker image inspect.",
	example:  `den image inspect alpine:3.20 | jq '.[0].config'`,
	run:      cmdImageInspect,
}

func cmdImageInspect(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	f.jsonFlag("print JSON (the default and only format)")
	names, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return usagef(v, "image inspect needs at least one image name")
	}
	cl := c.client(f)
	out := []any{}
	failed := false
	for _, name := range names {
		img, err := cl.Image(context.Background(), name)
		if err != nil {
			c.report(v, err)
			failed = true
			continue
		}
		out = append(out, img)
	}
	if err := c.printJSON(out); err != nil {
		return err
	}
	if failed {
		return exitError(1)
	}
	return nil
}
