package main

import (
	"context"

	"github.com/den-dev/den/api"
)

var verbCommit = &verb{
	name:     "commit",
	summary:  "make an image of a sandbox's files",
	synopsis: "[flags] ID NAME",
	details: `The sandbox's changes become a layer on top of its image; the new image
keeps the image's configuration with the sandbox's environment, working
directory and user. The sandbox may be running. Prints the image's name.`,
	example: `den commit web web-snapshot:1
		den run --image web-snapshot:1 -- ls /work`,
	run: cmdCommit,
}

func cmdCommit(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag("print the image as JSON")
	pos, err := c.exactly(f, v, args, 2, "commit needs a sandbox ID and a NAME for the image")
	if err != nil {
		return err
	}
	img, err := c.client(f).Commit(context.Background(), pos[0], api.CommitRequest{Name: pos[1]})
	if err != nil {
		return err
	}
	return c.printResult(*jsonOut, img, img.Name)
}
