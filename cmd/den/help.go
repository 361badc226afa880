package main

import (
	"fmt"
	"io"
	"strings"
)

var verbHelp = &verb{
	name:     "help",
	summary:  "show the commands, or the help of one",
	synopsis: "[COMMAND [SUB-COMMAND]]",
	example: `den help run
		den help image import`,
	run: cmdHelp,
}

// printVerbs prints the list of commands.
func printVerbs(w io.Writer) {
	fmt.Fprintf(w, "den - sandboxes for coding agents\n\nUsage:\n  den [--host HOST] COMMAND [flags] [ARG...]\n\nCommands:\n")
	tw := newTable(w)
	for _, v := range verbs {
		if strings.Contains(v.name, " ") {
			continue
		}
		fmt.Fprintf(tw, "  %s\t%s\n", v.name, v.summary)
	}
	tw.Flush()
	fmt.Fprintf(w, `
Every command takes --host HOST (default $DEN_HOST or %s);
over TCP the token comes from $DEN_TOKEN. Run 'den help COMMAND' or
'den COMMAND -h' for a command's flags.

Example:
  den run --rm -- python3 -c 'print(6*7)'
`, defaultHostText)
}

func cmdHelp(c *cli, v *verb, args []string) error {
	if len(args) == 0 {
		printVerbs(c.stdout)
		return nil
	}
	if args[0] == "-h" || args[0] == "--help" {
		newFlags(v).usage(c.stdout)
		return nil
	}
	if args[0] == "serve" {
		return cmdServe([]string{"-h"})
	}
	name := strings.Join(args, " ")
	target := findVerb(name)
	if target == nil {
		return usagef(v, "unknown command %q", name)
	}
	if target.group {
		printGroup(c.stdout, target)
		return nil
	}
	return target.run(c, target, []string{"-h"})
}
