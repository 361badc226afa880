package main

import (
	"context"

	"github.com/den-dev/den/client"
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
	return c.eachArg(v, args, "image rm needs at least one image name", func(cl *client.Client, name string) error {
		return cl.RemoveImage(context.Background(), name)
	})
}
