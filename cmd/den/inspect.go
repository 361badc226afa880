package main

import (
	"context"

	"github.com/den-dev/den/client"
)

var verbInspect = &verb{
	name:     "inspect",
	summary:  "print sandboxes as JSON (with their disk use)",
	synopsis: "[flags] ID...",
	details:  "Prints a JSON array with one object a sandbox, like docker inspect.",
	example:  `den inspect web | jq '.[0].state'`,
	run: func(c *cli, v *verb, args []string) error {
		return c.eachJSON(v, args, "inspect needs at least one argument", func(cl *client.Client, id string) (any, error) {
			return cl.Get(context.Background(), id)
		})
	},
}
