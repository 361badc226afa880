package main

import (
	"context"
	"fmt"

	"github.com/den-dev/den/api"
)

var verbExport = &verb{
	name:     "export",
	summary:  "write a sandbox's git changes to a branch of the host repository",
	synopsis: "[flags] ID --branch NAME",
	details: `For a sandbox created with --git PATH (a repository on the daemon's host):
the commits made inside, then the uncommitted changes as one more commit,
become branch NAME of that repository. Its working tree and index are not
touched. An existing branch is only moved forward (the changes must descend
from it) unless --force; the branch checked out there is refused. Only the
daemon's administrator may export. See docs/git.md.`,
	example: `den export dev --branch agent/fix-tests
		den export dev --branch agent/fix-tests --message 'work in progress'
		git -C ~/src/app log agent/fix-tests`,
	run: cmdExport,
}

func cmdExport(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	branch := f.String("branch", "b", "NAME", "branch of the host repository to write")
	message := f.String("message", "m", "TEXT", "message of the commit holding the uncommitted changes")
	force := f.Bool("force", "f", "move an existing branch even when the changes do not descend from it")
	jsonOut := f.jsonFlag("print the result as JSON")
	pos, err := c.exactly(f, v, args, 1, "export needs one sandbox ID (created with den create --git PATH)")
	if err != nil {
		return err
	}
	if *branch == "" {
		return usagef(v, "export needs --branch NAME: the branch of the host repository to write")
	}
	res, err := c.client(f).Export(context.Background(), pos[0], api.ExportRequest{Branch: *branch, Message: *message, Force: *force})
	if err != nil {
		return err
	}
	if *jsonOut {
		return c.printJSON(res)
	}
	verb := "created"
	if res.Previous != "" {
		verb = "moved from " + shortSHA(res.Previous)
	}
	fmt.Fprintf(c.stdout, "%s %s at %s (%d commit%s on %s), %s\n", res.Repository, res.Branch, shortSHA(res.Commit), res.Commits, plural(res.Commits), shortSHA(res.Base), verb)
	return nil
}
