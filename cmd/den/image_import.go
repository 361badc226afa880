package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

var verbImageImport = &verb{
	name:     "image import",
	summary:  "import images from an OCI archive or a `docker save` tarball",
	synopsis: "[flags] FILE",
	details: `FILE - reads the archive from standard input. Progress goes to standard error
(a bar on a terminal, periodic lines otherwise); the names of the imported
images are printed on standard output.`,
	example: `den image import --name alpine:3.20 alpine.tar
		docker save python:3.12 | den image import -`,
	run: cmdImageImport,
}

func cmdImageImport(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	name := f.String("name", "", "NAME", "name the image (for an archive that holds one)")
	quiet := f.Bool("quiet", "q", "print no progress")
	jsonOut := f.jsonFlag("print the imported images as a JSON array")
	pos, err := c.exactly(f, v, args, 1, "image import needs exactly one FILE (- for standard input)")
	if err != nil {
		return err
	}
	var r io.Reader = c.stdin
	if pos[0] != "-" {
		file, err := os.Open(pos[0])
		if err != nil {
			return err
		}
		defer file.Close()
		r = file
	}
	var report func(done, total int64, what string)
	p := &progress{w: c.stderr, tty: isTerminal(c.stderr)}
	if !*quiet {
		report = p.update
	}
	imgs, err := c.client(f).ImportImage(context.Background(), *name, r, report)
	p.finish()
	if err != nil {
		return err
	}
	if *jsonOut {
		return printJSONList(c, imgs)
	}
	for _, img := range imgs {
		fmt.Fprintln(c.stdout, img.Name)
	}
	return nil
}

// progress shows import or pull progress: a redrawn bar on a terminal,
// otherwise a line when the step changes, when it completes, or every few
// seconds.
type progress struct {
	w        io.Writer
	tty      bool
	label    string // what the lines start with; "import" when empty
	drawn    bool
	last     time.Time
	lastWhat string
	lastDone bool
}

const progressEvery = 2 * time.Second

func (p *progress) update(done, total int64, what string) {
	complete := total > 0 && done >= total
	text := humanSize(done)
	if total > 0 {
		text = fmt.Sprintf("%s / %s (%d%%)", humanSize(done), humanSize(total), done*100/total)
	}
	if p.tty {
		bar := ""
		if total > 0 {
			const width = 30
			n := int(done * width / total)
			n = min(max(n, 0), width)
			bar = "[" + strings.Repeat("=", n)
			if n < width {
				bar += ">" + strings.Repeat(" ", width-n-1)
			}
			bar += "] "
		}
		fmt.Fprintf(p.w, "\r\x1b[K%s %s%s", what, bar, text)
		p.drawn = true
		return
	}
	now := time.Now()
	same := what == p.lastWhat
	if same && (p.lastDone || (!complete && now.Sub(p.last) < progressEvery)) {
		return
	}
	p.last, p.lastWhat, p.lastDone = now, what, complete
	label := p.label
	if label == "" {
		label = "import"
	}
	fmt.Fprintf(p.w, "%s: %s: %s\n", label, what, text)
}

func (p *progress) finish() {
	if p.tty && p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}
