package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbPort = &verb{
	name:     "port",
	summary:  "share a sandbox's port at a preview URL (port ls, port rm)",
	synopsis: "[flags] ID PORT | ls [flags] ID | rm [flags] ID PORT...",
	details: `Shares a TCP port of the sandbox through den's reverse proxy (HTTP and
WebSocket) and prints two URLs on the daemon's TCP listener. First the host
form, http://PORT-ID.localhost:7420/ (or PORT-ID.DOMAIN with den serve
--preview-domain), where the preview is the site's root: dev servers whose
pages load /src/main.js or open WebSockets to root-relative paths (Vite,
webpack, Next.js, Jupyter) work there. Then the path form,
http://DAEMON/preview/ID/PORT/, for servers with relative links or started
with that base (vite --base /preview/ID/PORT/); it sends X-Forwarded-Prefix.
Dev servers that check the Host header must allow the preview host (Vite:
server.allowedHosts: ['.localhost']).

The server may listen on 0.0.0.0 or only on the sandbox's 127.0.0.1, and need
not be running yet. A private preview (the default) needs the token in the URL
(?den_token=; a browser then keeps it in a cookie for that host) or the
X-Den-Token header; --public drops the token, so anyone who can reach the
daemon's listener can use it. Sharing a port again keeps its token; --rotate
makes a new one. Over the daemon's unix socket den prints the URLs on its TCP
listener, or, when it has none, the curl --unix-socket command that reaches
the preview (give den serve a TCP --listen address for browsers).

den port ls ID lists the shared ports with their URLs; den port rm ID PORT
stops sharing (the server keeps running). To reach a port that is not HTTP,
or without sharing it, use den forward. A sandbox named ls or rm is written
after --: den port -- ls 8000.`,
	example: `den exec -d web -- python3 -m http.server 8000
		den port web 8000
		den port --public web 3000
		den port --rotate web 8000
		den port ls web
		den port rm web 8000`,
	run: cmdPort,
}

var verbPortLs = &verb{
	name:     "port ls",
	summary:  "list a sandbox's shared ports and their URLs",
	synopsis: "[flags] ID",
	details:  "Prints each shared port, whether it is public or private, its URL (with the token of a private preview) and the path form of it as a fallback.",
	example: `den port ls web
		den port ls --json web | jq -r '.[].url'`,
	run: cmdPortLs,
}

var verbPortRm = &verb{
	name:     "port rm",
	summary:  "stop sharing ports of a sandbox",
	synopsis: "[flags] ID PORT...",
	details:  "The ports' preview URLs stop working (the servers inside keep running); prints each port.",
	example:  `den port rm web 8000`,
	run:      cmdPortRm,
}

// portSub returns the sub-command (ls, rm) args name, if any, and the
// arguments for it: --host may come before it.
func portSub(args []string) (*verb, []string) {
	i := 0
	for i < len(args) {
		if a := args[i]; a == "--host" || a == "-H" || a == "-host" {
			i += 2
		} else if strings.HasPrefix(a, "--host=") {
			i++
		} else {
			break
		}
	}
	if i >= len(args) {
		return nil, nil
	}
	var sub *verb
	switch args[i] {
	case "ls":
		sub = verbPortLs
	case "rm":
		sub = verbPortRm
	default:
		return nil, nil
	}
	return sub, append(append([]string(nil), args[:i]...), args[i+1:]...)
}

// parsePort reads a TCP port number.
func parsePort(v *verb, s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, usagef(v, "%q is not a TCP port (1-65535)", s)
	}
	return p, nil
}

// previewOut is a shared port as den port --json prints it: the daemon's
// answer, the URL to open (host_url when there is one, else path_url), and
// the socket path_url is reached through (for a daemon on a unix socket
// only, where path_url is the path alone).
type previewOut struct {
	*api.Preview
	client.PreviewLinks
	URL string `json:"url"`
}

func previewOf(cl *client.Client, p *api.Preview) (previewOut, error) {
	l, err := cl.PreviewURLs(context.Background(), p)
	if err != nil {
		return previewOut{}, err
	}
	return previewOut{Preview: p, PreviewLinks: l, URL: l.URL()}, nil
}

// curlCommand is the command reaching a preview through a unix socket.
func curlCommand(sock, path string) string {
	return "curl --unix-socket " + shellQuote(sock) + " " + shellQuote("http://den"+path)
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:@%+=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func cmdPort(c *cli, v *verb, args []string) error {
	if sub, rest := portSub(args); sub != nil {
		return sub.run(c, sub, rest)
	}
	f := newFlags(v)
	public := f.Bool("public", "", "no token: anyone who can reach the daemon's listener can use the preview")
	rotate := f.Bool("rotate", "", "give a private port that is already shared a new token (the old URLs stop working)")
	jsonOut := f.jsonFlag(`print JSON: the Preview (port, public, token, path, host) with its url, host_url and path_url (and socket, for a daemon on a unix socket only)`)
	pos, err := c.exactly(f, v, args, 2, "port needs a sandbox ID and a PORT, like: den port web 8000 (den port ls ID lists the shared ports)")
	if err != nil {
		return err
	}
	port, err := parsePort(v, pos[1])
	if err != nil {
		return err
	}
	cl := c.client(f)
	if *rotate && *public {
		return usagef(v, "--rotate makes a new token for a private port: a --public one has none")
	}
	p, err := cl.SharePortWith(context.Background(), pos[0], api.PortRequest{Port: port, Public: *public, Rotate: *rotate})
	if err != nil {
		return err
	}
	out, err := previewOf(cl, p)
	if err != nil {
		return err
	}
	if *jsonOut {
		return c.printJSON(out)
	}
	if out.Socket != "" {
		fmt.Fprintf(c.stderr, "the daemon listens on its unix socket only: the preview is reached through it (give den serve a TCP --listen address for browsers)\n")
		_, err = fmt.Fprintln(c.stdout, curlCommand(out.Socket, out.PathURL))
		return err
	}
	if out.HostURL != "" {
		fmt.Fprintln(c.stdout, out.HostURL)
	}
	_, err = fmt.Fprintln(c.stdout, out.PathURL)
	return err
}

func cmdPortLs(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag("print the shared ports as a JSON array (each with its url)")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef(v, "port ls needs one sandbox ID (got %d arguments)", len(pos))
	}
	cl := c.client(f)
	list, err := cl.Ports(context.Background(), pos[0])
	if err != nil {
		return err
	}
	outs := []previewOut{}
	for _, p := range list {
		o, err := previewOf(cl, p)
		if err != nil {
			return err
		}
		outs = append(outs, o)
	}
	if *jsonOut {
		return c.printJSON(outs)
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "PORT\tACCESS\tURL\tPATH URL")
	for _, o := range outs {
		access := "private"
		if o.Public {
			access = "public"
		}
		u, path := o.URL, "-"
		if o.HostURL != "" {
			path = o.PathURL
		}
		if o.Socket != "" {
			u = curlCommand(o.Socket, o.PathURL)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", o.Port, access, u, path)
	}
	return tw.Flush()
}

func cmdPortRm(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usagef(v, "port rm needs a sandbox ID and a PORT, like: den port rm web 8000")
	}
	var ports []int
	for _, s := range pos[1:] {
		p, err := parsePort(v, s)
		if err != nil {
			return err
		}
		ports = append(ports, p)
	}
	cl := c.client(f)
	return each(c, v, ports, false, func(p int) error {
		return cl.UnsharePort(context.Background(), pos[0], p)
	})
}
