package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/den-dev/den/internal/mcp"
	"github.com/den-dev/den/internal/server"
)

var verbMCP = &verb{
	name:     "mcp",
	summary:  "serve den's tools to an agent over MCP (stdio)",
	synopsis: "[flags]",
	details: `Serves the Model Context Protocol on standard input and output, for an
MCP client that starts den as a subprocess. Every tool acts through the
daemon's API as this user, with DEN_HOST and DEN_TOKEN (or --host) like
every other verb, so a scoped token limits what the agent can reach.
Tools take an explicit sandbox id: sandbox_create, sandbox_list,
sandbox_remove, exec, process_list, process_logs, process_kill,
process_write_stdin, read_file, write_file, edit_file, list_files, glob,
grep, port_url, snapshot, fork, net_policy (docs/mcp.md).

The daemon serves the same tools over streamable HTTP at /mcp.
With --list, den mcp prints the tools instead of serving them.`,
	example: `claude mcp add den -- den mcp
		den mcp --list
		den mcp --list --json`,
	run: cmdMCP,
}

func cmdMCP(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	list := f.Bool("list", "", "print the tools and their descriptions instead of serving")
	jsonOut := f.jsonFlag("with --list: print the tools (with their input and output schemas) as JSON")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef(v, "mcp takes no arguments (got %q)", strings.Join(pos, " "))
	}
	if *jsonOut && !*list {
		return usagef(v, "--json goes with --list: served MCP is JSON-RPC already")
	}
	if *list {
		tools := mcp.Tools(version)
		if *jsonOut {
			return c.printJSON(tools)
		}
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "TOOL\tDESCRIPTION")
		for _, t := range tools {
			d, _, _ := strings.Cut(t.Description, ". ")
			fmt.Fprintf(tw, "%s\t%s\n", t.Name, strings.TrimSuffix(d, "."))
		}
		return tw.Flush()
	}
	cl := c.client(f)
	ctx, stop := signalContext()
	defer stop()
	// A daemon that is down now may be up by the first tool call: warn,
	// and serve anyway.
	vctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if _, err := cl.Version(vctx); err != nil {
		fmt.Fprintf(c.stderr, "den mcp: warning: %v\n", err)
	}
	cancel()
	if err := mcp.ServeStdio(ctx, cl, version); err != nil && ctx.Err() == nil {
		return fmt.Errorf("mcp: %w", err)
	}
	return nil
}

// mcpHandler is the daemon's /mcp: every tool call acts, through an
// in-process client, for the principal the request was authenticated as.
// The returned function stops it.
func mcpHandler(h *server.Server, log *slog.Logger) (http.Handler, func()) {
	ip := server.NewInProcess(h)
	hh := mcp.HTTPHandler(ip.ClientFor(), mcp.HTTPOptions{Version: version, User: server.CallerID, Logger: log})
	return hh, func() { ip.Close() }
}
