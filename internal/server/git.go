package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/gitws"
	"github.com/den-dev/den/internal/sandbox"
)

// Git workspaces: POST /v1/sandboxes with "git" clones a repository into
// /workspace; diff and export read the workspace back through the agent
// (see package gitws for why the host's git never touches the sandbox's
// .git).

func (s *Server) gitRoutes() {
	s.mux.HandleFunc("GET /v1/sandboxes/{id}/diff", s.gitDiff)
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/export", s.gitExport)
}

func (s *Server) gitStore() *gitws.Store {
	return &gitws.Store{Dir: filepath.Join(s.m.DataDir(), "git")}
}

// isAdmin reports whether the request acts for the daemon's administrator
// (not a scoped token, nor a principal narrowed to one sandbox).
func isAdmin(r *http.Request) bool {
	return sandbox.ScopeFrom(r.Context()).IsAdmin()
}

// createGit creates a sandbox whose /workspace is a clone of req.Git: the
// clone is made first (a bad URL, path or branch creates nothing), then the
// sandbox, then the checkout is unpacked inside, owned by its user.
func (s *Server) createGit(w http.ResponseWriter, r *http.Request, req api.CreateRequest) {
	ctx := r.Context()
	src, err := gitws.ParseSource(req.Git.URL)
	if err != nil {
		writeError(w, err)
		return
	}
	if src.HostPath != "" && !isAdmin(r) {
		writeError(w, api.Errorf(api.KindUnauthorized, "git.url: a host path reads the host's files, which only the daemon's administrator may do; give a URL the daemon can clone"))
		return
	}
	author, err := gitws.Author(ctx, src, req.Git.Author)
	if err != nil {
		writeError(w, err)
		return
	}
	st := s.gitStore()
	// Asked for the daemon: a scoped request sees only its own sandboxes
	// and would take everyone else's workspaces for removed ones.
	daemon := sandbox.WithScope(ctx, nil)
	st.Prune(func(id string) bool {
		if _, err := s.m.Get(daemon, id); api.KindOf(err) != api.KindNotFound {
			return true
		}
		_, err := s.m.GetSnapshot(daemon, id)
		return api.KindOf(err) != api.KindNotFound
	})
	repo, err := st.Clone(ctx, src, req.Git.Branch)
	if err != nil {
		writeError(w, err)
		return
	}
	repo.Meta.Author = author
	if req.Workdir == "" {
		req.Workdir = gitws.WorkDir
	}
	sb, err := s.m.Create(ctx, req)
	if err != nil {
		repo.Discard()
		writeError(w, err)
		return
	}
	if err := s.populate(ctx, st, repo, sb.ID); err != nil {
		repo.Discard()
		st.Remove(sb.ID)
		s.m.Remove(context.WithoutCancel(ctx), sb.ID, true)
		writeError(w, fmt.Errorf("check out %s in the sandbox: %w", src.URL, err))
		return
	}
	writeJSON(w, 201, sb)
}

// carryWorkspace gives sandbox id a git workspace of its own copied from
// from's (the sandbox it was forked from, or the snapshot it was created
// from): the same source and base, on branch den/<id>, so den diff and den
// export work on it. The branch checked out inside is renamed to match
// when the sandbox has git (its files, .git included, are from's). Nothing
// happens when from has no workspace.
func (s *Server) carryWorkspace(ctx context.Context, from, id string) error {
	st := s.gitStore()
	if !st.Has(from) {
		return nil
	}
	old, err := st.Open(from)
	if err != nil {
		return err
	}
	repo, err := st.Copy(ctx, from, id, gitws.BranchPrefix+id)
	if err != nil {
		return err
	}
	script := fmt.Sprintf(`cd %s && [ "$(git -c safe.directory='*' symbolic-ref -q HEAD)" = refs/heads/%s ] && git -c safe.directory='*' branch -m %s %s`,
		gitws.WorkDir, old.Meta.WorkBranch, old.Meta.WorkBranch, repo.Meta.WorkBranch)
	if _, err := s.insideOutput(ctx, id, script, 30*time.Second); err != nil {
		s.log.Info("git workspace: branch inside not renamed", "sandbox", id, "branch", old.Meta.WorkBranch, "err", err)
	}
	return nil
}

// fork makes forks of a sandbox, each with a git workspace of its own when
// the sandbox has one.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req api.ForkRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	forks, err := s.m.Fork(r.Context(), r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	for _, f := range forks {
		if err := s.carryWorkspace(r.Context(), f.ForkOf, f.ID); err != nil {
			for _, f := range forks {
				s.m.Remove(context.WithoutCancel(r.Context()), f.ID, true)
				s.gitStore().Remove(f.ID)
			}
			writeError(w, fmt.Errorf("fork: copy the git workspace: %w", err))
			return
		}
	}
	writeJSON(w, 201, forks)
}

// restore rolls a sandbox back to a snapshot; a snapshot of a git
// workspace brings its workspace too (the sandbox's is replaced by a copy,
// on branch den/<sandbox id>).
func (s *Server) restore(w http.ResponseWriter, r *http.Request) {
	var req api.RestoreRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.m.Restore(r.Context(), r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	if snap, err := s.m.GetSnapshot(r.Context(), req.Snapshot); err == nil {
		if err := s.carryWorkspace(r.Context(), snap.ID, sb.ID); err != nil {
			writeError(w, fmt.Errorf("restored %s, but could not copy the snapshot's git workspace: %w", sb.ID[:12], err))
			return
		}
	}
	writeJSON(w, 200, sb)
}

// takeSnapshot records a snapshot of a sandbox's files and, for a git
// workspace, a copy of its workspace, so sandboxes created from the
// snapshot have one too.
func (s *Server) takeSnapshot(w http.ResponseWriter, r *http.Request) {
	var req api.SnapshotRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	snap, err := s.m.Snapshot(r.Context(), r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	if st := s.gitStore(); st.Has(snap.Sandbox) {
		if _, err := st.Copy(r.Context(), snap.Sandbox, snap.ID, ""); err != nil {
			s.m.RemoveSnapshot(context.WithoutCancel(r.Context()), snap.ID)
			writeError(w, fmt.Errorf("snapshot: copy the git workspace: %w", err))
			return
		}
	}
	writeJSON(w, 201, snap)
}

// populate unpacks the checkout at the sandbox's /, as /workspace owned by
// the uid and gid its commands run as.
func (s *Server) populate(ctx context.Context, st *gitws.Store, repo *gitws.Repo, id string) error {
	if err := st.Keep(repo, id); err != nil {
		return err
	}
	out, err := s.insideOutput(ctx, id, "id -u; id -g", 30*time.Second)
	if err != nil {
		return fmt.Errorf("find the sandbox's user: %w", err)
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		return fmt.Errorf("find the sandbox's user: id said %q", out)
	}
	uid, err1 := strconv.Atoi(f[0])
	gid, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return fmt.Errorf("find the sandbox's user: id said %q", out)
	}
	ag, _, err := s.m.Agent(ctx, id)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(repo.WriteCheckout(ctx, pw, uid, gid)) }()
	resp, err := ag.Do(ctx, "PUT", agent.PathArchive, url.Values{"path": {"/"}}, pr, nil)
	pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// insideOutput runs a shell command in the sandbox as its user, in / (the
// workdir /workspace does not exist yet), and returns its standard output;
// a non-zero exit is an error.
func (s *Server) insideOutput(ctx context.Context, id, script string, timeout time.Duration) (string, error) {
	var out, errb bytes.Buffer
	st, err := s.m.Exec(ctx, id, api.ExecRequest{Shell: script, Workdir: "/", Timeout: api.Duration(timeout)}, func(typ byte, p []byte) error {
		switch typ {
		case api.FrameStdout:
			if out.Len() < 1<<20 {
				out.Write(p)
			}
		case api.FrameStderr:
			if errb.Len() < 4<<10 {
				errb.Write(p)
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if st.ExitCode != 0 || st.Reason != api.ReasonExited {
		return "", fmt.Errorf("%s: exit %d (%s): %s", script, st.ExitCode, st.Reason, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// inside reads one sandbox's workspace for a snapshot.
type inside struct {
	s  *Server
	id string
}

func (in inside) Archive(ctx context.Context) (io.ReadCloser, error) {
	ag, _, err := in.s.m.Agent(ctx, in.id)
	if err != nil {
		return nil, err
	}
	resp, err := ag.Do(ctx, "GET", agent.PathArchive, url.Values{"path": {gitws.WorkDir}}, nil, nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Bundle runs the sandbox's own git, inside, as its user: the bundle comes
// out on standard output and is only ever parsed by the host's git as data.
func (in inside) Bundle(ctx context.Context, base string, w io.Writer) (bool, error) {
	if !isHex(base) {
		return false, fmt.Errorf("base %q is not a commit id", base)
	}
	script := fmt.Sprintf(`cd %s && h=$(git -c safe.directory='*' rev-parse --verify -q 'HEAD^{commit}') && [ "$h" != %s ] && exec git -c safe.directory='*' bundle create --quiet - %s..HEAD`, gitws.WorkDir, base, base)
	n := 0
	var werr error
	st, err := in.s.m.Exec(ctx, in.id, api.ExecRequest{Shell: script, Timeout: api.Duration(10 * time.Minute)}, func(typ byte, p []byte) error {
		if typ == api.FrameStdout && werr == nil {
			n += len(p)
			_, werr = w.Write(p)
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	return werr == nil && n > 0 && st.Reason == api.ReasonExited && st.ExitCode == 0, nil
}

// snapshot resolves the sandbox and records its workspace, holding the
// workspace until the caller is done with the snapshot (unlock).
func (s *Server) snapshot(r *http.Request, message string) (*gitws.Repo, *gitws.Snapshot, func(), error) {
	sb, err := s.m.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, nil, nil, err
	}
	repo, err := s.gitStore().Open(sb.ID)
	if err != nil {
		return nil, nil, nil, err
	}
	if sb.State != api.StateRunning && sb.State != api.StatePaused && sb.State != api.StateHibernated {
		return nil, nil, nil, api.Errorf(api.KindConflict, "sandbox %s is %s: start it (den start) to read its workspace", sb.ID[:12], sb.State)
	}
	if message == "" {
		message = "den: changes in sandbox " + sb.ID[:12]
	}
	unlock := repo.Lock()
	snap, err := repo.Snapshot(r.Context(), inside{s, sb.ID}, message)
	if err != nil {
		unlock()
		return nil, nil, nil, err
	}
	return repo, snap, unlock, nil
}

func (s *Server) gitDiff(w http.ResponseWriter, r *http.Request) {
	repo, snap, unlock, err := s.snapshot(r, "")
	if err != nil {
		writeError(w, err)
		return
	}
	defer unlock()
	d, err := repo.Diff(r.Context(), snap)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, d)
}

func (s *Server) gitExport(w http.ResponseWriter, r *http.Request) {
	var req api.ExportRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := gitws.CheckBranch(req.Branch); err != nil {
		writeError(w, err)
		return
	}
	if strings.ContainsRune(req.Message, 0) {
		writeError(w, api.FieldError("message", "NUL in the message"))
		return
	}
	if !isAdmin(r) {
		writeError(w, api.Errorf(api.KindUnauthorized, "export writes to a repository on the host, which only the daemon's administrator may do; use GET .../diff for a patch"))
		return
	}
	repo, snap, unlock, err := s.snapshot(r, req.Message)
	if err != nil {
		writeError(w, err)
		return
	}
	defer unlock()
	res, err := repo.Export(r.Context(), snap, req.Branch, req.Force)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, res)
}

func isHex(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}
