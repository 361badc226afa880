package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/build"
	"github.com/den-dev/den/internal/tarball"
)

var verbImageBuild = &verb{
	name:     "image build",
	summary:  "build an image from a Dockerfile",
	synopsis: "[flags] -t NAME DIR",
	details: `DIR is the build context: its files, less those its .dockerignore excludes,
are sent to the daemon, which runs every RUN in a den sandbox and caches each
step (a rebuild with nothing changed is all cache). The Dockerfile is
DIR/Dockerfile unless -f names another (relative to the current directory,
like docker). DIR - reads the context as a tar from standard input; -f is then
a path inside it. FROM names an image
of the daemon (den image pull it first) or "host". The build output goes to
standard output, then the image's name and id. A failed step exits 1 with
the daemon's message, which names the Dockerfile line.

RUN steps have no network unless asked, as with docker build --network none:
--network allow lets them reach only the --allow domains and --allow-cidr
ranges (through den's egress proxy and DNS, as a sandbox of den create
--allow does), --network open any public address. --allow or --allow-cidr
alone implies --network allow. COPY, ADD and WORKDIR never have network. A
RUN that fails a name lookup without network says so and names the flag
that grants it; one refused by --network allow names what was refused.
A step's cache key takes the network mode (as BuildKit's does), not the
allow lists.

--debian SUITE (and no DIR) makes a minimal Debian image instead, with
mmdebstrap on the daemon's host from its Debian mirror.`,
	example: `den image build -t app .
		den image build -f docker/Dockerfile.dev -t app:dev --build-arg GO_VERSION=1.26 .
		den image build --network allow --allow deb.debian.org --allow '*.pypi.org' -t app .
		den image build --debian bookworm -t debian:bookworm`,
	run: cmdImageBuild,
}

func cmdImageBuild(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	tag := f.String("tag", "t", "NAME", "name of the image built (required)")
	file := f.String("file", "f", "FILE", "the Dockerfile (default DIR/Dockerfile)")
	var buildArgs []string
	f.Var(listValue{&buildArgs, checkEnv}, "build-arg", "", "K=V", "set a build argument (repeatable; K alone passes den's own $K)")
	noCache := f.Bool("no-cache", "", "run every step again instead of using the step cache")
	var timeout api.Duration
	f.Var(durationValue{&timeout}, "timeout", "", "DURATION", "give up the build after this long, like 30m (default: the daemon's)")
	no := netOpts{modeFlag: "--network", fixed: true}
	f.Var(modeValue{&no.mode}, "network", "", "MODE", "RUN steps' network: none (the default), allow (only the --allow domains and --allow-cidr ranges) or open (any public address)")
	f.Var(listValue{&no.allow, checkDomain}, "allow", "", "DOMAIN", "let RUN steps reach a domain: example.com, or *.example.com for its subdomains (repeatable; implies --network allow)")
	f.Var(listValue{&no.allowCIDR, checkCIDR}, "allow-cidr", "", "CIDR", "let RUN steps reach an address range like 203.0.113.0/24, or an address (repeatable; implies --network allow)")
	debian := f.String("debian", "", "SUITE", "make a minimal Debian image of SUITE (like bookworm) instead; no DIR")
	quiet := f.Bool("quiet", "q", "print no build output, only the image's name")
	jsonOut := f.jsonFlag("print the image as JSON (the build output goes to standard error)")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if *tag == "" {
		return usagef(v, "image build needs a name for the image (-t NAME)")
	}
	pol, err := no.policy(v, c.stderr)
	if err != nil {
		return err
	}
	opts := client.BuildOptions{Tag: *tag, BuildArgs: labelMap(buildArgs), NoCache: *noCache, Timeout: timeout.D(), Debian: *debian}
	if pol != nil {
		opts.Network, opts.Allow, opts.AllowCIDR = pol.Mode, pol.Allow, pol.AllowCIDR
	}
	var out io.Writer = c.stdout
	switch {
	case *quiet:
		out = nil
	case *jsonOut:
		out = c.stderr
	}
	cl := c.client(f)
	ctx := context.Background()
	var img *api.Image
	switch {
	case *debian != "":
		if len(pos) != 0 {
			return usagef(v, "image build --debian takes no DIR")
		}
		if *file != "" || len(buildArgs) > 0 || pol != nil {
			return usagef(v, "image build --debian takes no Dockerfile (-f), --build-arg or --network")
		}
		img, err = cl.BuildImage(ctx, nil, opts, out)
	case len(pos) != 1:
		return usagef(v, "image build needs exactly one DIR, the build context (or --debian SUITE)")
	case pos[0] == "-":
		opts.Dockerfile = *file
		img, err = cl.BuildImage(ctx, c.stdin, opts, out)
	default:
		img, err = buildDir(ctx, cl, pos[0], *file, opts, out)
	}
	if err != nil {
		return err
	}
	switch {
	case *jsonOut:
		return c.printJSON(img)
	case *quiet:
		fmt.Fprintln(c.stdout, img.Name)
	default:
		fmt.Fprintf(c.stdout, "%s %s\n", img.Name, img.ID)
	}
	return nil
}

// buildDir sends the build context dir and builds it.
func buildDir(ctx context.Context, cl *client.Client, dir, file string, opts client.BuildOptions, out io.Writer) (*api.Image, error) {
	bc, err := newBuildContext(dir, file)
	if err != nil {
		return nil, err
	}
	if bc.dockerfile != "Dockerfile" {
		opts.Dockerfile = bc.dockerfile
	}
	pr, pw := io.Pipe()
	tarErr := make(chan error, 1)
	go func() {
		err := bc.write(pw)
		pw.CloseWithError(err)
		tarErr <- err
	}()
	img, err := cl.BuildImage(ctx, pr, opts, out)
	pr.CloseWithError(errBuildEnded) // unblocks the writer if the daemon stopped reading
	if terr := <-tarErr; terr != nil && !errors.Is(terr, errBuildEnded) {
		return nil, fmt.Errorf("build context %s: %w", dir, terr)
	}
	return img, err
}

var errBuildEnded = errors.New("the build ended")

// buildContext is a local directory to send as a build context.
type buildContext struct {
	dir        string // absolute
	dockerfile string // the Dockerfile's path in the context (slashes)
	outside    string // a Dockerfile outside dir, sent under the name dockerfile
}

// newBuildContext checks dir and finds the Dockerfile: file, relative to
// the current directory, or dir/Dockerfile. A Dockerfile outside dir is
// sent under a random name that the context's .dockerignore then excludes,
// as docker does.
func newBuildContext(dir, file string) (*buildContext, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("build context: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("build context %s is not a directory", dir)
	}
	bc := &buildContext{dir: abs}
	if file == "" {
		if fi, err := os.Stat(filepath.Join(abs, "Dockerfile")); err != nil || fi.IsDir() {
			return nil, fmt.Errorf("no Dockerfile in %s (name another with -f)", dir)
		}
		bc.dockerfile = "Dockerfile"
		return bc, nil
	}
	df, err := filepath.Abs(file)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(df); err != nil {
		return nil, fmt.Errorf("cannot read the Dockerfile: %w", err)
	} else if fi.IsDir() {
		return nil, fmt.Errorf("the Dockerfile %s is a directory", file)
	}
	if rel, err := filepath.Rel(abs, df); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		bc.dockerfile = filepath.ToSlash(rel)
		return bc, nil
	}
	var b [10]byte
	rand.Read(b[:])
	bc.dockerfile = ".dockerfile." + hex.EncodeToString(b[:])
	bc.outside = df
	return bc, nil
}

// write writes the context as a tar: what .dockerignore leaves of it (the
// entries a COPY . would take, as package build decides), plus the
// Dockerfile and .dockerignore, which the daemon reads even when they are
// excluded.
func (bc *buildContext) write(w io.Writer) error {
	entries, err := build.Sources(bc.dir, &build.Instruction{Cmd: "COPY", Args: []string{".", "/"}})
	if err != nil {
		var be *build.Error
		if !errors.As(err, &be) {
			return err
		}
		if !strings.Contains(be.Msg, "match no files") {
			return errors.New(strings.TrimPrefix(be.Msg, "COPY "))
		}
		entries = nil // .dockerignore excludes everything
	}
	root, err := os.OpenRoot(bc.dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tw := tarball.NewWriter(w)
	sent := map[string]bool{".": true}
	for _, e := range entries {
		if sent[e] || (bc.outside != "" && e == ".dockerignore") {
			continue
		}
		sent[e] = true
		if err := addEntry(tw, root, e); err != nil {
			return err
		}
	}
	if bc.outside == "" {
		if !sent[bc.dockerfile] {
			if err := addEntry(tw, root, bc.dockerfile); err != nil {
				return err
			}
		}
		if _, err := root.Lstat(".dockerignore"); err == nil && !sent[".dockerignore"] {
			if err := addEntry(tw, root, ".dockerignore"); err != nil {
				return err
			}
		}
		return tw.Close()
	}
	df, err := os.ReadFile(bc.outside)
	if err != nil {
		return err
	}
	if err := tw.AddBytes(bc.dockerfile, df); err != nil {
		return err
	}
	ignore, err := root.ReadFile(".dockerignore")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if errors.Is(err, fs.ErrNotExist) {
		ignore = []byte(".dockerignore\n")
	}
	ignore = append(ignore, "\n/"+bc.dockerfile+"\n"...)
	if err := tw.AddBytes(".dockerignore", ignore); err != nil {
		return err
	}
	return tw.Close()
}

// addEntry writes the file, directory or symlink rel of root to tw.
func addEntry(tw *tarball.Writer, root *os.Root, rel string) error {
	info, err := root.Lstat(rel)
	if err != nil {
		return err
	}
	target := ""
	if info.Mode()&fs.ModeSymlink != 0 {
		if target, err = root.Readlink(rel); err != nil {
			return err
		}
	}
	err = tw.Add(path.Clean(rel), info, target, func() (io.ReadCloser, error) { return root.Open(rel) })
	if errors.Is(err, tarball.ErrSkipped) {
		return nil
	}
	return err
}
