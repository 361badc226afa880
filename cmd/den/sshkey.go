package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbSSHKey = &verb{
	name:     "ssh-key",
	summary:  "manage the public keys of den's SSH gateway: add, ls, rm",
	synopsis: "COMMAND [flags] [ARG...]",
	example: `den ssh-key add ~/.ssh/id_ed25519.pub
		den ssh-key add --sandbox web --name ci ci_key.pub
		den ssh-key ls
		den ssh-key rm 3f2a`,
	run:   cmdGroup,
	group: true,
}

var verbSSHKeyAdd = &verb{
	name:     "ssh-key add",
	summary:  "authorise a public key for den's SSH gateway",
	synopsis: "[flags] KEYFILE|-",
	details: `Authorises the public key in KEYFILE (a .pub file; - reads standard input)
for ssh -p PORT ID@HOST through den's SSH gateway (den serve --ssh). The key
acts for whoever adds it: added with the admin's credentials it reaches every
sandbox, added with a scoped token (den token) only that token's sandboxes.
--sandbox restricts it further to one sandbox. A key is authorised once: to
change its scope, remove it and add it again.`,
	example: `den ssh-key add ~/.ssh/id_ed25519.pub
		den ssh-key add --sandbox web --name laptop ~/.ssh/id_ed25519.pub
		cat key.pub | den ssh-key add -`,
	run: cmdSSHKeyAdd,
}

var verbSSHKeyLs = &verb{
	name:     "ssh-key ls",
	summary:  "list the keys authorised for den's SSH gateway",
	synopsis: "[flags]",
	details:  "Lists every key for the admin, a scoped token's own keys for that token.",
	example: `den ssh-key ls
		den ssh-key ls --json`,
	run: cmdSSHKeyLs,
}

var verbSSHKeyRm = &verb{
	name:     "ssh-key rm",
	summary:  "revoke keys of den's SSH gateway",
	synopsis: "[flags] ID...",
	details:  "Revokes the keys (by id, id prefix or name) and prints each id. New logins with them are refused; sessions already open go on until they end.",
	example:  `den ssh-key rm 3f2a`,
	run:      cmdSSHKeyRm,
}

// maxKeyFile bounds what ssh-key add reads.
const maxKeyFile = 64 << 10

func cmdSSHKeyAdd(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	name := f.String("name", "n", "NAME", "a label for the key (default: the key's comment)")
	sandbox := f.String("sandbox", "s", "ID", "restrict the key to this sandbox")
	jsonOut := f.jsonFlag("print the key as JSON")
	pos, err := c.exactly(f, v, args, 1, "ssh-key add needs one KEYFILE (a .pub file) or - for standard input")
	if err != nil {
		return err
	}
	var r io.Reader
	if pos[0] == "-" {
		r = c.stdin
	} else {
		fh, err := os.Open(pos[0])
		if err != nil {
			return fmt.Errorf("read the key: %w", err)
		}
		defer fh.Close()
		r = fh
	}
	line, err := keyLine(io.LimitReader(r, maxKeyFile))
	if err != nil {
		return err
	}
	k, err := c.client(f).AddSSHKey(context.Background(), api.SSHKeyRequest{PublicKey: line, Name: *name, Sandbox: *sandbox})
	if err != nil {
		return err
	}
	return c.printResult(*jsonOut, k, k.ID)
}

// keyLine returns the one key line of a .pub file (blank lines and
// comments skipped).
func keyLine(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 16<<10), maxKeyFile)
	var lines []string
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read the key: %w", err)
	}
	switch {
	case len(lines) == 0:
		return "", fmt.Errorf("no key in the input: give a public key file like ~/.ssh/id_ed25519.pub")
	case len(lines) > 1:
		return "", fmt.Errorf("the input has %d keys: add one key at a time", len(lines))
	}
	return lines[0], nil
}

func cmdSSHKeyLs(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag("print the keys as a JSON array")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef(v, "ssh-key ls takes no arguments (got %q)", pos[0])
	}
	keys, err := c.client(f).SSHKeys(context.Background())
	if err != nil {
		return err
	}
	if keys == nil {
		keys = []*api.SSHKey{}
	}
	if *jsonOut {
		return c.printJSON(keys)
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "ID\tNAME\tTYPE\tFINGERPRINT\tSANDBOX\tOWNER\tCREATED")
	now := time.Now()
	for _, k := range keys {
		sb, owner := k.Sandbox, k.Owner
		if sb == "" {
			sb = "(any)"
		} else {
			sb = shortID(sb)
		}
		if owner == "" {
			owner = "admin"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", shortID(k.ID), k.Name, k.Type, k.Fingerprint, sb, owner, ago(k.CreatedAt, now))
	}
	return tw.Flush()
}

func cmdSSHKeyRm(c *cli, v *verb, args []string) error {
	return c.eachArg(v, args, "ssh-key rm needs at least one key ID (see den ssh-key ls)", func(cl *client.Client, id string) error {
		return cl.RemoveSSHKey(context.Background(), id)
	})
}
