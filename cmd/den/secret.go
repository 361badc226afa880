package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/term"
)

var verbSecret = &verb{
	name:     "secret",
	summary:  "manage den's secret store: set, ls, rm",
	synopsis: "COMMAND [flags] [ARG...]",
	example: `den secret set TOKEN < token.txt
		den secret set --prompt TOKEN
		den run --rm --allow api.example.com --secret-header 'api.example.com=Authorization: Bearer ${TOKEN}' -- curl -s https://api.example.com/
		den secret ls
		den secret rm TOKEN`,
	run:   cmdGroup,
	group: true,
}

var verbSecretSet = &verb{
	name:     "secret set",
	summary:  "store a secret, read from standard input",
	synopsis: "[flags] NAME",
	details: `Stores (or replaces) the secret NAME in den's secret store, for ${NAME} in
the value of a --secret-header (den run, den create, den net set): den's
proxy sets the header on the sandbox's HTTPS requests, so the secret never
enters the sandbox. Sandboxes already using NAME get the new value at once.

The value is read from standard input, never from the command line (where
other users and the shell history would see it); one trailing newline is
dropped. A terminal is refused unless --prompt is given, which asks for the
value without echoing it. NAME is like an environment variable name:
letters, digits and _, not starting with a digit. A value is 1 byte to
64 KiB. The daemon never gives a value back.`,
	example: `den secret set TOKEN < token.txt
		printf %s "$GITHUB_TOKEN" | den secret set GITHUB_TOKEN
		den secret set --prompt TOKEN`,
	run: cmdSecretSet,
}

var verbSecretLs = &verb{
	name:     "secret ls",
	summary:  "list the names of den's secrets",
	synopsis: "[flags]",
	details:  "Prints the names only: the daemon never gives a value back.",
	example: `den secret ls
		den secret ls --json`,
	run: cmdSecretLs,
}

var verbSecretRm = &verb{
	name:     "secret rm",
	summary:  "remove secrets",
	synopsis: "[flags] NAME...",
	details:  "Removes the secrets from den's store and prints each name; sandboxes whose secret headers refer to them stop getting those headers.",
	example:  `den secret rm TOKEN`,
	run:      cmdSecretRm,
}

// maxSecret is the largest value the daemon stores.
const maxSecret = 64 << 10

// checkSecretName checks a secret name as the daemon does. The message
// does not quote a name with "=" in it, which looks like NAME=VALUE.
func checkSecretName(v *verb, name string) error {
	if strings.Contains(name, "=") {
		return usagef(v, "a secret NAME has no =: the value is read from standard input, never from the command line")
	}
	ok := name != "" && len(name) <= 128
	for i, c := range name {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			ok = false
		}
	}
	if !ok {
		return usagef(v, "bad secret name %q: use letters, digits and _, not starting with a digit (like an environment variable), at most 128", name)
	}
	return nil
}

func cmdSecretSet(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	prompt := f.Bool("prompt", "", "ask for the value on the terminal, without echoing it")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		// Never quote the arguments: the second may be the value.
		return usagef(v, "secret set takes one NAME (got %d arguments); the value is read from standard input, never from the command line", len(pos))
	}
	name := pos[0]
	if err := checkSecretName(v, name); err != nil {
		return err
	}
	fd, tty := terminalFd(c.stdin)
	var value []byte
	switch {
	case *prompt && !tty:
		return usagef(v, "--prompt needs a terminal on standard input; without it, the value is read from standard input")
	case *prompt:
		if value, err = readSecretPrompt(c, fd, name); err != nil {
			return err
		}
	case tty:
		return usagef(v, "standard input is a terminal: pipe the value in (den secret set %s < FILE), or give --prompt to type it without echo", name)
	default:
		if value, err = io.ReadAll(io.LimitReader(c.stdin, maxSecret+3)); err != nil {
			return fmt.Errorf("read standard input: %w", err)
		}
	}
	value = trimNewline(value)
	switch {
	case len(value) == 0:
		return errors.New("the secret's value is empty (it is read from standard input)")
	case len(value) > maxSecret:
		return errors.New("the secret's value is over 64 KiB")
	}
	return c.client(f).SetSecret(context.Background(), name, value)
}

// trimNewline drops one trailing "\n" or "\r\n".
func trimNewline(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b
}

// readSecretPrompt reads a line from terminal fd without echo, prompting
// on stderr. Ctrl-C restores the terminal (echo on) before den exits.
func readSecretPrompt(c *cli, fd int, name string) ([]byte, error) {
	state, err := term.GetState(fd)
	if err != nil {
		return nil, err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	fmt.Fprintf(c.stderr, "Value of secret %s: ", name)
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := term.ReadPassword(fd)
		done <- result{b, err}
	}()
	select {
	case r := <-done:
		fmt.Fprintln(c.stderr)
		if r.err != nil {
			return nil, fmt.Errorf("read the secret from the terminal: %w", r.err)
		}
		return r.b, nil
	case <-sigs:
		term.Restore(fd, state)
		fmt.Fprintln(c.stderr)
		fmt.Fprintln(c.stderr, "den: interrupted")
		return nil, exitError(130)
	}
}

func cmdSecretLs(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag("print the names as a JSON array")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef(v, "secret ls takes no arguments (got %q)", pos[0])
	}
	names, err := c.client(f).Secrets(context.Background())
	if err != nil {
		return err
	}
	if names == nil {
		names = []string{}
	}
	sort.Strings(names)
	if *jsonOut {
		return c.printJSON(names)
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "NAME")
	for _, n := range names {
		fmt.Fprintln(tw, n)
	}
	return tw.Flush()
}

func cmdSecretRm(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	names, err := c.atLeastOne(f, v, args, "secret rm needs at least one NAME")
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := checkSecretName(v, n); err != nil {
			return err
		}
	}
	cl := c.client(f)
	return each(c, v, names, false, func(n string) error {
		return cl.DeleteSecret(context.Background(), n)
	})
}
