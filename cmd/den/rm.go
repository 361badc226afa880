package main

import (
	"context"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbRm = &verb{
	name:     "rm",
	summary:  "remove sandboxes and their files",
	synopsis: "[flags] ID...",
	details:  "A running sandbox is removed only with -f; print the IDs with `den ls -q`.",
	example: `den rm -f web
		den rm -f $(den ls -q --label task=42)`,
	run: cmdRm,
}

func cmdRm(c *cli, v *verb, args []string) error {
	var force *bool
	return c.eachSandbox(v, args, func(cl *client.Client, id string) (*api.Sandbox, error) {
		return nil, cl.Remove(context.Background(), id, *force)
	}, func(f *flagSet) {
		force = f.Bool("force", "f", "remove running sandboxes too (their processes are killed)")
	})
}
