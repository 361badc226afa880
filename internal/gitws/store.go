package gitws

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/den-dev/den/api"
)

// WorkDir is where the repository is checked out inside the sandbox.
const WorkDir = "/workspace"

// BranchPrefix starts the name of a workspace's branch: den/<sandbox id>.
const BranchPrefix = "den/"

// Meta describes a workspace; it is kept beside the daemon's repository.
type Meta struct {
	// Source is what the workspace was cloned from: a URL, or the
	// absolute path of a host repository.
	Source string `json:"source"`
	// HostPath is set when Source is a host repository: export writes there.
	HostPath string `json:"host_path,omitempty"`
	// Branch is the branch (or tag) of Source the workspace started from.
	Branch string `json:"branch"`
	// WorkBranch is the branch checked out inside the sandbox.
	WorkBranch string `json:"work_branch"`
	// Base is the commit the workspace started from.
	Base string `json:"base"`
	// Author is "Name <email>", the identity git inside commits as
	// (user.name and user.email in /workspace/.git/config) and the author
	// of the commit holding the uncommitted changes.
	Author string `json:"author,omitempty"`
}

// Store keeps the daemon's repositories, one per workspace, in Dir.
type Store struct{ Dir string }

// Repo is one workspace's repository in the daemon's data directory.
type Repo struct {
	Dir  string // a bare repository
	Meta Meta
}

// Source is a parsed clone source.
type Source struct {
	URL      string // what git clones
	HostPath string // set for a host repository (a path or file:// URL)
}

// ParseSource checks a clone source: an https, http, git or ssh URL, an
// scp-like user@host:path, or a host repository as an absolute path or a
// file:// URL. Other transports (ext::, fd::) are refused.
func ParseSource(s string) (Source, error) {
	switch {
	case s == "":
		return Source{}, api.FieldError("git.url", "missing: a repository URL or an absolute host path")
	case strings.HasPrefix(s, "-"):
		return Source{}, api.FieldError("git.url", "%q starts with '-'", s)
	case strings.ContainsAny(s, "\x00\n\r"):
		return Source{}, api.FieldError("git.url", "control characters in %q", s)
	case strings.HasPrefix(s, "/"):
		return Source{URL: filepath.Clean(s), HostPath: filepath.Clean(s)}, nil
	}
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			return Source{}, api.FieldError("git.url", "%v", err)
		}
		switch u.Scheme {
		case "file":
			if u.Host != "" && u.Host != "localhost" || !strings.HasPrefix(u.Path, "/") {
				return Source{}, api.FieldError("git.url", "%q: a file URL names an absolute path on this host (file:///path)", s)
			}
			p := filepath.Clean(u.Path)
			return Source{URL: p, HostPath: p}, nil
		case "https", "http", "git", "ssh":
			if u.Host == "" {
				return Source{}, api.FieldError("git.url", "%q has no host", s)
			}
			return Source{URL: s}, nil
		default:
			return Source{}, api.FieldError("git.url", "%q: unsupported scheme %q (https, http, git, ssh or file)", s, u.Scheme)
		}
	}
	if strings.Contains(s, "::") {
		return Source{}, api.FieldError("git.url", "%q: git remote helpers are not allowed", s)
	}
	// scp-like syntax: [user@]host:path, with no slash before the colon.
	if i := strings.Index(s, ":"); i > 0 && !strings.Contains(s[:i], "/") {
		return Source{URL: s}, nil
	}
	return Source{}, api.FieldError("git.url", "%q is neither a URL nor an absolute path (relative paths are not allowed)", s)
}

func (s *Store) repoDir(id string) string { return filepath.Join(s.Dir, id+".git") }

// Clone clones src into a new repository of the daemon's and picks the
// branch (the source's default when branch is ""). The repository is
// temporary until Keep names it after its sandbox; Discard removes it.
func (s *Store) Clone(ctx context.Context, src Source, branch string) (*Repo, error) {
	if err := Available(); err != nil {
		return nil, api.Errorf(api.KindUnsupported, "%v", err)
	}
	if branch != "" {
		if strings.HasPrefix(branch, "-") {
			return nil, api.FieldError("git.branch", "%q starts with '-'", branch)
		}
		if _, err := runS(ctx, "", "check-ref-format", "--allow-onelevel", "refs/heads/"+branch); err != nil {
			return nil, api.FieldError("git.branch", "%q is not a valid branch name", branch)
		}
	}
	if src.HostPath != "" {
		if st, err := os.Stat(src.HostPath); err != nil {
			return nil, api.FieldError("git.url", "%s: %v", src.HostPath, errors.Unwrap(err))
		} else if !st.IsDir() {
			return nil, api.FieldError("git.url", "%s is not a directory, let alone a git repository", src.HostPath)
		}
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(s.Dir, "clone-")
	if err != nil {
		return nil, err
	}
	r := &Repo{Dir: filepath.Join(tmp, "repo.git"), Meta: Meta{Source: src.URL, HostPath: src.HostPath}}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	if _, err := run(ctx, "", nil, "clone", "--bare", "--quiet", "--", src.URL, r.Dir); err != nil {
		os.RemoveAll(tmp)
		msg := stderrOf(err)
		if src.HostPath != "" {
			return nil, api.FieldError("git.url", "%s is not a git repository the daemon can clone (git: %s)", src.HostPath, msg)
		}
		return nil, api.FieldError("git.url", "clone %s failed (git: %s)", src.URL, msg)
	}
	rev := "HEAD"
	if branch != "" {
		rev = "refs/heads/" + branch
		if _, err := runS(ctx, r.Dir, "rev-parse", "--verify", "--quiet", rev+"^{commit}"); err != nil {
			rev = "refs/tags/" + branch
		}
	}
	base, err := runS(ctx, r.Dir, "rev-parse", "--verify", "--quiet", rev+"^{commit}")
	if err != nil {
		heads, _ := runS(ctx, r.Dir, "for-each-ref", "--count=20", "--format=%(refname:short)", "refs/heads")
		os.RemoveAll(tmp)
		if branch == "" {
			return nil, api.FieldError("git.url", "%s has no commits to check out", src.URL)
		}
		return nil, api.FieldError("git.branch", "no branch or tag %q in %s (branches: %s)", branch, src.URL, strings.Join(strings.Fields(heads), ", "))
	}
	if branch == "" {
		branch, _ = runS(ctx, r.Dir, "symbolic-ref", "--short", "HEAD")
	}
	r.Meta.Branch, r.Meta.Base = branch, base
	if _, err := run(ctx, r.Dir, nil, "update-ref", "refs/den/base", base); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	return r, nil
}

// Discard removes a repository Clone made and Keep did not keep.
func (r *Repo) Discard() {
	if filepath.Base(r.Dir) == "repo.git" {
		os.RemoveAll(filepath.Dir(r.Dir))
	}
}

// Keep makes the cloned repository the workspace of sandbox id, whose
// branch is den/<id>.
func (s *Store) Keep(r *Repo, id string) error {
	r.Meta.WorkBranch = BranchPrefix + id
	return s.keep(r, id)
}

// keep names repository r after id (a sandbox's or a snapshot's) and
// writes its description beside it.
func (s *Store) keep(r *Repo, id string) error {
	dst := s.repoDir(id)
	os.RemoveAll(dst)
	if err := os.Rename(r.Dir, dst); err != nil {
		return err
	}
	os.Remove(filepath.Dir(r.Dir))
	r.Dir = dst
	b, _ := json.MarshalIndent(r.Meta, "", "  ")
	return os.WriteFile(filepath.Join(dst, "den-workspace.json"), b, 0o600)
}

// Copy gives to (a sandbox or a snapshot) a workspace of its own with the
// source and base of from's (a sandbox's or a snapshot's): a copy of the
// daemon's repository, objects hard-linked, so what one records never
// moves the other's refs. Its branch inside is workBranch ("": from's).
func (s *Store) Copy(ctx context.Context, from, to, workBranch string) (*Repo, error) {
	src, err := s.Open(from)
	if err != nil {
		return nil, err
	}
	unlock := src.Lock() // no snapshot moves its refs mid-copy
	defer unlock()
	tmp, err := os.MkdirTemp(s.Dir, "clone-")
	if err != nil {
		return nil, err
	}
	r := &Repo{Dir: filepath.Join(tmp, "repo.git"), Meta: src.Meta}
	if workBranch != "" {
		r.Meta.WorkBranch = workBranch
	}
	if _, err := run(ctx, "", nil, "clone", "--mirror", "--quiet", "--", src.Dir, r.Dir); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("copy the workspace of %s: %w", shortID(from), err)
	}
	if _, err := run(ctx, r.Dir, nil, "remote", "remove", "origin"); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("copy the workspace of %s: %w", shortID(from), err)
	}
	if err := s.keep(r, to); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	return r, nil
}

// Has reports whether id (a sandbox or a snapshot) has a workspace.
func (s *Store) Has(id string) bool {
	_, err := os.Stat(filepath.Join(s.repoDir(id), "den-workspace.json"))
	return err == nil
}

// Open returns the workspace of sandbox id.
func (s *Store) Open(id string) (*Repo, error) {
	dir := s.repoDir(id)
	b, err := os.ReadFile(filepath.Join(dir, "den-workspace.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, api.Errorf(api.KindInvalid, "sandbox %s has no git workspace: create one with den create --git URL|PATH", shortID(id))
	} else if err != nil {
		return nil, err
	}
	r := &Repo{Dir: dir}
	if err := json.Unmarshal(b, &r.Meta); err != nil {
		return nil, fmt.Errorf("read workspace of %s: %w", shortID(id), err)
	}
	return r, nil
}

// Remove deletes the workspace of sandbox id, if it has one.
func (s *Store) Remove(id string) error { return os.RemoveAll(s.repoDir(id)) }

// Prune removes the workspaces of sandboxes and snapshots that no longer
// exist, and clones left over from failed creates.
func (s *Store) Prune(exists func(id string) bool) {
	ents, _ := os.ReadDir(s.Dir)
	for _, e := range ents {
		name := e.Name()
		if id, ok := strings.CutSuffix(name, ".git"); ok && !exists(id) {
			os.RemoveAll(filepath.Join(s.Dir, name))
		} else if strings.HasPrefix(name, "clone-") {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Hour {
				os.RemoveAll(filepath.Join(s.Dir, name))
			}
		}
	}
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// WriteCheckout writes a tar stream of the workspace as it starts: a
// checkout of the base commit on the work branch, with a .git of its own,
// under the name "workspace/", every entry owned by uid:gid. Unpacked at
// the sandbox's / it becomes /workspace.
func (r *Repo) WriteCheckout(ctx context.Context, w io.Writer, uid, gid int) error {
	tmp, err := os.MkdirTemp(filepath.Dir(r.Dir), "checkout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	co := filepath.Join(tmp, "workspace")
	if _, err := run(ctx, "", nil, "clone", "--quiet", "--no-checkout", "--", r.Dir, co); err != nil {
		return fmt.Errorf("prepare the checkout: %w", err)
	}
	steps := [][]string{
		{"checkout", "--quiet", "-b", r.Meta.WorkBranch, r.Meta.Base},
		{"remote", "remove", "origin"},
	}
	if r.Meta.HostPath == "" {
		// The sandbox may fetch from the source itself if its network allows.
		steps = append(steps, []string{"remote", "add", "origin", r.Meta.Source})
	}
	if name, email, err := ParseAuthor(r.Meta.Author); err == nil {
		// So that a plain git commit works inside.
		steps = append(steps, []string{"config", "user.name", name}, []string{"config", "user.email", email})
	}
	for _, args := range steps {
		if _, err := run(ctx, co, nil, args...); err != nil {
			return fmt.Errorf("prepare the checkout: %w", err)
		}
	}
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(co, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		target := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, target)
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(tmp, p)
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = uid, gid, "", ""
		if !info.Mode().IsRegular() {
			if info.Mode()&(fs.ModeSymlink|fs.ModeDir) == 0 {
				return nil
			}
			return tw.WriteHeader(hdr)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, hdr.Size)
		return err
	})
	if err != nil {
		return fmt.Errorf("pack the checkout: %w", err)
	}
	return tw.Close()
}
