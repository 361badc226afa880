package mcp

import (
	"context"
	"errors"
	"strings"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tools that put a sandbox to sleep and wake it, roll it back, make an
// image of it, and show what changed in its git workspace.

func (s *server) addLifecycleTools(srv *sdk.Server) {
	addTool(s, srv, &sdk.Tool{Name: "pause", Annotations: changes("Pause a sandbox", false, true),
		Description: "Freeze every process of a running sandbox: no CPU is used, memory and connections are kept. exec, file tools and traffic to its ports resume it; sandbox_list, process_list and process_logs without wait do not."}, s.sandboxState(stPause))
	addTool(s, srv, &sdk.Tool{Name: "resume", Annotations: changes("Resume a sandbox", false, true),
		Description: "Bring a paused or hibernated sandbox back; resumed in the result says whether its processes continued (thawed, restored) or were started anew (restarted)."}, s.sandboxState(stResume))
	addTool(s, srv, &sdk.Tool{Name: "hibernate", Annotations: changes("Hibernate a sandbox", false, true),
		Description: "Free a sandbox's memory and keep its files. On gvisor and microvm its processes and memory are saved and resume restores them; on linux its processes end and resume starts it again with its files and services."}, s.sandboxState(stHibernate))
	addTool(s, srv, &sdk.Tool{Name: "restore", Annotations: changes("Roll a sandbox back to a snapshot", true, true),
		Description: "Roll a sandbox back in place to one of its snapshots (from the snapshot tool): its files become the snapshot's, its processes start again (or, for a memory snapshot, continue from it)."}, onSandbox(s, s.restore))
	addTool(s, srv, &sdk.Tool{Name: "commit", Annotations: changes("Make an image of a sandbox", false, false),
		Description: "Make an image of a sandbox's files as they are, for sandbox_create's image: its changes become a layer on top of its image, with its env, workdir and user."}, onSandbox(s, s.commit))
	addTool(s, srv, &sdk.Tool{Name: "diff", Annotations: readOnly("Show a git workspace's changes"),
		Description: "Show what changed in a sandbox's git workspace (/workspace of a sandbox created with git) since the commit it was cloned at, committed inside or not: the commits, the changed files and the patch (git diff --binary; git apply takes it)."}, onSandbox(s, s.diff))
}

const (
	stPause = iota
	stResume
	stHibernate
)

// sandboxState is the handler of pause, resume or hibernate.
func (s *server) sandboxState(op int) sdk.ToolHandlerFor[sandboxArg, sandboxOut] {
	return onSandbox(s, func(ctx context.Context, c *client.Client, id string, in sandboxArg) (sandboxOut, error) {
		do := [...]func(context.Context, string) (*api.Sandbox, error){stPause: c.Pause, stResume: c.Resume, stHibernate: c.Hibernate}[op]
		sb, err := do(ctx, id)
		return sandboxOut{Sandbox: sb}, err
	})
}

type restoreIn struct {
	sandboxArg
	Snapshot string `json:"snapshot" jsonschema:"the snapshot's id or name (from the snapshot tool)"`
}

func (s *server) restore(ctx context.Context, c *client.Client, id string, in restoreIn) (sandboxOut, error) {
	if strings.TrimSpace(in.Snapshot) == "" {
		return sandboxOut{}, errors.New(`invalid: "snapshot" is empty: pass the id or name the snapshot tool returned`)
	}
	sb, err := c.Restore(ctx, id, in.Snapshot)
	return sandboxOut{Sandbox: sb}, err
}

type commitIn struct {
	sandboxArg
	Name string `json:"name" jsonschema:"the new image's name, like myapp:v1"`
}

type imageOut struct {
	Image *api.Image `json:"image"`
}

func (s *server) commit(ctx context.Context, c *client.Client, id string, in commitIn) (imageOut, error) {
	img, err := c.Commit(ctx, id, api.CommitRequest{Name: in.Name})
	return imageOut{Image: img}, err
}

type diffOut struct {
	Source    string           `json:"source" jsonschema:"what the workspace was cloned from"`
	Branch    string           `json:"branch" jsonschema:"the branch inside the sandbox"`
	Base      string           `json:"base" jsonschema:"the commit the workspace started from"`
	Head      string           `json:"head" jsonschema:"a commit holding the workspace's files as they are"`
	Commits   []api.DiffCommit `json:"commits" jsonschema:"base..head, oldest first: those made inside, then one with the uncommitted changes"`
	Files     []api.DiffFile   `json:"files" jsonschema:"the changed paths: status A, M, D, R (with old_path) or T"`
	Patch     string           `json:"patch" jsonschema:"git diff --binary base head"`
	Truncated bool             `json:"truncated,omitempty" jsonschema:"the patch was cut to its start and end (files lists every change)"`
}

func (s *server) diff(ctx context.Context, c *client.Client, id string, in sandboxArg) (diffOut, error) {
	d, err := c.Diff(ctx, id)
	if err != nil {
		return diffOut{}, err
	}
	var patch bounded
	patch.Write(d.Patch)
	return diffOut{Source: d.Source, Branch: d.Branch, Base: d.Base, Head: d.Head, Commits: orEmpty(d.Commits), Files: orEmpty(d.Files),
		Patch: patch.String(), Truncated: patch.cut()}, nil
}
