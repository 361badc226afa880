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
	synopsis: "[flags]",
	example: `den events --sandbox web --type exec. --since 10m
		den events --since 2025-01-02T15:04:05Z --json`,
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

func cmdEvents(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	var filter client.EventFilter
	f.Var(stringValue{&filter.Sandbox}, "sandbox", "s", "ID", "only events of this sandbox (id, prefix or name)")
	f.Var(stringValue{&filter.Type}, "type", "t", "TYPE", `only events whose type starts with TYPE, like "exec."`)
	f.Var(sinceValue{&filter.Since}, "since", "", "TIME", "only events since TIME: RFC 3339, a date, or a duration like 10m")
	f.Var(intValue{&filter.Limit}, "limit", "n", "N", "print at most N events")
	jsonOut := f.jsonFlag("print the events as a JSON array")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef(v, "events takes no arguments (got %q); use --sandbox ID", pos[0])
	}
	ctx := context.Background()
	cl := c.client(f)
	if filter.Sandbox != "" {
		// The log is keyed by full ids; resolve a name or prefix if the
		// sandbox still exists.
		if sb, err := cl.Get(ctx, filter.Sandbox); err == nil {
			filter.Sandbox = sb.ID
		} else if !errors.Is(err, api.ErrNotFound) {
			return err
		}
	}
	list, err := cl.Events(ctx, filter)
	if err != nil {
		return err
	}
	if *jsonOut {
		if list == nil {
			return c.printJSON([]any{})
		}
		return c.printJSON(list)
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "TIME\tSANDBOX\tTYPE\tDATA")
	for _, e := range list {
		var data bytes.Buffer
		if json.Compact(&data, e.Data) != nil {
			data.Reset()
			data.Write(e.Data)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Time.Local().Format("2006-01-02 15:04:05"), shortID(e.Sandbox), e.Type, data.String())
	}
	return tw.Flush()
}
