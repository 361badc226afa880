package main

import (
	"context"
	"fmt"
	"time"

	"github.com/den-dev/den/api"
)

var verbRun = &verb{
	name:     "run",
	summary:  "create a sandbox and run a command in it",
	synopsis: "[flags] [--] [CMD [ARG...]]",
	details: `The command's output is streamed and den exits with its exit code (128+N when
killed by signal N, 124 on timeout, 137 when out of memory). With --rm the
sandbox is removed afterwards, even on failure or Ctrl-C. Without a command,
den run prints the new sandbox's id, like den create. Each argument is one
argv entry; for a shell line use: den run -- sh -c '...'. With -it the
command runs on an interactive terminal, as with den exec -it. A sandbox
has no network (loopback only) unless --net, --allow or --allow-cidr says
otherwise; see den net set -h. As with den exec, connections the policy
refused the command are named in one line on stderr when it ends.

` + netFlagsDetails,
	example: `den run --rm --memory 512m --timeout 30s -- python3 -c 'print(6*7)'
		cat data.csv | den run --rm -i --image alpine:3.20 -- wc -l
		den run --rm -it --idle-timeout 30m -- bash
		den run --rm --allow github.com -- git ls-remote https://github.com/den-dev/den
		den run --rm --allow api.github.com --secret-header 'api.github.com=Authorization: Bearer ${GITHUB_TOKEN}' -- curl -s https://api.github.com/user`,
	run: cmdRun,
}

func cmdRun(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	var so sandboxOpts
	so.define(f)
	var eo execOpts
	eo.define(f, true)
	rm := f.Bool("rm", "", "remove the sandbox when the command ends")
	_, cmd, err := f.parse(args, 0, c.stdout)
	if err != nil {
		return err
	}
	if len(cmd) == 0 {
		for _, name := range []string{"rm", "interactive", "tty", "timeout"} {
			if f.isSet(name) {
				return usagef(v, "%s needs a command to run, like: den run %s -- ls", spell(name), spell(name))
			}
		}
	}
	if eo.tty && *eo.jsonOut {
		return usagef(v, "--json does not go with -t")
	}
	req, err := so.request(v, c.stderr)
	if err != nil {
		return err
	}
	eo.env, eo.workdir, eo.user = so.env, so.workdir, so.user
	var stdin []byte
	if eo.interactive && !eo.tty {
		if stdin, err = c.readStdin(); err != nil {
			return err
		}
	}

	ctx, stop := signalContext()
	defer stop()
	cl := c.client(f)
	sb, err := cl.Create(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(c.stderr, "den: interrupted")
			return exitError(130)
		}
		return err
	}
	if len(cmd) == 0 {
		if *eo.jsonOut {
			return c.printJSON(sb)
		}
		_, err := fmt.Fprintln(c.stdout, sb.ID)
		return err
	}
	if *rm {
		defer func() {
			rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := cl.Remove(rctx, sb.ID, true); err != nil {
				fmt.Fprintf(c.stderr, "den: remove sandbox %s: %v\n", shortID(sb.ID), err)
			}
		}()
	}
	if eo.tty {
		stop() // the terminal session handles signals itself
		req := api.ExecRequest{Cmd: cmd, Env: eo.env, Workdir: eo.workdir, User: eo.user, Timeout: eo.timeout}
		return c.ttyExit(c.runTTY(cl, sb.ID, req, eo.interactive))
	}
	err = c.runCommand(ctx, cl, sb.ID, &eo, cmd, stdin)
	if err == interruptErr {
		fmt.Fprintln(c.stderr, "den: interrupted")
		return exitError(130)
	}
	return err
}
