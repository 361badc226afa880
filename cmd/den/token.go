package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbToken = &verb{
	name:     "token",
	summary:  "manage scoped API tokens: create, ls, rm (admin only)",
	synopsis: "COMMAND [flags] [ARG...]",
	details: `A scoped token lets one agent use den over TCP (DEN_HOST=tcp://HOST:PORT
DEN_TOKEN=den_...) while seeing and controlling only the sandboxes it
creates, with optional bounds on how many sandboxes, volumes, snapshots and
images it may have and caps on its sandboxes' CPUs, memory and disk. Everything of another token's or of the admin's answers
not_found. Tokens are managed with the admin's credentials: the root-only
unix socket, or the daemon's own token (its data dir, file token).`,
	example: `den token create --name agent-1 --max-sandboxes 5 --cpus 1 --memory 1g --disk 5g
		den token ls
		den token rm agent-1`,
	run:   cmdGroup,
	group: true,
}

var verbTokenCreate = &verb{
	name:     "token create",
	summary:  "make a scoped API token and print it (once)",
	synopsis: "[flags] --name NAME",
	details: `Prints the new token's secret, the value for DEN_TOKEN. It is shown this
once: den keeps only its SHA-256 and cannot show it again (make a new token
if it is lost). --name is required and unique. --max-sandboxes bounds the
sandboxes the token may have at once, in any state (0: no bound); creates
and forks beyond it are refused. --max-volumes, --max-snapshots and
--max-images bound its volumes, snapshots and images (imported, built or
committed) the same way. --cpus, --memory and --disk cap every sandbox it
creates; a create without limits gets the caps as its limits. --disk also
caps each volume it creates (and is the size of one created without
--size), and what one snapshot it loads may hold. So what a token can take
of den's storage is bounded by (max-sandboxes + max-volumes) x disk, plus
its snapshots and images.`,
	example: `den token create --name agent-1
		den token create --name ci --max-sandboxes 10 --cpus 2 --memory 4g --json
		den token create --name shared --max-sandboxes 4 --disk 10g --max-volumes 2 --max-snapshots 8 --max-images 4`,
	run: cmdTokenCreate,
}

var verbTokenLs = &verb{
	name:     "token ls",
	summary:  "list the scoped tokens (never their secrets)",
	synopsis: "[flags]",
	example: `den token ls
		den token ls --json`,
	run: cmdTokenLs,
}

var verbTokenRm = &verb{
	name:     "token rm",
	summary:  "revoke tokens",
	synopsis: "[flags] ID|NAME...",
	details: `Revokes each token: its next request is refused, and what it has open
(exec and log streams, terminals, forwards, SSH sessions) ends at once. Its sandboxes are kept;
the admin sees them (den ls shows their owner in --json) and removes them.`,
	example: `den token rm agent-1`,
	run:     cmdTokenRm,
}

func cmdTokenCreate(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	name := f.String("name", "", "NAME", "the token's name (required, unique)")
	var max, maxVol, maxSnap, maxImg string
	f.Var(stringValue{&max}, "max-sandboxes", "", "N", "at most N sandboxes at once (0: no bound)")
	f.Var(stringValue{&maxVol}, "max-volumes", "", "N", "at most N volumes at once (0: no bound)")
	f.Var(stringValue{&maxSnap}, "max-snapshots", "", "N", "at most N snapshots at once (0: no bound)")
	f.Var(stringValue{&maxImg}, "max-images", "", "N", "at most N images it imported, built or committed (0: no bound)")
	var cpus float64
	f.Var(floatValue{&cpus}, "cpus", "", "N", "cap on each sandbox's CPUs, like 1.5")
	var mem, disk api.Size
	f.Var(sizeValue{&mem}, "memory", "", "SIZE", "cap on each sandbox's memory, like 1g")
	f.Var(sizeValue{&disk}, "disk", "", "SIZE", "cap on each sandbox's and volume's disk, like 10g (also their default; needs btrfs storage)")
	jsonOut := f.jsonFlag("print the token (with its secret) as JSON")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef(v, "token create takes no arguments (got %q): name the token with --name", pos[0])
	}
	if *name == "" {
		return usagef(v, "--name is required: den token create --name agent-1")
	}
	req := api.TokenRequest{Name: *name, CPUs: cpus, Memory: mem, Disk: disk}
	for _, b := range []struct {
		flag, v string
		dst     *int
	}{{"max-sandboxes", max, &req.MaxSandboxes}, {"max-volumes", maxVol, &req.MaxVolumes}, {"max-snapshots", maxSnap, &req.MaxSnapshots}, {"max-images", maxImg, &req.MaxImages}} {
		if b.v == "" {
			continue
		}
		n, err := strconv.Atoi(b.v)
		if err != nil || n < 0 {
			return usagef(v, "bad value %q for --%s: want a whole number, 0 or more", b.v, b.flag)
		}
		*b.dst = n
	}
	if cpus < 0 {
		return usagef(v, "bad value for --cpus: %g is negative", cpus)
	}
	t, err := c.client(f).CreateToken(context.Background(), req)
	if err != nil {
		return err
	}
	if *jsonOut {
		return c.printJSON(t)
	}
	fmt.Fprintln(c.stdout, t.Token)
	fmt.Fprintf(c.stderr, "den: token %s (%s): keep it now, den cannot show it again; use it as DEN_TOKEN\n", t.Name, t.ID)
	return nil
}

func cmdTokenLs(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag("print the tokens as a JSON array")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef(v, "token ls takes no arguments (got %q)", pos[0])
	}
	list, err := c.client(f).Tokens(context.Background())
	if err != nil {
		return err
	}
	if list == nil {
		list = []*api.Token{}
	}
	if *jsonOut {
		return c.printJSON(list)
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "ID\tNAME\tSANDBOXES\tMAX\tCPUS\tMEMORY\tDISK\tVOLS/SNAPS/IMAGES\tCREATED")
	now := time.Now()
	bound := func(n int) string {
		if n > 0 {
			return strconv.Itoa(n)
		}
		return "-"
	}
	size := func(n api.Size) string {
		if n > 0 {
			return humanSize(int64(n))
		}
		return "-"
	}
	for _, t := range list {
		cpus := "-"
		if t.CPUs > 0 {
			cpus = strconv.FormatFloat(t.CPUs, 'g', -1, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s/%s/%s\t%s\n", t.ID, t.Name, t.Sandboxes, bound(t.MaxSandboxes), cpus, size(t.Memory), size(t.Disk),
			bound(t.MaxVolumes), bound(t.MaxSnapshots), bound(t.MaxImages), ago(t.CreatedAt, now))
	}
	return tw.Flush()
}

func cmdTokenRm(c *cli, v *verb, args []string) error {
	return c.eachArg(v, args, "token rm needs at least one token ID or NAME (see den token ls)", func(cl *client.Client, n string) error {
		return cl.RemoveToken(context.Background(), n)
	})
}
