package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// newTable returns a tabwriter for column output like docker's.
// printJSONList prints list as a JSON array: [] when there is none.
func printJSONList[T any](c *cli, list []T) error {
	if list == nil {
		return c.printJSON([]any{})
	}
	return c.printJSON(list)
}

// printList prints what a list verb lists: with --json as a JSON array,
// with -q key(x) a line, else a table of header and row(x) (a line, with
// its newline) for each x.
func printList[T any](c *cli, list []T, jsonOut, quiet bool, key func(T) string, header string, row func(T) string) error {
	switch {
	case jsonOut:
		return printJSONList(c, list)
	case quiet:
		for _, x := range list {
			fmt.Fprintln(c.stdout, key(x))
		}
		return nil
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, header)
	for _, x := range list {
		fmt.Fprint(tw, row(x))
	}
	return tw.Flush()
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
}

// ago formats the time since t like "3 minutes ago".
func ago(t time.Time, now time.Time) string {
	if t.IsZero() || t.Unix() <= 0 {
		return "" // unknown
	}
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	return humanDuration(d) + " ago"
}

// humanDuration is docker's wording for an age.
func humanDuration(d time.Duration) string {
	seconds := int(d.Seconds())
	switch {
	case seconds < 1:
		return "Less than a second"
	case seconds == 1:
		return "1 second"
	case seconds < 60:
		return fmt.Sprintf("%d seconds", seconds)
	}
	minutes := int(d.Minutes())
	switch {
	case minutes == 1:
		return "About a minute"
	case minutes < 60:
		return fmt.Sprintf("%d minutes", minutes)
	}
	hours := int(math.Round(d.Hours()))
	switch {
	case hours == 1:
		return "About an hour"
	case hours < 48:
		return fmt.Sprintf("%d hours", hours)
	case hours < 24*7*2:
		return fmt.Sprintf("%d days", hours/24)
	case hours < 24*30*2:
		return fmt.Sprintf("%d weeks", hours/24/7)
	case hours < 24*365*2:
		return fmt.Sprintf("%d months", hours/24/30)
	}
	return fmt.Sprintf("%d years", int(d.Hours())/24/365)
}

// humanSize formats bytes with binary units: "512B", "1.5KiB", "12.3MiB".
func humanSize(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%dB", n)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	f := float64(n)
	for _, u := range units {
		f /= 1024
		if f < 1024 || u == "PiB" {
			if f < 10 {
				return fmt.Sprintf("%.2f%s", f, u)
			}
			return fmt.Sprintf("%.1f%s", f, u)
		}
	}
	return ""
}

// labelText formats labels as sorted k=v pairs.
func labelText(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
