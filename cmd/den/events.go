package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbEvents = &verb{
	name:     "events",
	summary:  "print the event log",
	synopsis: "[flags] [ID]",
	details: `Prints the events that match the filters, oldest first. With -f den then
waits for new events and prints each as it comes (every 500 ms), until
Ctrl-C or, with --limit N, N events; without --since it prints only new
events. With --json and -f, events are printed one JSON object a line.`,
	example: `den events web --type exec. --since 10m
		den events --since 2025-01-02T15:04:05Z --json
		den events -f --type sandbox.`,
	run: cmdEvents,
}

// sinceValue is a time: RFC 3339, a date, or a duration before now.
type sinceValue struct{ p *time.Time }

func (s sinceValue) Set(v string) error {
	t, err := parseSince(v, time.Now())
	if err != nil {
		return err
	}
	*s.p = t
	return nil
}

func (s sinceValue) String() string {
	if s.p == nil || s.p.IsZero() {
		return ""
	}
	return s.p.Format(time.RFC3339)
}

func parseSince(v string, now time.Time) (time.Time, error) {
	v = strings.TrimSpace(v)
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, v, time.Local); err == nil {
			return t, nil
		}
	}
	if d, err := api.ParseDuration(v); err == nil {
		return now.Add(-d.D()), nil
	}
	return time.Time{}, errors.New("want a time like 2025-01-02T15:04:05Z, a date, or a duration before now like 10m")
}

// eventFlags adds the flags den events and den net log share: --since,
// --limit (into filter), --json and --follow.
func eventFlags(f *flagSet, filter *client.EventFilter) (jsonOut, follow *bool) {
	f.Var(sinceValue{&filter.Since}, "since", "", "TIME", "only events since TIME: RFC 3339, a date, or a duration like 10m")
	f.Var(intValue{&filter.Limit}, "limit", "n", "N", "print at most N events")
	jsonOut = f.jsonFlag("print the events as a JSON array (with -f, one JSON object a line)")
	follow = f.Bool("follow", "f", "keep printing new events as they come, until Ctrl-C")
	return jsonOut, follow
}

func cmdEvents(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	var filter client.EventFilter
	f.Var(stringValue{&filter.Sandbox}, "sandbox", "s", "ID", "only events of this sandbox (id, prefix or name)")
	f.Var(stringValue{&filter.Type}, "type", "t", "TYPE", `only events whose type starts with TYPE, like "exec."`)
	jsonOut, follow := eventFlags(f, &filter)
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 1:
		return usagef(v, "events takes at most one sandbox (got %q)", pos)
	case len(pos) == 1 && filter.Sandbox != "" && filter.Sandbox != pos[0]:
		return usagef(v, "give the sandbox once: as an argument or with --sandbox")
	case len(pos) == 1:
		filter.Sandbox = pos[0]
	}
	ctx := context.Background()
	cl := c.client(f)
	if filter.Sandbox != "" {
		if filter.Sandbox, err = eventSandbox(ctx, cl, filter.Sandbox); err != nil {
			return err
		}
	}
	if *follow {
		return c.followEvents(cl, filter, *jsonOut)
	}
	list, err := cl.Events(ctx, filter)
	if err != nil {
		return err
	}
	return printList(c, list, *jsonOut, false, nil, "TIME\tSANDBOX\tTYPE\tDATA", func(e *api.Event) string {
		return fmt.Sprintf("%s\t%s\t%s\t%s\n", e.Time.Local().Format("2006-01-02 15:04:05"), shortID(e.Sandbox), e.Type, eventData(e))
	})
}

// eventData is an event's data on one line.
func eventData(e *api.Event) string {
	if len(e.Data) == 0 || string(e.Data) == "null" {
		return ""
	}
	var data bytes.Buffer
	if json.Compact(&data, e.Data) != nil {
		data.Reset()
		data.Write(e.Data)
	}
	return data.String()
}

// eventSandbox resolves a sandbox name or id prefix to the full id the
// event log is keyed by, if the sandbox still exists; else id is taken as
// it is (the events of a removed sandbox stay in the log).
func eventSandbox(ctx context.Context, cl *client.Client, id string) (string, error) {
	sb, err := cl.Get(ctx, id)
	switch {
	case err == nil:
		return sb.ID, nil
	case errors.Is(err, api.ErrNotFound):
		return id, nil
	}
	return "", err
}

// eventsPoll is how often den events -f (and den net log -f) asks for new
// events.
var eventsPoll = 500 * time.Millisecond

// followEvents prints the events of filter, then new ones as they come,
// until Ctrl-C or filter.Limit events.
func (c *cli) followEvents(cl *client.Client, filter client.EventFilter, jsonOut bool) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	if !jsonOut {
		fmt.Fprintf(c.stdout, "%-19s   %-12s   %-20s   %s\n", "TIME", "SANDBOX", "TYPE", "DATA")
	}
	return pollEvents(cl, filter, func(e *api.Event) error {
		if jsonOut {
			return enc.Encode(e)
		}
		_, err := fmt.Fprintf(c.stdout, "%-19s   %-12s   %-20s   %s\n", e.Time.Local().Format("2006-01-02 15:04:05"), shortID(e.Sandbox), e.Type, eventData(e))
		return err
	})
}

// pollEvents calls each for the events of filter (only new ones when
// filter.Since is zero), then for new ones as they come, every eventsPoll,
// until Ctrl-C (exit code 130) or filter.Limit events.
func pollEvents(cl *client.Client, filter client.EventFilter, each func(*api.Event) error) error {
	ctx, stop := signalContext()
	defer stop()
	limit := filter.Limit
	filter.Limit = 0
	if filter.Since.IsZero() {
		filter.Since = time.Now() // only new events
	}
	printed := 0
	for {
		list, err := cl.Events(ctx, filter)
		if err != nil {
			if ctx.Err() != nil {
				return exitError(130)
			}
			return err
		}
		for _, e := range list {
			if e.Seq > filter.After {
				filter.After = e.Seq
			}
			if err := each(e); err != nil {
				return err
			}
			if printed++; limit > 0 && printed >= limit {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return exitError(130)
		case <-time.After(eventsPoll):
		}
	}
}
