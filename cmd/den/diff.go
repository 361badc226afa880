package main

import (
	"context"
	"fmt"

	"github.com/den-dev/den/internal/gitws"
)

var verbDiff = &verb{
	name:     "diff",
	summary:  "show the changes in a sandbox's git workspace",
	synopsis: "[flags] ID",
	details: `For a sandbox created with --git: everything that changed in /workspace
since the commit it started from, committed inside or not, as a patch
(git diff --binary: binary files, modes, deletions and symlinks included)
that git apply takes. Untracked files the workspace's .gitignore files
ignore are left out. --stat lists the files and commits instead. The
host's git never reads the sandbox's .git; see docs/git.md.`,
	example: `den diff dev > changes.patch && git apply --index changes.patch
		den diff --stat dev
		den diff --json dev | jq -r .patch | base64 -d`,
	run: cmdDiff,
}

func cmdDiff(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag("print the diff as JSON (the patch base64-encoded)")
	stat := f.Bool("stat", "", "list the commits and changed files instead of the patch")
	pos, err := c.exactly(f, v, args, 1, "diff needs one sandbox ID (created with den create --git)")
	if err != nil {
		return err
	}
	d, err := c.client(f).Diff(context.Background(), pos[0])
	if err != nil {
		return err
	}
	if *jsonOut {
		return c.printJSON(d)
	}
	if !*stat {
		_, err = c.stdout.Write(d.Patch)
		return err
	}
	fmt.Fprintf(c.stdout, "base %s (%s), %d commit%s, %d file%s\n", shortSHA(d.Base), d.Source,
		len(d.Commits), plural(len(d.Commits)), len(d.Files), plural(len(d.Files)))
	for _, cm := range d.Commits {
		fmt.Fprintf(c.stdout, "commit %s %s\n", shortSHA(cm.Commit), cm.Subject)
	}
	for _, fl := range d.Files {
		// Names are quoted only when they need it, as git prints them.
		if fl.OldPath != "" {
			fmt.Fprintf(c.stdout, "%s\t%s -> %s\n", fl.Status, gitws.QuotePath(fl.OldPath), gitws.QuotePath(fl.Path))
			continue
		}
		fmt.Fprintf(c.stdout, "%s\t%s\n", fl.Status, gitws.QuotePath(fl.Path))
	}
	return nil
}

func shortSHA(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}
