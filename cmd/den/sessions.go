package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/den-dev/den/api"
)

var verbSessions = &verb{
	name:     "sessions",
	summary:  "list a sandbox's shell sessions, or remove one (sessions rm)",
	synopsis: "[flags] ID | rm [flags] ID NAME...",
	details: `A session is a long-lived shell of a sandbox that den exec --session NAME
runs commands in, so the working directory, variables and functions one
command leaves are there for the next. BUSY says a command is running in
it. den sessions rm ID NAME ends a session (its shell is killed); the next
command naming it starts a fresh one.`,
	example: `den exec --session build web -- 'cd /src && export CC=clang'
		den sessions web
		den sessions rm web build`,
	run: cmdSessions,
}

var verbSessionsRm = &verb{
	name:     "sessions rm",
	summary:  "end shell sessions of a sandbox",
	synopsis: "[flags] ID NAME...",
	details:  "Kills each session's shell and prints its name.",
	example:  `den sessions rm web build`,
	run:      cmdSessionsRm,
}

func cmdSessions(c *cli, v *verb, args []string) error {
	if len(args) > 1 && args[0] == "rm" {
		return cmdSessionsRm(c, verbSessionsRm, args[1:])
	}
	f := newFlags(v)
	jsonOut := f.jsonFlag("print the sessions as a JSON array")
	pos, err := c.exactly(f, v, args, 1, "sessions needs one sandbox ID (to remove a session: den sessions rm ID NAME)")
	if err != nil {
		return err
	}
	list, err := c.client(f).Sessions(context.Background(), pos[0])
	if err != nil {
		return err
	}
	sort.SliceStable(list, func(i, j int) bool { return list[i].Started.Before(list[j].Started) })
	now := time.Now()
	return printList(c, list, *jsonOut, false, nil, "NAME\tPID\tSTARTED\tBUSY", func(s *api.Session) string {
		return fmt.Sprintf("%s\t%d\t%s\t%s\n", s.Name, s.Pid, ago(s.Started, now), strconv.FormatBool(s.Busy))
	})
}

func cmdSessionsRm(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usagef(v, "sessions rm needs a sandbox ID and a session NAME, like: den sessions rm web build")
	}
	cl := c.client(f)
	return each(c, v, pos[1:], false, func(name string) error {
		return cl.CloseSession(context.Background(), pos[0], name)
	})
}
