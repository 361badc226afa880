package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/den-dev/den/api"
)

var verbImageLs = &verb{
	name:     "image ls",
	summary:  "list images",
	synopsis: "[flags]",
	example:  "den image ls",
	run:      cmdImageLs,
}

func cmdImageLs(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	quiet := f.Bool("quiet", "q", "print only names")
	jsonOut := f.jsonFlag("print the images as a JSON array")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef(v, "image ls takes no arguments (got %q)", pos[0])
	}
	list, err := c.client(f).Images(context.Background())
	if err != nil {
		return err
	}
	sort.SliceStable(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	now := time.Now()
	return printList(c, list, *jsonOut, *quiet, func(img *api.Image) string { return img.Name },
		"NAME\tID\tSIZE\tCREATED",
		func(img *api.Image) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s\n", img.Name, shortID(img.ID), humanSize(img.Size), ago(img.CreatedAt, now))
		})
}
