package main

import (
	"context"

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
