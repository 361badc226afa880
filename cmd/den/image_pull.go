package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/den-dev/den/api"
)

var verbImagePull = &verb{
	name:     "image pull",
	summary:  "pull an image from a registry",
	synopsis: "[flags] REF",
	details: `REF is like docker.io/library/alpine:3.20, alpine or ghcr.io/owner/app:1 (a
bare name is on Docker Hub; the tag defaults to latest). The daemon fetches
the image, so credentials are the ones given here, else the daemon host's
~/.docker/config.json, else none. Layers already present are not fetched
again. Progress goes to standard error (a bar on a terminal, periodic lines
otherwise); the image's name is printed on standard output.`,
	example: `den image pull alpine:3.20
		echo "$TOKEN" | den image pull -u me --password-stdin --name app ghcr.io/me/app:1`,
	run: cmdImagePull,
}

func cmdImagePull(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	name := f.String("name", "", "NAME", "store the image under this name instead of REF")
	user := f.String("username", "u", "USER", "registry user name")
	passStdin := f.Bool("password-stdin", "", "read the registry password (or token) from standard input")
	insecure := f.Bool("insecure", "", "allow a registry on plain HTTP")
	platform := f.String("platform", "", "OS/ARCH", "the platform to pull from a multi-platform image (default linux/<the daemon's architecture>)")
	quiet := f.Bool("quiet", "q", "print no progress")
	jsonOut := f.jsonFlag("print the image as JSON")
	pos, err := c.exactly(f, v, args, 1, "image pull needs exactly one image reference (REF)")
	if err != nil {
		return err
	}
	req := api.PullRequest{Ref: pos[0], Name: *name, Username: *user, Insecure: *insecure, Platform: *platform}
	if *passStdin {
		if *user == "" {
			return usagef(v, "--password-stdin needs a user name (-u USER)")
		}
		if req.Password, err = readPassword(c.stdin); err != nil {
			return err
		}
	}
	var report func(done, total int64, what string)
	p := &progress{w: c.stderr, tty: isTerminal(c.stderr), label: "pull"}
	if !*quiet {
		report = p.update
	}
	img, err := c.client(f).PullImage(context.Background(), req, report)
	p.finish()
	if err != nil {
		return err
	}
	return c.printResult(*jsonOut, img, img.Name)
}

// readPassword reads a password from r: its first line, without the line
// ending.
func readPassword(r io.Reader) (string, error) {
	line, err := bufio.NewReader(io.LimitReader(r, 64<<10)).ReadString('\n')
	if err != nil && err != io.EOF {
		return "", fmt.Errorf("read the password from standard input: %w", err)
	}
	pw := strings.TrimRight(line, "\r\n")
	if pw == "" {
		return "", fmt.Errorf("--password-stdin: standard input holds no password")
	}
	return pw, nil
}
