// Package mcp is den's Model Context Protocol server: tools with which an
// agent creates sandboxes, runs commands and background processes in them,
// reads, writes, edits and searches their files, shares their ports,
// snapshots and forks them and sets their network policy. Every tool names
// its sandbox explicitly (there is no hidden current sandbox) and acts
// through a den API client (package client), so a tool call is authorised
// and scoped exactly like the API route it uses.
//
// It is served over stdio by `den mcp`, whose client talks to a daemon like
// every other verb, and over streamable HTTP by the daemon itself at /mcp,
// where each request's client acts for the caller the daemon authenticated.
package mcp

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// instructions tell the model how the tools fit together.
const instructions = `den gives you Linux sandboxes: each is a real computer with a shell, package managers and a private copy-on-write filesystem. Create one with sandbox_create (or find yours with sandbox_list) and pass its id as "sandbox" to every other tool. Run commands with exec (background: true for servers, then process_logs / process_kill); read_file, write_file and edit_file work on files inside the sandbox, glob and grep search them. Paths are always resolved inside the sandbox.`

// server holds the tools and how a call finds its den client.
type server struct {
	// clientOf returns the den client a tool call acts through.
	clientOf func(req *sdk.CallToolRequest) (*client.Client, error)
	// tools are those added, in order.
	tools []*sdk.Tool
}

// newServer builds the MCP server with every tool.
func newServer(version string, clientOf func(*sdk.CallToolRequest) (*client.Client, error)) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: "den", Title: "den sandboxes", Version: version},
		&sdk.ServerOptions{Instructions: instructions})
	(&server{clientOf: clientOf}).addTools(s)
	return s
}

// ServeStdio serves MCP on standard input and output until the client
// leaves or ctx ends; every tool acts through c.
func ServeStdio(ctx context.Context, c *client.Client, version string) error {
	s := newServer(version, func(*sdk.CallToolRequest) (*client.Client, error) { return c, nil })
	return s.Run(ctx, &sdk.StdioTransport{})
}

// HTTPOptions configure HTTPHandler.
type HTTPOptions struct {
	Version string
	// User names the caller of a request. An MCP session is bound to the
	// caller that opened it: a request for it from anyone else is refused.
	User func(*http.Request) string
	// Logger, if set, receives the transport's log.
	Logger *slog.Logger
	// SessionTimeout closes sessions idle this long (default 30 minutes).
	SessionTimeout time.Duration
}

type clientKey struct{}

// HTTPHandler serves MCP over the streamable HTTP transport. clientFor
// returns the den client acting for a request's caller, or nil when the
// request carries no authenticated caller (answered 401).
func HTTPHandler(clientFor func(*http.Request) *client.Client, opts HTTPOptions) http.Handler {
	if opts.SessionTimeout == 0 {
		opts.SessionTimeout = 30 * time.Minute
	}
	srv := newServer(opts.Version, func(req *sdk.CallToolRequest) (*client.Client, error) {
		if req.Extra != nil && req.Extra.TokenInfo != nil {
			if c, ok := req.Extra.TokenInfo.Extra["den.client"].(*client.Client); ok {
				return c, nil
			}
		}
		return nil, errors.New("this MCP request carries no den caller")
	})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv },
		&sdk.StreamableHTTPOptions{Logger: opts.Logger, SessionTimeout: opts.SessionTimeout})
	// The SDK binds sessions to TokenInfo.UserID and hands TokenInfo to
	// every tool call; its bearer middleware is the only way to set it.
	// The daemon has already authenticated the caller, so the verifier
	// takes the caller from the request's context, not from the token.
	verify := func(ctx context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		c, _ := ctx.Value(clientKey{}).(*client.Client)
		if c == nil {
			return nil, auth.ErrInvalidToken
		}
		user := "den"
		if opts.User != nil {
			user = opts.User(r)
		}
		return &auth.TokenInfo{UserID: user, Expiration: time.Now().Add(time.Hour), Extra: map[string]any{"den.client": c}}, nil
	}
	inner := auth.RequireBearerToken(verify, nil)(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := clientFor(r)
		if c == nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":{"kind":"unauthorized","message":"no authenticated caller: send Authorization: Bearer TOKEN"}}` + "\n"))
			return
		}
		r = r.Clone(context.WithValue(r.Context(), clientKey{}, c))
		r.Header.Set("Authorization", "Bearer den-authenticated")
		inner.ServeHTTP(w, r)
	})
}

// schemaTypes are the schemas of den's wire types whose JSON differs from
// their Go kind.
var schemaTypes = map[reflect.Type]*jsonschema.Schema{
	reflect.TypeFor[api.Duration](): {Type: "string", Description: "a duration like 30s or 1h5m"},
	reflect.TypeFor[api.Size]():     {Type: "integer", Description: "bytes"},
}

// Tools describes the tools, with their schemas, in the order they are
// listed.
func Tools(version string) []*sdk.Tool {
	s := &server{}
	s.addTools(sdk.NewServer(&sdk.Implementation{Name: "den", Version: version}, nil))
	return s.tools
}

// addTool adds a typed tool whose schemas are inferred from In and Out.
func addTool[In, Out any](s *server, srv *sdk.Server, t *sdk.Tool, h sdk.ToolHandlerFor[In, Out]) {
	opts := &jsonschema.ForOptions{TypeSchemas: schemaTypes}
	in, err := jsonschema.For[In](opts)
	if err != nil {
		panic("mcp: tool " + t.Name + ": " + err.Error())
	}
	out, err := jsonschema.For[Out](opts)
	if err != nil {
		panic("mcp: tool " + t.Name + ": " + err.Error())
	}
	nonNull(in)
	t.InputSchema, t.OutputSchema = in, out
	sdk.AddTool(srv, t, h)
	s.tools = append(s.tools, t)
}

// nonNull types every argument as what it is: the schema inference makes
// slices, maps and pointers ["null", "array"] and the like, and clients
// that convert arguments by the schema's type (the MCP inspector's CLI)
// cannot pass those. A left-out argument is still left out.
func nonNull(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if len(s.Types) == 2 && slices.Contains(s.Types, "null") {
		s.Type = s.Types[0]
		if s.Type == "null" {
			s.Type = s.Types[1]
		}
		s.Types = nil
	}
	for _, m := range []map[string]*jsonschema.Schema{s.Properties, s.PatternProperties, s.Defs, s.Definitions} {
		for _, c := range m {
			nonNull(c)
		}
	}
	for _, l := range [][]*jsonschema.Schema{s.PrefixItems, s.AllOf, s.AnyOf, s.OneOf} {
		for _, c := range l {
			nonNull(c)
		}
	}
	nonNull(s.Items)
	nonNull(s.AdditionalProperties)
	nonNull(s.Not)
}
