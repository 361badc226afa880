package main

import (
	"context"
	"fmt"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbPause = &verb{
	name:     "pause",
	summary:  "freeze every process of sandboxes (no CPU used; memory, files and connections kept)",
	synopsis: "[flags] ID...",
	details: `Any use of a paused sandbox resumes it (exec, files, attach, traffic to
its ports); read-only calls do not: den ls, inspect, stats, port ls, and ps
(the processes as of the pause, in STATE paused). den logs without -f and
den sessions then fail, saying to resume it.`,
	example: "den pause web\nden stats web          # still paused\nden exec web -- true   # resumes it",
	run: func(c *cli, v *verb, args []string) error {
		return c.eachSandbox(v, args, func(cl *client.Client, id string) (*api.Sandbox, error) {
			return cl.Pause(context.Background(), id)
		})
	},
}

var verbResume = &verb{
	name:     "resume",
	summary:  "resume paused or hibernated sandboxes (prints how: thawed, restored or restarted)",
	synopsis: "[flags] ID...",
	example:  "den resume web",
	run: func(c *cli, v *verb, args []string) error {
		var flags *flagSet // its json field is set once eachSandbox parses args
		return c.eachSandbox(v, args, func(cl *client.Client, id string) (*api.Sandbox, error) {
			sb, err := cl.Resume(context.Background(), id)
			if err == nil && sb.Resumed != "" && !flags.json {
				fmt.Fprintf(c.stderr, "%s: %s\n", sb.ID[:12], resumedText(sb.Resumed))
			}
			return sb, err
		}, func(f *flagSet) { flags = f })
	},
}

var verbHibernate = &verb{
	name:     "hibernate",
	summary:  "free sandboxes' memory and keep their files; any use resumes them",
	synopsis: "[flags] ID...",
	details: `Any use of a hibernated sandbox resumes it (exec, files, attach, traffic to
its ports); read-only calls do not: den ls, inspect, port ls, and, where its
memory was saved (gvisor, microvm), ps (the processes as of the hibernation,
in STATE hibernated). den stats, den logs without -f and den sessions then
fail, saying to resume it.`,
	example: "den hibernate web",
	run: func(c *cli, v *verb, args []string) error {
		return c.eachSandbox(v, args, func(cl *client.Client, id string) (*api.Sandbox, error) {
			return cl.Hibernate(context.Background(), id)
		})
	},
}

func resumedText(how string) string {
	switch how {
	case api.ResumedThawed:
		return "thawed (processes continued where they stopped)"
	case api.ResumedRestored:
		return "restored (processes came back from a memory checkpoint)"
	case api.ResumedRestarted:
		return "restarted (files kept; processes and services started anew)"
	}
	return how
}
