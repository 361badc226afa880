package mcp

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tools in this file manage sandboxes, processes, ports, snapshots and the
// network; exec.go runs commands and files.go works on files.

// sandboxArg is the argument every tool but sandbox_create and
// sandbox_list takes.
type sandboxArg struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox: its id, a unique id prefix of 4 or more characters, or its name"`
}

func (a sandboxArg) id() (string, error) {
	if strings.TrimSpace(a.Sandbox) == "" {
		return "", errors.New(`invalid: "sandbox" is empty: pass a sandbox id (sandbox_list shows them, sandbox_create makes one)`)
	}
	return a.Sandbox, nil
}

// arg is the sandbox argument of a tool's input (promoted to every input
// that embeds sandboxArg).
func (a sandboxArg) arg() sandboxArg { return a }

// withClient makes the handler of a tool from do, which gets the den
// client of the call; an API error do returns becomes a message for the
// model (toolError), and do's result is dropped.
func withClient[In, Out any](s *server, do func(ctx context.Context, c *client.Client, in In) (Out, error)) sdk.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *sdk.CallToolRequest, in In) (*sdk.CallToolResult, Out, error) {
		var zero Out
		c, err := s.clientOf(req)
		if err != nil {
			return nil, zero, err
		}
		out, err := do(ctx, c, in)
		if err != nil {
			return nil, zero, toolError(err)
		}
		return nil, out, nil
	}
}

// onSandbox makes the handler of a tool that acts on one sandbox: as
// withClient, after checking the input names a sandbox; do gets its id.
func onSandbox[In interface{ arg() sandboxArg }, Out any](s *server, do func(ctx context.Context, c *client.Client, id string, in In) (Out, error)) sdk.ToolHandlerFor[In, Out] {
	h := withClient(s, func(ctx context.Context, c *client.Client, in In) (Out, error) {
		return do(ctx, c, in.arg().Sandbox, in)
	})
	return func(ctx context.Context, req *sdk.CallToolRequest, in In) (*sdk.CallToolResult, Out, error) {
		if _, err := in.arg().id(); err != nil {
			var zero Out
			return nil, zero, err
		}
		return h(ctx, req, in)
	}
}

// parseDuration sets *dst to the duration v, the argument name, unless v
// is empty.
func parseDuration(name, v string, dst *api.Duration) error {
	if v == "" {
		return nil
	}
	d, err := api.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("invalid: %s: %v", name, err)
	}
	*dst = d
	return nil
}

// orEmpty is v, or an empty slice for nil: a list in a tool's result is
// [], never null.
func orEmpty[T any](v []T) []T {
	if v == nil {
		return []T{}
	}
	return v
}

// toolError makes an API error a message for the model: its kind, the
// daemon's words, and what to do next.
func toolError(err error) error {
	var ae *api.Error
	if !errors.As(err, &ae) {
		return err
	}
	msg := ae.Kind + ": " + ae.Message
	if ae.Field != "" && !strings.Contains(ae.Message, ae.Field) {
		msg = ae.Kind + ": " + ae.Field + ": " + ae.Message
	}
	low := strings.ToLower(ae.Message)
	switch {
	case ae.Kind == api.KindNotFound && strings.Contains(low, "no sandbox"):
		msg += " (sandbox_list shows the sandboxes you can use; sandbox_create makes one)"
	case ae.Kind == api.KindNotFound && strings.Contains(low, "process"):
		msg += " (process_list shows the sandbox's processes)"
	case ae.Kind == api.KindConflict && (strings.Contains(low, "stopped") || strings.Contains(low, "not running")):
		msg += " (the sandbox must be running)"
	case ae.Kind == api.KindUnauthorized:
		msg += " (this token may not use that sandbox)"
	}
	return errors.New(msg)
}

var (
	yes = true
	no  = false
)

func readOnly(title string) *sdk.ToolAnnotations {
	return &sdk.ToolAnnotations{Title: title, ReadOnlyHint: true, OpenWorldHint: &no}
}

func changes(title string, destructive, idempotent bool) *sdk.ToolAnnotations {
	return &sdk.ToolAnnotations{Title: title, DestructiveHint: &destructive, IdempotentHint: idempotent, OpenWorldHint: &no}
}

func (s *server) addTools(srv *sdk.Server) {
	addTool(s, srv, &sdk.Tool{Name: "sandbox_create", Annotations: changes("Create a sandbox", false, false),
		Description: "Create and start a sandbox (a Linux computer of its own) and return it; pass its id as \"sandbox\" to the other tools. By default it has the host's OS image and no network."}, withClient(s, s.sandboxCreate))
	addTool(s, srv, &sdk.Tool{Name: "sandbox_list", Annotations: readOnly("List sandboxes"),
		Description: "List the sandboxes you can use, optionally only those with all the given labels."}, withClient(s, s.sandboxList))
	addTool(s, srv, &sdk.Tool{Name: "sandbox_remove", Annotations: changes("Remove a sandbox", true, true),
		Description: "Stop and remove a sandbox with its files and processes. Its snapshots are kept."}, onSandbox(s, s.sandboxRemove))
	addTool(s, srv, &sdk.Tool{Name: "exec", Annotations: changes("Run a command", true, false),
		Description: "Run a command in a sandbox and return its exit code and output (each stream bounded: the start and the end are kept). Give cmd (argv) or shell (a script for sh -c). session keeps cwd, variables and functions between calls of the same session name. background starts a process that outlives the call and returns it as process (its id, like p3, is for process_logs, process_kill and process_write_stdin). While a command runs, its output is sent as progress notifications when the client asked for progress."}, s.exec)
	addTool(s, srv, &sdk.Tool{Name: "process_list", Annotations: readOnly("List processes"),
		Description: "List a sandbox's background processes, running and recently finished."}, onSandbox(s, s.processList))
	addTool(s, srv, &sdk.Tool{Name: "process_logs", Annotations: readOnly("Read process output"),
		Description: "Return a background process's retained output (the last tail lines when tail is set). With wait, wait up to that long for the process to end first, collecting its new output."}, onSandbox(s, s.processLogs))
	addTool(s, srv, &sdk.Tool{Name: "process_kill", Annotations: changes("Signal a process", true, true),
		Description: "Send a signal (default KILL) to a background process's process group."}, onSandbox(s, s.processKill))
	addTool(s, srv, &sdk.Tool{Name: "process_write_stdin", Annotations: changes("Write to a process's stdin", false, false),
		Description: "Write text to a background process's standard input; with close, then close it (the process reads end of file)."}, onSandbox(s, s.processWriteStdin))
	s.addFileTools(srv)
	addTool(s, srv, &sdk.Tool{Name: "port_url", Annotations: changes("Share a port", false, true),
		Description: "Share a TCP port of a sandbox through den's reverse proxy and return the URL that reaches it (HTTP and WebSocket), even for a server listening only on the sandbox's 127.0.0.1. Private unless public is set: the URL then carries the preview token."}, onSandbox(s, s.portURL))
	addTool(s, srv, &sdk.Tool{Name: "snapshot", Annotations: changes("Snapshot a sandbox", false, false),
		Description: "Capture a sandbox's files (processes frozen for the instant). A snapshot can later create new sandboxes or roll this one back."}, onSandbox(s, s.snapshot))
	addTool(s, srv, &sdk.Tool{Name: "fork", Annotations: changes("Fork a sandbox", false, false),
		Description: "Make count (default 1) new running sandboxes from a sandbox's current files, to try alternatives in parallel."}, onSandbox(s, s.fork))
	s.addLifecycleTools(srv)
	addTool(s, srv, &sdk.Tool{Name: "net_policy", Annotations: changes("Show or set the network policy", false, true),
		Description: "Show a sandbox's egress policy, or set it when mode is given: none (loopback only), allow (only the allow domains, exact or *.suffix, and allow_cidr ranges) or open (any public address); deny domains win in every mode. The change is in force at once."}, onSandbox(s, s.netPolicy))
}

// Sandboxes.

type createIn struct {
	Name        string            `json:"name,omitempty" jsonschema:"a unique name, usable instead of the id"`
	Image       string            `json:"image,omitempty" jsonschema:"the image (default host: the host's own OS, read-only, under a private layer)"`
	Runtime     string            `json:"runtime,omitempty" jsonschema:"the isolation tier: linux, gvisor or microvm (default: the daemon's)"`
	Labels      map[string]string `json:"labels,omitempty"`
	Env         []string          `json:"env,omitempty" jsonschema:"variables for every command, each like KEY=VALUE"`
	Workdir     string            `json:"workdir,omitempty" jsonschema:"the default working directory"`
	Memory      string            `json:"memory,omitempty" jsonschema:"memory limit, like 1g or 512m"`
	CPUs        float64           `json:"cpus,omitempty" jsonschema:"CPU limit, like 1.5"`
	Disk        string            `json:"disk,omitempty" jsonschema:"disk quota of its writable layer, like 10g"`
	TTL         string            `json:"ttl,omitempty" jsonschema:"remove it after this long, like 2h"`
	IdleTimeout string            `json:"idle_timeout,omitempty" jsonschema:"stop it after this long without use, like 30m"`
	Pids        int               `json:"pids,omitempty" jsonschema:"most processes (and threads) it may have at once"`
	Network     string            `json:"network,omitempty" jsonschema:"egress mode: none (default), allow or open"`
	Allow       []string          `json:"allow,omitempty" jsonschema:"with network allow: the domains it may reach (exact or *.suffix)"`
	AllowCIDR   []string          `json:"allow_cidr,omitempty" jsonschema:"with network allow: address ranges it may reach, like 10.0.0.0/8"`
	Deny        []string          `json:"deny,omitempty" jsonschema:"domains refused in every network mode"`
	Git         *api.GitSource    `json:"git,omitempty" jsonschema:"clone a repository into /workspace on a branch of its own (url, and branch to start from); diff shows the changes"`
}

type sandboxOut struct {
	Sandbox *api.Sandbox `json:"sandbox"`
}

type sandboxesOut struct {
	Sandboxes []*api.Sandbox `json:"sandboxes"`
}

func (s *server) sandboxCreate(ctx context.Context, c *client.Client, in createIn) (sandboxOut, error) {
	cr := api.CreateRequest{Name: in.Name, Image: in.Image, Runtime: in.Runtime, Labels: in.Labels, Env: in.Env, Workdir: in.Workdir}
	cr.Limits.CPUs, cr.Limits.Pids, cr.Git = in.CPUs, in.Pids, in.Git
	for _, f := range []struct {
		name, v string
		dst     *api.Size
	}{{"memory", in.Memory, &cr.Limits.Memory}, {"disk", in.Disk, &cr.Limits.Disk}} {
		if f.v == "" {
			continue
		}
		if err := f.dst.UnmarshalJSON(strconv.AppendQuote(nil, f.v)); err != nil {
			return sandboxOut{}, fmt.Errorf("invalid: %s: %v", f.name, err)
		}
	}
	if err := parseDuration("ttl", in.TTL, &cr.TTL); err != nil {
		return sandboxOut{}, err
	}
	if err := parseDuration("idle_timeout", in.IdleTimeout, &cr.IdleTimeout); err != nil {
		return sandboxOut{}, err
	}
	if in.Network != "" || len(in.Allow)+len(in.AllowCIDR)+len(in.Deny) > 0 {
		cr.Network = &api.NetworkPolicy{Mode: in.Network, Allow: in.Allow, AllowCIDR: in.AllowCIDR, Deny: in.Deny}
	}
	sb, err := c.Create(ctx, cr)
	return sandboxOut{Sandbox: sb}, err
}

type listIn struct {
	Labels map[string]string `json:"labels,omitempty" jsonschema:"only sandboxes with all these labels"`
}

func (s *server) sandboxList(ctx context.Context, c *client.Client, in listIn) (sandboxesOut, error) {
	list, err := c.List(ctx, in.Labels)
	return sandboxesOut{Sandboxes: orEmpty(list)}, err
}

type removedOut struct {
	Removed string `json:"removed" jsonschema:"the id of the removed sandbox"`
}

func (s *server) sandboxRemove(ctx context.Context, c *client.Client, id string, in sandboxArg) (removedOut, error) {
	sb, err := c.Get(ctx, id)
	if err != nil {
		return removedOut{}, err
	}
	if err := c.Remove(ctx, sb.ID, true); err != nil {
		return removedOut{}, err
	}
	return removedOut{Removed: sb.ID}, nil
}

// Processes.

type processIn struct {
	sandboxArg
	Process string `json:"process" jsonschema:"the process id, like p3 (from exec with background, or process_list)"`
}

type processesOut struct {
	Processes []*api.ProcessInfo `json:"processes"`
}

func (s *server) processList(ctx context.Context, c *client.Client, id string, in sandboxArg) (processesOut, error) {
	list, err := c.Processes(ctx, id)
	return processesOut{Processes: orEmpty(list)}, err
}

type logsIn struct {
	processIn
	Tail int    `json:"tail,omitempty" jsonschema:"only the last this many lines of the retained output"`
	Wait string `json:"wait,omitempty" jsonschema:"wait up to this long (like 30s) for the process to end, collecting its new output"`
}

type logsOut struct {
	Stdout    string          `json:"stdout"`
	Stderr    string          `json:"stderr"`
	Truncated bool            `json:"truncated,omitempty" jsonschema:"output was cut to its start and end"`
	Running   bool            `json:"running" jsonschema:"the process had not ended when the output was read"`
	Exit      *api.ExitStatus `json:"exit,omitempty" jsonschema:"how the process ended"`
}

func (s *server) processLogs(ctx context.Context, c *client.Client, id string, in logsIn) (logsOut, error) {
	if in.Tail < 0 {
		return logsOut{}, errors.New("invalid: tail must not be negative")
	}
	opts := client.LogsOptions{Tail: in.Tail}
	if in.Wait != "" {
		var d api.Duration
		if err := parseDuration("wait", in.Wait, &d); err != nil {
			return logsOut{}, err
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.D())
		defer cancel()
		opts.Follow = true
	}
	var out, errb bounded
	st, err := c.Logs(ctx, id, in.Process, opts, &out, &errb)
	if err != nil && !(opts.Follow && ctx.Err() != nil) {
		return logsOut{}, err
	}
	return logsOut{Stdout: out.String(), Stderr: errb.String(), Truncated: out.cut() || errb.cut(), Running: st == nil, Exit: st}, nil
}

type killIn struct {
	processIn
	Signal string `json:"signal,omitempty" jsonschema:"the signal: TERM, INT, HUP, KILL (default) or a number"`
}

type okOut struct {
	OK bool `json:"ok"`
}

func (s *server) processKill(ctx context.Context, c *client.Client, id string, in killIn) (okOut, error) {
	return okOut{OK: true}, c.Kill(ctx, id, in.Process, in.Signal)
}

type stdinIn struct {
	processIn
	Data  string `json:"data" jsonschema:"the text to write (add a newline to end a line)"`
	Close bool   `json:"close,omitempty" jsonschema:"close the input after writing"`
}

func (s *server) processWriteStdin(ctx context.Context, c *client.Client, id string, in stdinIn) (okOut, error) {
	return okOut{OK: true}, c.WriteStdin(ctx, id, in.Process, strings.NewReader(in.Data), in.Close)
}

// Ports, snapshots, forks, network.

type portIn struct {
	sandboxArg
	Port   int  `json:"port" jsonschema:"the TCP port inside the sandbox (1-65535)"`
	Public bool `json:"public,omitempty" jsonschema:"reachable without the preview token"`
}

type portOut struct {
	URL     string       `json:"url" jsonschema:"where the port is reached (with its token when private): the host form, where the preview is the site's root, when there is one"`
	PathURL string       `json:"path_url,omitempty" jsonschema:"the path form /preview/ID/PORT/ of it, for servers with relative links or that base"`
	Socket  string       `json:"socket,omitempty" jsonschema:"the daemon's unix socket, when the URL is reached through it"`
	Preview *api.Preview `json:"preview"`
}

func (s *server) portURL(ctx context.Context, c *client.Client, id string, in portIn) (portOut, error) {
	if in.Port < 1 || in.Port > 65535 {
		return portOut{}, fmt.Errorf("invalid: port %d is not from 1 to 65535", in.Port)
	}
	p, err := c.SharePort(ctx, id, in.Port, in.Public)
	if err != nil {
		return portOut{}, err
	}
	l, err := c.PreviewURLs(ctx, p)
	if err != nil {
		return portOut{}, err
	}
	return portOut{URL: l.URL(), PathURL: l.PathURL, Socket: l.Socket, Preview: p}, nil
}

type snapshotIn struct {
	sandboxArg
	Name   string `json:"name,omitempty" jsonschema:"a unique name for the snapshot"`
	Memory bool   `json:"memory,omitempty" jsonschema:"keep the running processes and memory too (gvisor and microvm sandboxes)"`
}

type snapshotOut struct {
	Snapshot *api.Snapshot `json:"snapshot"`
}

func (s *server) snapshot(ctx context.Context, c *client.Client, id string, in snapshotIn) (snapshotOut, error) {
	snap, err := c.Snapshot(ctx, id, api.SnapshotRequest{Name: in.Name, Memory: in.Memory})
	return snapshotOut{Snapshot: snap}, err
}

type forkIn struct {
	sandboxArg
	Count  int               `json:"count,omitempty" jsonschema:"how many forks (1 to 64, default 1)"`
	Labels map[string]string `json:"labels,omitempty" jsonschema:"labels set on every fork"`
	Memory bool              `json:"memory,omitempty" jsonschema:"forks keep the source's running processes and memory (gvisor and microvm sandboxes)"`
}

func (s *server) fork(ctx context.Context, c *client.Client, id string, in forkIn) (sandboxesOut, error) {
	list, err := c.Fork(ctx, id, api.ForkRequest{Count: in.Count, Labels: in.Labels, Memory: in.Memory})
	return sandboxesOut{Sandboxes: list}, err
}

type netIn struct {
	sandboxArg
	Mode      string   `json:"mode,omitempty" jsonschema:"none, allow or open; leave out to only show the policy"`
	Allow     []string `json:"allow,omitempty" jsonschema:"domains it may reach in mode allow: exact, or *.suffix"`
	Deny      []string `json:"deny,omitempty" jsonschema:"domains refused in every mode"`
	AllowCIDR []string `json:"allow_cidr,omitempty" jsonschema:"address ranges it may reach, like 10.0.0.0/8"`
}

type netOut struct {
	Sandbox string            `json:"sandbox"`
	Network api.NetworkPolicy `json:"network"`
	Address string            `json:"address,omitempty" jsonschema:"the sandbox's address on den's bridge"`
}

func (s *server) netPolicy(ctx context.Context, c *client.Client, id string, in netIn) (netOut, error) {
	var sb *api.Sandbox
	var err error
	if in.Mode == "" && len(in.Allow)+len(in.Deny)+len(in.AllowCIDR) == 0 {
		sb, err = c.Get(ctx, id)
	} else {
		if in.Mode == "" {
			return netOut{}, errors.New("invalid: mode: give none, allow or open with allow, deny or allow_cidr")
		}
		sb, err = c.SetNetwork(ctx, id, api.NetworkPolicy{Mode: in.Mode, Allow: in.Allow, Deny: in.Deny, AllowCIDR: in.AllowCIDR})
	}
	if err != nil {
		return netOut{}, err
	}
	return netOut{Sandbox: sb.ID, Network: sb.Network, Address: sb.Address}, nil
}
