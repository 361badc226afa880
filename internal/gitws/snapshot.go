package gitws

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/den-dev/den/api"
)

// MaxWorkspace bounds the tar stream of a workspace a snapshot reads.
const MaxWorkspace = 8 << 30

// MaxBundle bounds the bundle of commits made inside.
const MaxBundle = 2 << 30

// maxIgnoreFile bounds a .gitignore file read from the workspace.
const maxIgnoreFile = 1 << 20

// Inside is what a snapshot reads from the sandbox.
type Inside interface {
	// Archive returns a tar stream of /workspace whose names start with
	// "workspace/" (the agent's archive download).
	Archive(ctx context.Context) (io.ReadCloser, error)
	// Bundle writes to w a git bundle of base..HEAD made inside the
	// sandbox by its own git, and reports whether it wrote one (false
	// when HEAD is base, or there is no usable repository inside).
	Bundle(ctx context.Context, base string, w io.Writer) (bool, error)
}

// Snapshot is the workspace's state as commits in the daemon's repository.
type Snapshot struct {
	Head string // the last commit: base..Head holds every change
	// Committed is the sandbox's own HEAD carried over from its bundle
	// ("" when it made no commits, or its history does not descend from
	// the base, in which case everything is one commit on the base).
	Committed string
}

// entry is one file of the workspace's tar stream.
type entry struct {
	name     string // relative to /workspace
	typ      byte
	mode     int64
	size     int64
	linkname string
}

// Snapshot records the sandbox's workspace: its commits (from a bundle)
// and then its files as they are, committed with message when they differ
// from the last commit. Nothing it reads is written to the host's
// filesystem except the spooled tar stream and bundle, which only git's
// parsers and this package read.
func (r *Repo) Snapshot(ctx context.Context, in Inside, message string) (*Snapshot, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(r.Dir), "snap-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	base := r.Meta.Base
	snap := &Snapshot{}
	parent := base
	if c, err := r.fetchBundle(ctx, in, tmp); err != nil {
		return nil, err
	} else if c != "" {
		snap.Committed, parent = c, c
	}

	// Spool the workspace's files, then read them twice: once for the
	// names and .gitignore files, once for the contents to keep.
	rc, err := in.Archive(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", WorkDir, err)
	}
	spool := filepath.Join(tmp, "workspace.tar")
	err = copyLimited(spool, rc, MaxWorkspace, "the workspace")
	rc.Close()
	if err != nil {
		return nil, err
	}
	entries, ignoreFiles, err := scanTar(spool)
	if err != nil {
		return nil, err
	}
	keep, gitlinks, err := r.selectEntries(ctx, tmp, parent, entries, ignoreFiles)
	if err != nil {
		return nil, err
	}
	prev, _ := runS(ctx, r.Dir, "rev-parse", "--verify", "--quiet", "refs/den/head")
	if err := r.importTree(ctx, spool, keep, gitlinks, parent, message, r.Meta.Author); err != nil {
		return nil, err
	}
	head, err := runS(ctx, r.Dir, "rev-parse", "refs/den/head")
	if err != nil {
		return nil, err
	}
	if same, _ := runS(ctx, r.Dir, "rev-parse", head+"^{tree}", parent+"^{tree}"); sameFields(same) {
		head = parent // nothing uncommitted
	} else if prev != "" && prev != parent && r.sameCommit(ctx, prev, head) {
		head = prev // as last time: keep the commit (and its date), so exports repeat
	}
	run(ctx, r.Dir, nil, "update-ref", "refs/den/head", head)
	snap.Head = head
	return snap, nil
}

func sameFields(s string) bool {
	f := strings.Fields(s)
	return len(f) == 2 && f[0] == f[1]
}

// sameCommit reports whether commits a and b have the same tree, parents
// and message (they differ only in their dates).
func (r *Repo) sameCommit(ctx context.Context, a, b string) bool {
	show := func(c string) string {
		s, err := runS(ctx, r.Dir, "show", "-s", "--format=%T %P%n%B", c)
		if err != nil {
			return "\x00" + c
		}
		return s
	}
	return show(a) == show(b)
}

// fetchBundle carries the sandbox's commits over; it returns the sandbox's
// HEAD when that descends from the base, or "".
func (r *Repo) fetchBundle(ctx context.Context, in Inside, tmp string) (string, error) {
	p := filepath.Join(tmp, "inside.bundle")
	f, err := os.Create(p)
	if err != nil {
		return "", err
	}
	ok, err := in.Bundle(ctx, r.Meta.Base, &limitWriter{w: f, n: MaxBundle})
	f.Close()
	if err != nil || !ok {
		return "", nil // no commits inside, or none readable: squash
	}
	run(ctx, r.Dir, nil, "update-ref", "-d", "refs/den/inside")
	if _, err := run(ctx, r.Dir, nil, "-c", "transfer.fsckObjects=true", "-c", "fetch.fsckObjects=true",
		"fetch", "--quiet", "--no-tags", "--no-write-fetch-head", p, "+HEAD:refs/den/inside"); err != nil {
		return "", nil // a bundle git refuses is ignored, as if there were no commits
	}
	c, err := runS(ctx, r.Dir, "rev-parse", "--verify", "--quiet", "refs/den/inside^{commit}")
	if err != nil {
		return "", nil
	}
	if _, err := run(ctx, r.Dir, nil, "merge-base", "--is-ancestor", r.Meta.Base, c); err != nil {
		return "", nil // history rewritten past the base: squash onto the base
	}
	return c, nil
}

// copyLimited copies r into a new file p, refusing more than max bytes.
func copyLimited(p string, r io.Reader, max int64, what string) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, io.LimitReader(r, max+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", what, err)
	}
	if n > max {
		return api.Errorf(api.KindTooLarge, "%s is over %d bytes", what, max)
	}
	return nil
}

type limitWriter struct {
	w io.Writer
	n int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.n {
		return 0, errors.New("bundle too large")
	}
	l.n -= int64(len(p))
	return l.w.Write(p)
}

// workspaceName turns a tar entry name into a path relative to the
// workspace, or "" for the workspace itself and for names git must never
// see (outside the workspace, "..", ".git" components).
func workspaceName(n string) string {
	rest, ok := strings.CutPrefix(n, "workspace/")
	if !ok || strings.ContainsRune(rest, 0) {
		return ""
	}
	rest = strings.TrimSuffix(rest, "/")
	if rest == "" {
		return ""
	}
	for _, part := range strings.Split(rest, "/") {
		if part == "" || part == "." || part == ".." || strings.EqualFold(part, ".git") {
			return ""
		}
	}
	return rest
}

// scanTar lists the workspace's entries and reads its .gitignore files.
func scanTar(spool string) ([]entry, map[string][]byte, error) {
	f, err := os.Open(spool)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	tr := tar.NewReader(bufio.NewReader(f))
	var out []entry
	ignores := map[string][]byte{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read the workspace's tar stream: %w", err)
		}
		name := workspaceName(hdr.Name)
		if name == "" {
			continue
		}
		e := entry{name: name, typ: hdr.Typeflag, mode: hdr.Mode, size: hdr.Size, linkname: hdr.Linkname}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeSymlink, tar.TypeDir:
		case tar.TypeLink:
			if e.linkname = workspaceName(hdr.Linkname); e.linkname == "" {
				continue
			}
		default:
			continue
		}
		if hdr.Typeflag == tar.TypeReg && path.Base(name) == ".gitignore" && hdr.Size <= maxIgnoreFile {
			b, err := io.ReadAll(tr)
			if err != nil {
				return nil, nil, err
			}
			ignores[name] = b
		}
		out = append(out, e)
	}
	return out, ignores, nil
}

// selectEntries drops untracked files the workspace's .gitignore files
// ignore (files tracked in parent always stay) and returns the gitlinks
// (submodules) of parent whose directories are still there.
func (r *Repo) selectEntries(ctx context.Context, tmp, parent string, entries []entry, ignoreFiles map[string][]byte) ([]entry, map[string]string, error) {
	ls, err := run(ctx, r.Dir, nil, "ls-tree", "-r", "-z", "--full-tree", parent)
	if err != nil {
		return nil, nil, err
	}
	tracked := map[string]bool{}
	gitlinkOf := map[string]string{}
	for _, rec := range strings.Split(string(ls), "\x00") {
		meta, name, ok := strings.Cut(rec, "\t")
		if !ok {
			continue
		}
		tracked[name] = true
		if f := strings.Fields(meta); len(f) == 3 && f[1] == "commit" {
			gitlinkOf[name] = f[2]
		}
	}
	gitlinks := map[string]string{}
	var candidates []string
	for _, e := range entries {
		if e.typ == tar.TypeDir {
			if c, ok := gitlinkOf[e.name]; ok {
				gitlinks[e.name] = c
			}
			continue
		}
		if !tracked[e.name] {
			candidates = append(candidates, e.name)
		}
	}
	ignored := map[string]bool{}
	if len(ignoreFiles) > 0 && len(candidates) > 0 {
		var err error
		if ignored, err = r.checkIgnore(ctx, tmp, ignoreFiles, candidates); err != nil {
			return nil, nil, err
		}
	}
	var keep []entry
	for _, e := range entries {
		if e.typ == tar.TypeDir || ignored[e.name] || gitlinks[e.name] != "" {
			continue
		}
		if under(e.name, gitlinks) {
			continue // a submodule's files belong to the submodule
		}
		keep = append(keep, e)
	}
	return keep, gitlinks, nil
}

func under(name string, dirs map[string]string) bool {
	for d := range dirs {
		if strings.HasPrefix(name, d+"/") {
			return true
		}
	}
	return false
}

// checkIgnore asks git which paths the .gitignore files ignore. The files
// are written, as plain files through an os.Root, into an empty work tree
// that holds nothing else: git reads patterns from them and nothing more.
func (r *Repo) checkIgnore(ctx context.Context, tmp string, files map[string][]byte, paths []string) (map[string]bool, error) {
	wt := filepath.Join(tmp, "ignore")
	if err := os.Mkdir(wt, 0o700); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(wt)
	if err != nil {
		return nil, err
	}
	for name, b := range files {
		if d := path.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o700); err != nil {
				continue
			}
		}
		root.WriteFile(name, b, 0o600)
	}
	root.Close()
	var stdin bytes.Buffer
	for _, p := range paths {
		stdin.WriteString(p)
		stdin.WriteByte(0)
	}
	out, err := run(ctx, "", stdin.Bytes(), "--git-dir="+r.Dir, "--work-tree="+wt, "check-ignore", "--no-index", "-z", "--stdin")
	var ge *gitError
	if err != nil && !(errors.As(err, &ge) && strings.TrimSpace(ge.stderr) == "") {
		return nil, fmt.Errorf("apply .gitignore: %w", err) // exit 1 without a message: nothing ignored
	}
	ignored := map[string]bool{}
	for _, p := range strings.Split(string(out), "\x00") {
		if p != "" {
			ignored[p] = true
		}
	}
	return ignored, nil
}

// importTree makes refs/den/head a commit on parent whose tree is exactly
// the kept entries (and gitlinks), through git fast-import.
func (r *Repo) importTree(ctx context.Context, spool string, keep []entry, gitlinks map[string]string, parent, message, author string) error {
	cmd := gitCmd(ctx, r.Dir, "fast-import", "--quiet", "--force", "--done")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	var errb bytes.Buffer
	cmd.Stderr, cmd.Stdout = &errb, io.Discard
	if err := cmd.Start(); err != nil {
		return err
	}
	werr := writeImport(stdin, spool, keep, gitlinks, parent, message, author)
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git fast-import: %s", strings.TrimSpace(errb.String()))
	}
	return werr
}

// writeImport writes fast-import's input: the kept files as blobs, then a
// commit of them on parent, by author ("Name <email>"; "" or a bad one:
// den's).
func writeImport(w0 io.Writer, spool string, keep []entry, gitlinks map[string]string, parent, message, author string) error {
	want := map[string]entry{}
	for _, e := range keep {
		want[e.name] = e
	}
	// Regular files that hard links point at are needed as blobs too.
	for _, e := range keep {
		if e.typ == tar.TypeLink {
			if _, ok := want[e.linkname]; !ok {
				want[e.linkname] = entry{name: e.linkname}
			}
		}
	}
	f, err := os.Open(spool)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(w0, 1<<16)
	marks := map[string]int{}
	modes := map[string]string{}
	next := 1
	tr := tar.NewReader(bufio.NewReader(f))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read the workspace's tar stream: %w", err)
		}
		name := workspaceName(hdr.Name)
		if _, ok := want[name]; !ok || name == "" || marks[name] != 0 {
			continue
		}
		var data io.Reader
		var size int64
		switch hdr.Typeflag {
		case tar.TypeReg:
			data, size = tr, hdr.Size
			modes[name] = "100644"
			if hdr.Mode&0o100 != 0 {
				modes[name] = "100755"
			}
		case tar.TypeSymlink:
			// A symlink is its target's text, never followed.
			data, size = strings.NewReader(hdr.Linkname), int64(len(hdr.Linkname))
			modes[name] = "120000"
		default:
			continue
		}
		fmt.Fprintf(w, "blob\nmark :%d\ndata %d\n", next, size)
		if n, err := io.CopyN(w, data, size); err != nil {
			return fmt.Errorf("%s: %d of %d bytes: %w", name, n, size, err)
		}
		w.WriteString("\n")
		marks[name] = next
		next++
	}
	now := time.Now().Unix()
	if _, _, err := ParseAuthor(author); err != nil {
		author = DefaultAuthor
	}
	fmt.Fprintf(w, "commit refs/den/head\nauthor %s %d +0000\ncommitter %s %d +0000\ndata %d\n%s\nfrom %s\ndeleteall\n", author, now, DefaultAuthor, now, len(message), message, parent)
	for _, e := range keep {
		src := e.name
		if e.typ == tar.TypeLink {
			src = e.linkname
		}
		m := marks[src]
		if m == 0 {
			continue // vanished or not a file
		}
		fmt.Fprintf(w, "M %s :%d %s\n", modes[src], m, quote(e.name))
	}
	for name, c := range gitlinks {
		fmt.Fprintf(w, "M 160000 %s %s\n", c, quote(name))
	}
	w.WriteString("\ndone\n")
	return w.Flush()
}

// quote writes a path in git's C-style quoting, which fast-import reads:
// in double quotes, with \" \\ \a \b \t \n \v \f \r, and other control
// characters and every byte from 0x80 up as three octal digits.
func quote(p string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(p); i++ {
		c := p[i]
		if e := strings.IndexByte("\a\b\t\n\v\f\r\"\\", c); e >= 0 {
			b.WriteByte('\\')
			b.WriteByte("abtnvfr\"\\"[e])
		} else if c < 0x20 || c >= 0x7f {
			fmt.Fprintf(&b, "\\%03o", c)
		} else {
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// QuotePath prints a path as git does (core.quotePath): as it is, unless
// it holds a double quote, a backslash, a control character or a byte
// from 0x80 up, which git quotes (see quote).
func QuotePath(p string) string {
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return quote(p)
		}
	}
	return p
}

// Diff describes base..head: commits, changed files and a binary patch.
func (r *Repo) Diff(ctx context.Context, snap *Snapshot) (*api.Diff, error) {
	base, head := r.Meta.Base, snap.Head
	d := &api.Diff{Base: base, Head: head, Branch: r.Meta.WorkBranch, Source: r.Meta.Source,
		Commits: []api.DiffCommit{}, Files: []api.DiffFile{}}
	patch, err := run(ctx, r.Dir, nil, "diff", "--binary", "--full-index", "--no-ext-diff", "--no-textconv", "--no-color", "-M", base, head, "--")
	if err != nil {
		return nil, err
	}
	d.Patch = patch
	ns, err := run(ctx, r.Dir, nil, "diff", "--name-status", "-z", "--no-ext-diff", "-M", base, head, "--")
	if err != nil {
		return nil, err
	}
	f := strings.Split(strings.TrimSuffix(string(ns), "\x00"), "\x00")
	for i := 0; i < len(f) && f[i] != ""; {
		st := f[i]
		df := api.DiffFile{Status: st[:1]}
		if (st[0] == 'R' || st[0] == 'C') && i+2 < len(f) {
			df.OldPath, df.Path = f[i+1], f[i+2]
			i += 3
		} else if i+1 < len(f) {
			df.Path = f[i+1]
			i += 2
		} else {
			break
		}
		d.Files = append(d.Files, df)
	}
	log, err := run(ctx, r.Dir, nil, "log", "--reverse", "--format=%H%x00%s%x00", base+".."+head, "--")
	if err != nil {
		return nil, err
	}
	l := strings.Split(strings.TrimSpace(string(log)), "\x00")
	for i := 0; i+1 < len(l); i += 2 {
		d.Commits = append(d.Commits, api.DiffCommit{Commit: strings.TrimSpace(l[i]), Subject: l[i+1]})
	}
	return d, nil
}

// Export writes base..head as branch of the host repository the workspace
// was cloned from. The host's working tree and index are never touched:
// the objects are fetched into the host repository and the branch is set
// with update-ref (compare-and-swap on its old value). An existing branch
// is moved only when head descends from it, unless force; the branch
// checked out in any of the host's worktrees is refused.
func (r *Repo) Export(ctx context.Context, snap *Snapshot, branch string, force bool) (*api.ExportResult, error) {
	if r.Meta.HostPath == "" {
		return nil, api.Errorf(api.KindInvalid, "the workspace was cloned from %s, not a host repository: nothing to export to; use den diff for a patch", r.Meta.Source)
	}
	if err := CheckBranch(branch); err != nil {
		return nil, err
	}
	ref := "refs/heads/" + branch
	host := r.Meta.HostPath
	gitDir, err := runS(ctx, host, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil {
		return nil, api.Errorf(api.KindConflict, "the host repository %s is gone: %s", host, stderrOf(err))
	}
	start := time.Now().Add(-time.Second)
	defer keepOwner(gitDir, start)
	wl, err := runS(ctx, host, "worktree", "list", "--porcelain")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(wl, "\n") {
		if line == "branch "+ref {
			return nil, api.Errorf(api.KindConflict, "branch %s is checked out in %s (a worktree of it): export to another branch", branch, host)
		}
	}
	if snap.Head == r.Meta.Base {
		return nil, api.Errorf(api.KindConflict, "no changes since the base commit %s: nothing to export", short(r.Meta.Base))
	}
	old, _ := runS(ctx, host, "rev-parse", "--verify", "--quiet", ref+"^{commit}")
	if _, err := run(ctx, r.Dir, nil, "update-ref", "refs/den/export", snap.Head); err != nil {
		return nil, err
	}
	if _, err := run(ctx, host, nil, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--", r.Dir, "refs/den/export"); err != nil {
		return nil, fmt.Errorf("copy the commits into %s: %w", host, err)
	}
	if old != "" && !force {
		if _, err := run(ctx, host, nil, "merge-base", "--is-ancestor", old, snap.Head); err != nil {
			return nil, api.Errorf(api.KindConflict, "branch %s exists in %s at %s and the workspace's changes do not descend from it: pick another branch or force", branch, host, short(old))
		}
	}
	oldArg := old
	if oldArg == "" {
		oldArg = strings.Repeat("0", len(snap.Head)) // the branch must not exist yet
	}
	if _, err := run(ctx, host, nil, "update-ref", "-m", "den export", ref, snap.Head, oldArg); err != nil {
		return nil, api.Errorf(api.KindConflict, "update %s in %s: %s", branch, host, stderrOf(err))
	}
	n, _ := runS(ctx, r.Dir, "rev-list", "--count", r.Meta.Base+".."+snap.Head)
	count, _ := strconv.Atoi(n)
	return &api.ExportResult{Repository: host, Branch: branch, Commit: snap.Head, Base: r.Meta.Base, Previous: old, Commits: count}, nil
}

// keepOwner gives the files the export made in a host repository (objects,
// refs, reflogs) to the repository's owner, so a user's repository does not
// end up with root-owned files its owner cannot replace.
func keepOwner(gitDir string, since time.Time) {
	st, err := os.Stat(gitDir)
	if err != nil {
		return
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || int(sys.Uid) == os.Geteuid() {
		return
	}
	me := uint32(os.Geteuid())
	for _, sub := range []string{"objects", "refs", "logs", "packed-refs"} {
		filepath.WalkDir(filepath.Join(gitDir, sub), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return nil
			}
			if fs, ok := info.Sys().(*syscall.Stat_t); ok && fs.Uid == me && !info.ModTime().Before(since) {
				os.Lchown(p, int(sys.Uid), int(sys.Gid))
			}
			return nil
		})
	}
}

// locks serialises snapshots of one workspace (they share refs/den/*).
var locks sync.Map

// Lock holds the workspace for one snapshot and its diff or export.
func (r *Repo) Lock() (unlock func()) {
	v, _ := locks.LoadOrStore(r.Dir, new(sync.Mutex))
	mu := v.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// CheckBranch validates a branch name for export.
func CheckBranch(branch string) error {
	if branch == "" {
		return api.FieldError("branch", "missing: name the branch of the host repository to write")
	}
	if strings.HasPrefix(branch, "-") {
		return api.FieldError("branch", "%q starts with '-'", branch)
	}
	if _, err := runS(context.Background(), "", "check-ref-format", "--allow-onelevel", "refs/heads/"+branch); err != nil {
		return api.FieldError("branch", "%q is not a valid branch name", branch)
	}
	return nil
}

func short(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}
