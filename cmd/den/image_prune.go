package main

import (
	"context"
	"fmt"
)

var verbImagePrune = &verb{
	name:     "image prune",
	summary:  "remove the unused build cache and unused layers",
	synopsis: "[flags]",
	details: `Removes the build cache (the images of cached build steps) that no sandbox
uses, then every layer no image uses. Named images are kept. Prints the cache
images removed and the number of layers.`,
	example: "den image prune",
	run:     cmdImagePrune,
}

func cmdImagePrune(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag(`print {"images": [...], "layers": N}`)
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef(v, "image prune takes no arguments (got %q)", pos[0])
	}
	images, layers, err := c.client(f).PruneImages(context.Background())
	if err != nil {
		return err
	}
	if images == nil {
		images = []string{}
	}
	if *jsonOut {
		return c.printJSON(map[string]any{"images": images, "layers": layers})
	}
	for _, name := range images {
		fmt.Fprintf(c.stdout, "deleted %s\n", name)
	}
	fmt.Fprintf(c.stdout, "removed %d unused layer%s\n", layers, plural(layers))
	return nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
