package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbSnapshot = &verb{
	name:     "snapshot",
	summary:  "capture a sandbox's files; list, inspect and remove snapshots",
	synopsis: "ID [--name N] | COMMAND [flags] [ARG...]",
	details: `den snapshot ID takes a snapshot of sandbox ID (the same as den snapshot
create ID): a consistent point-in-time copy of its files, taken with its
processes frozen for the instant of the capture. Image layers are never
copied, and on den's managed filesystem (btrfs) unchanged files are shared,
so a snapshot costs the same whatever the sandbox holds. Volumes are not
part of snapshots. A checksum manifest of the files is recorded and
verified whenever the snapshot is used (den create --from, den restore).

With --memory (gvisor and microvm sandboxes) the snapshot also keeps the
running processes and memory: the sandbox is checkpointed, its files copied
while it is stopped, and it runs on from the checkpoint (its processes
pause for that long; open network connections do not survive on this
gVisor). Sandboxes created from it, and den restore, run on from that
instant, each with its own hostname and address.`,
	example: `den snapshot web --name before-upgrade
		den snapshot web --memory --name warm
		den snapshot ls web
		den create --from before-upgrade
		den restore web before-upgrade
		den snapshot rm before-upgrade`,
	run:   cmdSnapshotGroup,
	group: true,
}

// cmdSnapshotGroup runs a sub-command, or takes a snapshot when the first
// argument is not one ("den snapshot ID").
func cmdSnapshotGroup(c *cli, v *verb, args []string) error {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") && findVerb(v.name+" "+args[0]) == nil {
		return verbSnapshotCreate.run(c, verbSnapshotCreate, args)
	}
	return cmdGroup(c, v, args)
}

var verbSnapshotCreate = &verb{
	name:     "snapshot create",
	summary:  "take a snapshot of a sandbox and print its id",
	synopsis: "[flags] ID",
	example: `den snapshot create web --name before-upgrade
		den snapshot create web --memory --name warm`,
	run: func(c *cli, v *verb, args []string) error {
		f := newFlags(v)
		name := f.String("name", "", "NAME", "name the snapshot")
		memory := f.Bool("memory", "", "keep the running processes and memory too (gvisor, microvm)")
		jsonOut := f.jsonFlag("print the snapshot as JSON")
		pos, err := c.exactly(f, v, args, 1, "snapshot create needs one sandbox ID")
		if err != nil {
			return err
		}
		s, err := c.client(f).Snapshot(context.Background(), pos[0], api.SnapshotRequest{Name: *name, Memory: *memory})
		if err != nil {
			return err
		}
		return c.printResult(*jsonOut, s, s.ID)
	},
}

var verbSnapshotLs = &verb{
	name:     "snapshot ls",
	summary:  "list snapshots, of one sandbox if given",
	synopsis: "[flags] [ID]",
	example:  "den snapshot ls\n\t\tden snapshot ls web --json",
	run: func(c *cli, v *verb, args []string) error {
		f := newFlags(v)
		jsonOut := f.jsonFlag("print the snapshots as a JSON array")
		pos, _, err := f.parse(args, -1, c.stdout)
		if err != nil {
			return err
		}
		if len(pos) > 1 {
			return usagef(v, "snapshot ls takes at most one sandbox ID")
		}
		sandbox := ""
		if len(pos) == 1 {
			sandbox = pos[0]
		}
		list, err := c.client(f).Snapshots(context.Background(), sandbox)
		if err != nil {
			return err
		}
		if *jsonOut {
			return c.printJSON(list)
		}
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "SNAPSHOT\tNAME\tSANDBOX\tIMAGE\tSIZE\tFILES\tMEMORY\tCREATED")
		now := time.Now()
		for _, s := range list {
			files := "sealing"
			if s.Digest != "" {
				files = fmt.Sprint(s.Files)
			}
			memory := "-"
			if s.Memory {
				memory = humanSize(int64(s.MemorySize))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID[:12], dash(s.Name), s.Sandbox[:12], s.Image, humanSize(int64(s.Size)), files, memory, ago(s.CreatedAt, now))
		}
		return tw.Flush()
	},
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

var verbSnapshotInspect = &verb{
	name:     "snapshot inspect",
	summary:  "print snapshots as JSON",
	synopsis: "[flags] SNAPSHOT...",
	example:  "den snapshot inspect before-upgrade",
	run: func(c *cli, v *verb, args []string) error {
		return c.eachJSON(v, args, "snapshot inspect needs at least one argument", func(cl *client.Client, id string) (any, error) {
			return cl.GetSnapshot(context.Background(), id)
		})
	},
}

var verbSnapshotRm = &verb{
	name:     "snapshot rm",
	summary:  "remove snapshots (sandboxes made from them keep their files)",
	synopsis: "[flags] SNAPSHOT...",
	example:  "den snapshot rm before-upgrade",
	run: func(c *cli, v *verb, args []string) error {
		return c.eachName(v, args, func(cl *client.Client, id string) error {
			return cl.RemoveSnapshot(context.Background(), id)
		})
	},
}

var verbSnapshotSave = &verb{
	name:     "snapshot save",
	summary:  "write a snapshot archive (files, checksum manifest, image) for another host",
	synopsis: "[flags] [ID] SNAPSHOT",
	details: `Writes one tar holding the snapshot's files, its checksum manifest and its
image (unless that is the host image, which every den has), for
den snapshot load on another host. With ID, the snapshot must be one of
that sandbox's. Images built on the host image cannot leave this host.`,
	example: `den snapshot save web before-upgrade -o snap.tar
		den snapshot save before-upgrade | ssh other den snapshot load -`,
	run: func(c *cli, v *verb, args []string) error {
		f := newFlags(v)
		output := f.String("output", "o", "FILE", "write the archive to FILE instead of standard output")
		pos, _, err := f.parse(args, -1, c.stdout)
		if err != nil {
			return err
		}
		if len(pos) < 1 || len(pos) > 2 {
			return usagef(v, "snapshot save needs a SNAPSHOT (optionally after its sandbox ID)")
		}
		cl := c.client(f)
		snap := pos[len(pos)-1]
		if len(pos) == 2 {
			s, err := cl.GetSnapshot(context.Background(), snap)
			if err != nil {
				return err
			}
			sb, err := cl.Get(context.Background(), pos[0])
			if err != nil {
				return err
			}
			if s.Sandbox != sb.ID {
				return fmt.Errorf("snapshot %s is of sandbox %s, not %s", s.ID[:12], s.Sandbox[:12], sb.ID[:12])
			}
			snap = s.ID
		}
		if _, tty := terminalFd(c.stdout); (*output == "" || *output == "-") && tty {
			return errors.New("refusing to write an archive to a terminal: use -o FILE or redirect standard output")
		}
		rc, err := cl.SaveSnapshot(context.Background(), snap)
		if err != nil {
			return err
		}
		return c.writeArchive(*output, rc)
	},
}

var verbSnapshotLoad = &verb{
	name:     "snapshot load",
	summary:  "record the snapshot in an archive made by den snapshot save; print its id",
	synopsis: "[flags] FILE|-",
	details: `Checks every file against the archive's checksum manifest (a damaged or
edited archive is refused whole), imports the snapshot's image if this host
does not have it, and records the snapshot under a new id (and its name, if
free here). Then den create --from ID starts sandboxes from it.`,
	example: `den snapshot load snap.tar
		den create --from "$(den snapshot load snap.tar)"`,
	run: func(c *cli, v *verb, args []string) error {
		f := newFlags(v)
		jsonOut := f.jsonFlag("print the snapshot as JSON")
		pos, err := c.exactly(f, v, args, 1, "snapshot load needs one FILE (- for standard input)")
		if err != nil {
			return err
		}
		var in io.Reader = c.stdin
		if pos[0] != "-" {
			file, err := os.Open(pos[0])
			if err != nil {
				return err
			}
			defer file.Close()
			in = file
		}
		s, err := c.client(f).LoadSnapshot(context.Background(), in)
		if err != nil {
			return err
		}
		return c.printResult(*jsonOut, s, s.ID)
	},
}

var verbRestore = &verb{
	name:     "restore",
	summary:  "roll a sandbox back to a snapshot, in place",
	synopsis: "[flags] ID SNAPSHOT",
	details: `Stops the sandbox's processes, replaces its files with the snapshot's
(after checking them against its checksum manifest) and starts it again if
it was running; its id, name, network policy, ports and volumes stay.`,
	example: "den restore web before-upgrade",
	run: func(c *cli, v *verb, args []string) error {
		f := newFlags(v)
		jsonOut := f.jsonFlag("print the sandbox as JSON")
		pos, err := c.exactly(f, v, args, 2, "restore needs a sandbox ID and a SNAPSHOT")
		if err != nil {
			return err
		}
		sb, err := c.client(f).Restore(context.Background(), pos[0], pos[1])
		if err != nil {
			return err
		}
		return c.printResult(*jsonOut, sb, sb.ID)
	},
}

var verbFork = &verb{
	name:     "fork",
	summary:  "make new sandboxes from a sandbox's current files; print their ids",
	synopsis: "[flags] ID",
	details: `Each fork starts from the source's files at one instant (the source is
frozen for the copy and keeps running), with its image, environment, limits,
network policy, services and volumes, and is independent of the source and
of the other forks from then on.

With --memory (gvisor and microvm sandboxes) the forks also keep the
source's running processes and memory: one checkpoint of the source boots
every fork, each with its own hostname and address (connections open in
the source are not carried over), and the source runs on from it.`,
	example: `den fork web -n 3
		den fork web -n 2 --memory
		for id in $(den fork web -n 3); do den exec -d $id -- make test; done`,
	run: func(c *cli, v *verb, args []string) error {
		f := newFlags(v)
		n := f.Int("count", "n", "N", "how many forks (1-64)")
		var labels []string
		f.Var(listValue{&labels, checkLabel}, "label", "l", "K=V", "set a label on every fork (repeatable)")
		memory := f.Bool("memory", "", "forks keep the running processes and memory (gvisor, microvm)")
		jsonOut := f.jsonFlag("print the new sandboxes as a JSON array")
		pos, err := c.exactly(f, v, args, 1, "fork needs one sandbox ID")
		if err != nil {
			return err
		}
		list, err := c.client(f).Fork(context.Background(), pos[0], api.ForkRequest{Count: *n, Labels: labelMap(labels), Memory: *memory})
		if err != nil {
			return err
		}
		if *jsonOut {
			return c.printJSON(list)
		}
		for _, sb := range list {
			fmt.Fprintln(c.stdout, sb.ID)
		}
		return nil
	},
}

var verbVolume = &verb{
	name:     "volume",
	summary:  "manage volumes: create, ls, inspect, rm",
	synopsis: "COMMAND [flags] [ARG...]",
	details: `A volume is persistent storage that outlives sandboxes and can be mounted by
several at once (den create --volume NAME:/path[:ro]): package caches,
datasets. Its files keep the owners the sandboxes see. Volumes are never
part of snapshots or forks (a fork mounts the same volumes as its source).`,
	example: `den volume create pipcache --size 5g
		den run --rm --volume pipcache:/root/.cache/pip -- pip install requests
		den volume ls`,
	run:   cmdGroup,
	group: true,
}

var verbVolumeCreate = &verb{
	name:     "volume create",
	summary:  "create a volume",
	synopsis: "[flags] NAME",
	example:  "den volume create data --size 10g",
	run: func(c *cli, v *verb, args []string) error {
		f := newFlags(v)
		var size api.Size
		f.Var(sizeValue{&size}, "size", "", "SIZE", "quota, like 10g (enforced by the kernel; default: the daemon's --default-disk, or a token's --disk cap)")
		jsonOut := f.jsonFlag("print the volume as JSON")
		pos, err := c.exactly(f, v, args, 1, "volume create needs one NAME")
		if err != nil {
			return err
		}
		vol, err := c.client(f).CreateVolume(context.Background(), api.VolumeRequest{Name: pos[0], Size: size})
		if err != nil {
			return err
		}
		return c.printResult(*jsonOut, vol, vol.Name)
	},
}

var verbVolumeLs = &verb{
	name:     "volume ls",
	summary:  "list volumes",
	synopsis: "[flags]",
	example:  "den volume ls --json",
	run: func(c *cli, v *verb, args []string) error {
		f := newFlags(v)
		jsonOut := f.jsonFlag("print the volumes as a JSON array")
		if _, _, err := f.parse(args, 0, c.stdout); err != nil {
			return err
		}
		list, err := c.client(f).Volumes(context.Background())
		if err != nil {
			return err
		}
		if *jsonOut {
			return c.printJSON(list)
		}
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "NAME\tUSED\tSIZE\tSANDBOXES\tCREATED")
		now := time.Now()
		for _, vol := range list {
			size := "-"
			if vol.Size > 0 {
				size = humanSize(int64(vol.Size))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", vol.Name, humanSize(int64(vol.Used)), size, len(vol.UsedBy), ago(vol.CreatedAt, now))
		}
		return tw.Flush()
	},
}

var verbVolumeInspect = &verb{
	name:     "volume inspect",
	summary:  "print volumes as JSON",
	synopsis: "[flags] NAME...",
	example:  "den volume inspect data",
	run: func(c *cli, v *verb, args []string) error {
		return c.eachJSON(v, args, "volume inspect needs at least one argument", func(cl *client.Client, name string) (any, error) {
			return cl.GetVolume(context.Background(), name)
		})
	},
}

var verbVolumeRm = &verb{
	name:     "volume rm",
	summary:  "remove volumes and their files (not while a sandbox mounts them)",
	synopsis: "[flags] NAME...",
	example:  "den volume rm data",
	run: func(c *cli, v *verb, args []string) error {
		return c.eachName(v, args, func(cl *client.Client, name string) error {
			return cl.RemoveVolume(context.Background(), name)
		})
	},
}
