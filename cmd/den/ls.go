package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/den-dev/den/api"
)

var verbLs = &verb{
	name:     "ls",
	summary:  "list sandboxes",
	synopsis: "[flags]",
	example: `den ls
		den ls --label task=42 -q`,
	run: cmdLs,
}

func cmdLs(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	var labels []string
	f.Var(listValue{&labels, checkLabel}, "label", "l", "K=V", "only sandboxes with this label (repeatable; all must match)")
	quiet := f.Bool("quiet", "q", "print only ids")
	jsonOut := f.jsonFlag("print the sandboxes as a JSON array")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef(v, "ls takes no arguments (got %q)", pos[0])
	}
	list, err := c.client(f).List(context.Background(), labelMap(labels))
	if err != nil {
		return err
	}
	sort.SliceStable(list, func(i, j int) bool { return list[i].CreatedAt.After(list[j].CreatedAt) })
	now := time.Now()
	return printList(c, list, *jsonOut, *quiet, func(sb *api.Sandbox) string { return sb.ID },
		"ID\tNAME\tIMAGE\tSTATE\tNET\tCREATED\tLABELS",
		func(sb *api.Sandbox) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\n", shortID(sb.ID), sb.Name, sb.Image, sb.State, netMode(sb.Network), ago(sb.CreatedAt, now), labelText(sb.Labels))
		})
}
