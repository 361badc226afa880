package mcp

import (
	"context"
	"errors"
	"strings"

	"github.com/den-dev/den/api"
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
		Description: "Roll a sandbox back in place to one of its snapshots (from the snapshot tool): its files become the snapshot's, its processes start again (or, for a memory snapshot, continue from it)."}, s.restore)
	addTool(s, srv, &sdk.Tool{Name: "commit", Annotations: changes("Make an image of a sandbox", false, false),
		Description: "Make an image of a sandbox's files as they are, for sandbox_create's image: its changes become a layer on top of its image, with its env, workdir and user."}, s.commit)
	addTool(s, srv, &sdk.Tool{Name: "diff", Annotations: readOnly("Show a git workspace's changes"),
		Description: "Show what changed in a sandbox's git workspace (/workspace of a sandbox created with git) since the commit it was cloned at, committed inside or not: the commits, the changed files and the patch (git diff --binary; git apply takes it)."}, s.diff)
}

const (
	stPause = iota
	stResume
	stHibernate
)

// sandboxState is the handler of pause, resume or hibernate.
func (s *server) sandboxState(op int) sdk.ToolHandlerFor[sandboxArg, sandboxOut] {
	return func(ctx context.Context, req *sdk.CallToolRequest, in sandboxArg) (*sdk.CallToolResult, sandboxOut, error) {
		c, id, err := s.call(req, in)
		if err != nil {
			return nil, sandboxOut{}, err
		}
		do := [...]func(context.Context, string) (*api.Sandbox, error){stPause: c.Pause, stResume: c.Resume, stHibernate: c.Hibernate}[op]
		sb, err := do(ctx, id)
		if err != nil {
			return nil, sandboxOut{}, toolError(err)
		}
		return nil, sandboxOut{Sandbox: sb}, nil
	}
}

type restoreIn struct {
	sandboxArg
	Snapshot string `json:"snapshot" jsonschema:"the snapshot's id or name (from the snapshot tool)"`
}

func (s *server) restore(ctx context.Context, req *sdk.CallToolRequest, in restoreIn) (*sdk.CallToolResult, sandboxOut, error) {
	c, id, err := s.call(req, in.sandboxArg)
	if err != nil {
		return nil, sandboxOut{}, err
	}
	if strings.TrimSpace(in.Snapshot) == "" {
		return nil, sandboxOut{}, errors.New(`invalid: "snapshot" is empty: pass the id or name the snapshot tool returned`)
	}
	sb, err := c.Restore(ctx, id, in.Snapshot)
	if err != nil {
		return nil, sandboxOut{}, toolError(err)
	}
	return nil, sandboxOut{Sandbox: sb}, nil
}

type commitIn struct {
	sandboxArg
	Name string `json:"name" jsonschema:"the new image's name, like myapp:v1"`
}

type imageOut struct {
	Image *api.Image `json:"image"`
}

func (s *server) commit(ctx context.Context, req *sdk.CallToolRequest, in commitIn) (*sdk.CallToolResult, imageOut, error) {
	c, id, err := s.call(req, in.sandboxArg)
	if err != nil {
		return nil, imageOut{}, err
	}
	img, err := c.Commit(ctx, id, api.CommitRequest{Name: in.Name})
	if err != nil {
		return nil, imageOut{}, toolError(err)
	}
	return nil, imageOut{Image: img}, nil
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

func (s *server) diff(ctx context.Context, req *sdk.CallToolRequest, in sandboxArg) (*sdk.CallToolResult, diffOut, error) {
	c, id, err := s.call(req, in)
	if err != nil {
		return nil, diffOut{}, err
	}
	d, err := c.Diff(ctx, id)
	if err != nil {
		return nil, diffOut{}, toolError(err)
	}
	var patch bounded
	patch.Write(d.Patch)
	out := diffOut{Source: d.Source, Branch: d.Branch, Base: d.Base, Head: d.Head, Commits: d.Commits, Files: d.Files,
		Patch: patch.String(), Truncated: patch.cut()}
	if out.Commits == nil {
		out.Commits = []api.DiffCommit{}
	}
	if out.Files == nil {
		out.Files = []api.DiffFile{}
	}
	return nil, out, nil
}
