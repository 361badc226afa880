package main

import (
	"context"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbStart = &verb{
	name:     "start",
	summary:  "start stopped sandboxes",
	synopsis: "[flags] ID...",
	example:  "den start web",
	run:      cmdStart,
}

func cmdStart(c *cli, v *verb, args []string) error {
	return c.eachSandbox(v, args, func(cl *client.Client, id string) (*api.Sandbox, error) {
		return cl.Start(context.Background(), id)
	})
}
