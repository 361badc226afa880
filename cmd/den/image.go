package main

import (
	"fmt"
	"io"
	"strings"
)

var verbImage = &verb{
	name:     "image",
	summary:  "manage images: ls, pull, build, import, save, rm, inspect, prune",
	synopsis: "COMMAND [flags] [ARG...]",
	example: `den image pull alpine:3.20
		den image build -t app .
		den image import --name alpine:3.20 alpine.tar
		den image ls`,
	run:   cmdImage,
	group: true,
}

func cmdImage(c *cli, v *verb, args []string) error { return cmdGroup(c, v, args) }

// cmdGroup runs a sub-command of the group v ("image", "net"): the verb
// named "GROUP SUB".
func cmdGroup(c *cli, v *verb, args []string) error {
	// --host may come before the sub-command.
	var pre []string
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		a := args[0]
		switch {
		case a == "-h" || a == "--help" || a == "-help":
			printGroup(c.stdout, v)
			return nil
		case a == "--host" || a == "-H" || a == "-host":
			if len(args) < 2 {
				return usagef(v, "flag --host needs a value (HOST)")
			}
			pre, args = append(pre, args[:2]...), args[2:]
		case strings.HasPrefix(a, "--host="):
			pre, args = append(pre, a), args[1:]
		default:
			return usagef(v, "unknown flag %s (flags go after the %s sub-command)", a, v.name)
		}
	}
	if len(args) == 0 {
		printGroup(c.stdout, v)
		return nil
	}
	sub := findVerb(v.name + " " + args[0])
	if sub == nil {
		return usagef(v, "unknown %s command %q", v.name, args[0])
	}
	return sub.run(c, sub, append(pre, args[1:]...))
}

// printGroup lists a group's sub-commands.
func printGroup(w io.Writer, v *verb) {
	fmt.Fprintf(w, "den %s - %s\n\nUsage:\n  den %s %s\n\nCommands:\n", v.name, v.summary, v.name, v.synopsis)
	tw := newTable(w)
	for _, s := range verbs {
		if name, ok := strings.CutPrefix(s.name, v.name+" "); ok {
			fmt.Fprintf(tw, "  %s\t%s\n", name, s.summary)
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "\nRun 'den %s COMMAND -h' for a command's flags.\n\nExample:\n", v.name)
	for _, line := range strings.Split(strings.TrimSpace(v.example), "\n") {
		fmt.Fprintf(w, "  %s\n", strings.TrimSpace(line))
	}
}
