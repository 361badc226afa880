package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Issue 8's target: an exec of true through MCP over stdio p50 ≤ 5 ms.
const (
	mcpN       = 500
	mcpLimitMs = 5.0
)

// mcpScenario: the MCP exec round trip of true over stdio (this den binary
// as `den mcp`, through the MCP SDK's command transport) and over the
// daemon's /mcp (streamable HTTP, when the daemon is on a unix socket),
// beside the same exec through the HTTP API (the SDK's Exec) as the
// reference.
func (b *runner) mcpScenario(ctx context.Context) error {
	n := b.iterations(mcpN)
	sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
	if err != nil {
		return fmt.Errorf("create a sandbox: %w", err)
	}
	defer b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)

	argv := b.denCommand("mcp")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	mc := sdk.NewClient(&sdk.Implementation{Name: "den-bench", Version: b.o.Version}, nil)
	stdio, err := mc.Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return fmt.Errorf("start %s: %w", Quote(argv), err)
	}
	defer stdio.Close()
	var streamable *sdk.ClientSession
	if sock, ok := strings.CutPrefix(b.cl.Addr(), "unix://"); ok {
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}
		defer tr.CloseIdleConnections()
		streamable, err = mc.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: "http://den/mcp", HTTPClient: &http.Client{Transport: tr}}, nil)
		if err != nil {
			return fmt.Errorf("connect to the daemon's /mcp: %w", err)
		}
		defer streamable.Close()
	}

	args := map[string]any{"sandbox": sb.ID, "cmd": []string{"true"}}
	mcpExec := func(cs *sdk.ClientSession, what string) func(ctx context.Context) (time.Duration, error) {
		return func(ctx context.Context) (time.Duration, error) {
			t0 := time.Now()
			res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "exec", Arguments: args})
			d := time.Since(t0)
			if err != nil {
				return d, fmt.Errorf("%s: %w", what, err)
			}
			var out struct {
				ExitCode int    `json:"exit_code"`
				Reason   string `json:"reason"`
			}
			raw, _ := json.Marshal(res.StructuredContent)
			if res.IsError || json.Unmarshal(raw, &out) != nil || out.ExitCode != 0 || out.Reason != api.ReasonExited {
				return d, fmt.Errorf("%s: true in sandbox %s: %s", what, shortID(sb.ID), raw)
			}
			return d, nil
		}
	}
	var viaStdio, viaHTTP, viaAPI []time.Duration
	steps := []step{timed(&viaStdio, mcpExec(stdio, "MCP over stdio"))}
	if streamable != nil {
		steps = append(steps, timed(&viaHTTP, mcpExec(streamable, "MCP over streamable HTTP")))
	}
	steps = append(steps, timed(&viaAPI, func(ctx context.Context) (time.Duration, error) {
		t0 := time.Now()
		res, err := b.cl.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
		d := time.Since(t0)
		if err == nil && (res.ExitCode != 0 || res.Reason != api.ReasonExited) {
			err = fmt.Errorf("true ended %s %d", res.Reason, res.ExitCode)
		}
		return d, err
	}))
	err = b.loop(ctx, "mcp", n, steps...)
	if len(viaStdio) == 0 {
		return err
	}
	sr := statsRow("mcp", "MCP exec true over stdio (den mcp)", viaStdio)
	ar := statsRow("mcp", "HTTP API exec true (SDK Exec, reference)", viaAPI)
	sr.compare(ar, "HTTP API p50")
	sr.judge(fmt.Sprintf("p50 ≤ %gms", mcpLimitMs), sr.p50(), mcpLimitMs)
	rows := []*Row{sr}
	if len(viaHTTP) > 0 {
		hr := statsRow("mcp", "MCP exec true over streamable HTTP (/mcp)", viaHTTP)
		hr.compare(ar, "HTTP API p50")
		rows = append(rows, hr)
	}
	b.add(append(rows, ar)...)
	return err
}
