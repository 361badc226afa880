package main

import (
	"context"

	"github.com/den-dev/den/client"
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
	return c.eachJSON(v, args, "image inspect needs at least one image name", func(cl *client.Client, name string) (any, error) {
		return cl.Image(context.Background(), name)
	})
}
