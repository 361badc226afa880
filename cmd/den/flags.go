package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/den-dev/den/api"
)

// usageError is a mistake in the command line: exit code 2.
type usageError struct {
	verb string
	msg  string
}

func (e *usageError) Error() string { return e.msg }

func usagef(v *verb, format string, args ...any) error {
	name := ""
	if v != nil {
		name = v.name
	}
	return &usageError{verb: name, msg: fmt.Sprintf(format, args...)}
}

// exitError ends den with a code, its message (if any) already printed.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// flagSet holds a verb's flags. Definitions live in a flag.FlagSet; parse
// adds long (--name) and short (-n) spellings, flags after positional
// arguments, "--" as the end of flags, and error messages naming the flag.
type flagSet struct {
	fs     *flag.FlagSet
	v      *verb
	defs   []*flagDef
	byName map[string]*flagDef
	host   string
	json   bool
}

type flagDef struct {
	name, short, arg, usage string
	value                   flag.Value
	set                     bool
}

func (d *flagDef) isBool() bool {
	b, ok := d.value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// spell returns how a flag is written on the command line.
func spell(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// newFlags returns the flag set of verb v, with --host (-H) defined.
func newFlags(v *verb) *flagSet {
	f := &flagSet{fs: flag.NewFlagSet("den "+v.name, flag.ContinueOnError), v: v, byName: map[string]*flagDef{}}
	f.fs.SetOutput(io.Discard)
	f.Var(stringValue{&f.host}, "host", "H", "HOST", "daemon address: unix:///path, tcp://host:port or http://... (default $DEN_HOST or "+defaultHostText+")")
	return f
}

const defaultHostText = "unix:///run/den/den.sock"

// jsonFlag defines --json.
func (f *flagSet) jsonFlag(usage string) *bool {
	if usage == "" {
		usage = "print JSON"
	}
	f.Var(boolValue{&f.json}, "json", "", "", usage)
	return &f.json
}

// Var defines a flag with an optional one-letter alias. arg names the value
// in the usage text ("" for a boolean).
func (f *flagSet) Var(v flag.Value, name, short, arg, usage string) {
	d := &flagDef{name: name, short: short, arg: arg, usage: usage, value: v}
	f.fs.Var(v, name, usage)
	f.byName[name] = d
	if short != "" {
		f.fs.Var(v, short, usage)
		f.byName[short] = d
	}
	f.defs = append(f.defs, d)
}

func (f *flagSet) Bool(name, short, usage string) *bool {
	p := new(bool)
	f.Var(boolValue{p}, name, short, "", usage)
	return p
}

func (f *flagSet) String(name, short, arg, usage string) *string {
	p := new(string)
	f.Var(stringValue{p}, name, short, arg, usage)
	return p
}

func (f *flagSet) Int(name, short, arg, usage string) *int {
	p := new(int)
	f.Var(intValue{p}, name, short, arg, usage)
	return p
}

// isSet reports whether the flag was given.
func (f *flagSet) isSet(name string) bool {
	d := f.byName[name]
	return d != nil && d.set
}

// parse parses args. npos is the number of positional arguments before a
// command: when that many have been seen, the first argument that is not
// one of the verb's flags starts the command. npos < 0 means the verb takes
// no command, so every non-flag argument is positional. "--" ends the flags:
// what follows is the command (or, with npos < 0, positional arguments).
// -h and --help give flag.ErrHelp after printing the usage to stdout.
func (f *flagSet) parse(args []string, npos int, stdout io.Writer) (pos, cmd []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest := args[i+1:]
			if npos < 0 {
				return append(pos, rest...), nil, nil
			}
			for len(pos) < npos && len(rest) > 0 {
				pos, rest = append(pos, rest[0]), rest[1:]
			}
			return pos, rest, nil
		}
		if len(a) < 2 || a[0] != '-' {
			if npos >= 0 && len(pos) == npos {
				return pos, args[i:], nil
			}
			pos = append(pos, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if name == "h" || name == "help" {
			f.usage(stdout)
			return nil, nil, flag.ErrHelp
		}
		d := f.byName[name]
		if d == nil {
			// -abc: a group of one-letter boolean flags.
			if !strings.HasPrefix(a, "--") && !hasValue && f.boolGroup(name) {
				for _, r := range name {
					f.byName[string(r)].value.Set("true")
					f.byName[string(r)].set = true
				}
				continue
			}
			return nil, nil, usagef(f.v, "unknown flag %s", strings.SplitN(a, "=", 2)[0])
		}
		if !hasValue {
			if d.isBool() {
				value = "true"
			} else {
				if i+1 >= len(args) {
					return nil, nil, usagef(f.v, "flag %s needs a value (%s)", spell(name), d.arg)
				}
				i++
				value = args[i]
			}
		}
		if err := d.value.Set(value); err != nil {
			if h, ok := d.value.(interface{ hidesValue() bool }); ok && h.hidesValue() {
				return nil, nil, usagef(f.v, "bad value for %s: %v", spell(name), err)
			}
			return nil, nil, usagef(f.v, "bad value %q for %s: %v", value, spell(name), err)
		}
		d.set = true
	}
	return pos, nil, nil
}

func (f *flagSet) boolGroup(name string) bool {
	if len(name) < 2 {
		return false
	}
	for _, r := range name {
		d := f.byName[string(r)]
		if d == nil || !d.isBool() {
			return false
		}
	}
	return true
}

// usage prints the verb's help: summary, synopsis, flags and example.
func (f *flagSet) usage(w io.Writer) {
	v := f.v
	fmt.Fprintf(w, "den %s - %s\n\nUsage:\n  den %s %s\n", v.name, v.summary, v.name, v.synopsis)
	if v.details != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(v.details))
	}
	fmt.Fprintf(w, "\nFlags:\n")
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	defs := append([]*flagDef(nil), f.defs...)
	sort.SliceStable(defs, func(i, j int) bool { return defs[i].name < defs[j].name })
	for _, d := range defs {
		names := "    " + spell(d.name)
		if d.short != "" {
			names = spell(d.short) + ", " + spell(d.name)
		}
		if d.arg != "" {
			names += " " + d.arg
		}
		fmt.Fprintf(tw, "  %s\t%s\n", names, d.usage)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nExample:\n")
	for _, line := range strings.Split(strings.TrimSpace(v.example), "\n") {
		fmt.Fprintf(w, "  %s\n", strings.TrimSpace(line))
	}
}

// Flag values.

type boolValue struct{ p *bool }

func (b boolValue) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("want true or false")
	}
	*b.p = v
	return nil
}
func (b boolValue) String() string {
	if b.p == nil {
		return "false"
	}
	return strconv.FormatBool(*b.p)
}
func (b boolValue) IsBoolFlag() bool { return true }

type stringValue struct{ p *string }

func (s stringValue) Set(v string) error { *s.p = v; return nil }
func (s stringValue) String() string {
	if s.p == nil {
		return ""
	}
	return *s.p
}

type intValue struct{ p *int }

func (n intValue) Set(s string) error {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return errors.New("want a whole number")
	}
	if v < 0 {
		return errors.New("must not be negative")
	}
	*n.p = v
	return nil
}
func (n intValue) String() string {
	if n.p == nil {
		return "0"
	}
	return strconv.Itoa(*n.p)
}

type floatValue struct{ p *float64 }

func (n floatValue) Set(s string) error {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return errors.New("want a number, like 1.5")
	}
	if math.IsInf(v, 0) || v != v {
		return errors.New("want a number, like 1.5")
	}
	if v < 0 {
		return errors.New("must not be negative")
	}
	*n.p = v
	return nil
}
func (n floatValue) String() string {
	if n.p == nil {
		return "0"
	}
	return strconv.FormatFloat(*n.p, 'g', -1, 64)
}

// sizeValue is a size like "512m" (api.ParseSize).
type sizeValue struct{ p *api.Size }

func (s sizeValue) Set(v string) error {
	n, err := api.ParseSize(v)
	if err != nil {
		return err
	}
	*s.p = n
	return nil
}
func (s sizeValue) String() string {
	if s.p == nil {
		return "0"
	}
	return s.p.String()
}

// durationValue is a duration like "30s" or a number of seconds
// (api.ParseDuration).
type durationValue struct{ p *api.Duration }

func (d durationValue) Set(v string) error {
	n, err := api.ParseDuration(v)
	if err != nil {
		return err
	}
	*d.p = n
	return nil
}
func (d durationValue) String() string {
	if d.p == nil {
		return "0s"
	}
	return d.p.String()
}

// optDurationValue is a durationValue that stays nil unless set, for a
// flag whose 0 differs from its default (--stop-timeout 0 kills at once).
type optDurationValue struct{ p **api.Duration }

func (d optDurationValue) Set(v string) error {
	var n api.Duration
	if err := (durationValue{&n}).Set(v); err != nil {
		return err
	}
	*d.p = &n
	return nil
}
func (d optDurationValue) String() string {
	if d.p == nil || *d.p == nil {
		return ""
	}
	return (*d.p).String()
}

// listValue collects a repeatable flag; check validates and may rewrite
// each value (returning "" drops it).
type listValue struct {
	p     *[]string
	check func(string) (string, error)
}

func (l listValue) Set(v string) error {
	if l.check != nil {
		var err error
		if v, err = l.check(v); err != nil {
			return err
		}
		if v == "" {
			return nil
		}
	}
	*l.p = append(*l.p, v)
	return nil
}
func (l listValue) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

// checkEnv accepts K=V, or K alone to pass the variable of den's own
// environment (dropped when it is not set).
func checkEnv(s string) (string, error) {
	k, _, ok := strings.Cut(s, "=")
	if k == "" || strings.ContainsAny(k, " \t\n\x00") {
		return "", errors.New("want K=V with a variable name K")
	}
	if !ok {
		v, set := os.LookupEnv(k)
		if !set {
			return "", nil
		}
		return k + "=" + v, nil
	}
	return s, nil
}

// checkLabel accepts k=v (or k, an empty value).
func checkLabel(s string) (string, error) {
	k, _, _ := strings.Cut(s, "=")
	if k == "" {
		return "", errors.New("want k=v with a non-empty key k")
	}
	return s, nil
}

// labelMap turns k=v strings into a map.
func labelMap(list []string) map[string]string {
	if len(list) == 0 {
		return nil
	}
	m := make(map[string]string, len(list))
	for _, s := range list {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return m
}

// atLeastOne parses args with f; need is the usage error when they name
// nothing.
func (c *cli) atLeastOne(f *flagSet, v *verb, args []string, need string) ([]string, error) {
	names, _, err := f.parse(args, -1, c.stdout)
	if err == nil && len(names) == 0 {
		err = usagef(v, "%s", need)
	}
	return names, err
}

// exactly parses args with f; need is the usage error unless they are n.
func (c *cli) exactly(f *flagSet, v *verb, args []string, n int, need string) ([]string, error) {
	pos, _, err := f.parse(args, -1, c.stdout)
	if err == nil && len(pos) != n {
		err = usagef(v, "%s", need)
	}
	return pos, err
}
