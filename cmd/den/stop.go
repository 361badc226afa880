package main

import (
	"context"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbStop = &verb{
	name:     "stop",
	summary:  "stop sandboxes: end their processes, keep their files",
	synopsis: "[flags] ID...",
	details: `As docker stop: every process gets the sandbox's stop signal (den create
--stop-signal, default TERM; one on a terminal is hung up too), then up to its stop timeout (--stop-timeout,
default 10s; -t here for this stop) to end; what is left is killed. A
service (den exec -d --restart) is not restarted while the sandbox stops
and starts again with it.`,
	example: `den stop web
		den stop -t 30s db`,
	run: cmdStop,
}

func cmdStop(c *cli, v *verb, args []string) error {
	var timeout *api.Duration
	return c.eachSandbox(v, args, func(cl *client.Client, id string) (*api.Sandbox, error) {
		if timeout != nil {
			return cl.StopWithin(context.Background(), id, timeout.D())
		}
		return cl.Stop(context.Background(), id)
	}, func(f *flagSet) {
		f.Var(optDurationValue{&timeout}, "time", "t", "DURATION", "wait this long for the processes after the stop signal, in place of the sandbox's stop timeout, like 30s or 30 (0 kills at once)")
	})
}
