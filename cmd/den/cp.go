package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/tarball"
)

var verbCp = &verb{
	name:     "cp",
	summary:  "copy files between a sandbox and the local machine",
	synopsis: "[flags] SRC DST",
	details: `One of SRC and DST is ID:PATH, a path inside a sandbox; the other is a local
path, or - for a tar stream on standard input or output. As with docker cp:
copying to an existing directory puts the source inside it (den cp ./src
ID:/work gives /work/src); copying to a missing path creates it as a copy of
the source; a source ending in /. copies the directory's contents. Modes and
symlinks are kept; symlinks are never followed, and nothing is written
outside DST.

Files copied out of a sandbox belong to you (the user running den cp), and
lose their setuid and setgid bits: a sandbox cannot plant a privileged
program on this machine. Extended attributes (file capabilities among
them) and device nodes never come out. With -a (--archive) they keep the
sandbox's uid/gid and their setuid/setgid bits, as docker cp -a does
(setting other owners needs root). Copied in, files belong to the
sandbox's user (den create -u; root when it has none), so commands running
as that user can change them; -a keeps their local uid/gid instead (or, for
a tar on standard input, the ones it names).`,
	example: `den cp ./src web:/work
		den cp web:/work/out ./out
		den cp web:/work/src/. ./local-copy`,
	run: cmdCp,
}

// cpPath is one side of den cp.
type cpPath struct {
	id   string // sandbox; "" for a local path
	path string
}

func parseCpPath(s string) cpPath {
	if s == "-" || strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") {
		return cpPath{path: s}
	}
	if i := strings.Index(s, ":"); i > 0 && !strings.Contains(s[:i], "/") {
		p := s[i+1:]
		if p == "" {
			p = "/"
		}
		return cpPath{id: s[:i], path: p}
	}
	return cpPath{path: s}
}

// contentsOnly reports whether p names a directory's contents ("dir/.").
func contentsOnly(p string) bool {
	return p == "." || strings.HasSuffix(p, "/.")
}

func cmdCp(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	keepOwner := f.Bool("archive", "a", "keep owners: copied in, the local uid/gid (default: the sandbox's user, see den create -u); copied out, the sandbox's uid/gid and setuid/setgid bits (default: yours, without setuid/setgid)")
	pos, err := c.exactly(f, v, args, 2, "cp needs SRC and DST")
	if err != nil {
		return err
	}
	src, dst := parseCpPath(pos[0]), parseCpPath(pos[1])
	switch {
	case src.id != "" && dst.id != "":
		return usagef(v, "cp copies between a sandbox and the local machine: one side must be local")
	case src.id == "" && dst.id == "":
		return usagef(v, "cp needs a sandbox side, written ID:PATH")
	}
	ctx, stop := signalContext()
	defer stop()
	cl := c.client(f)
	if dst.id != "" {
		err = c.copyIn(ctx, cl, src.path, dst, *keepOwner)
	} else {
		err = c.copyOut(ctx, cl, src, dst.path, *keepOwner)
	}
	if err != nil && ctx.Err() != nil {
		fmt.Fprintln(c.stderr, "den: interrupted")
		return exitError(130)
	}
	return err
}

// copyIn copies the local src into the sandbox.
func (c *cli) copyIn(ctx context.Context, cl *client.Client, src string, dst cpPath, keepOwner bool) error {
	dpath := path.Clean(dst.path)
	upload := cl.Upload
	if keepOwner {
		upload = cl.UploadKeepingOwners
	}
	if src == "-" {
		return upload(ctx, dst.id, dpath, c.stdin)
	}
	contents := contentsOnly(src)
	local := filepath.Clean(src)
	fi, err := os.Lstat(local)
	if err != nil {
		return err
	}
	if contents && !fi.IsDir() {
		return fmt.Errorf("%s: not a directory", local)
	}

	// Where does it go? As docker cp: into an existing directory, onto an
	// existing file, or as the new name.
	exists, isDir := false, false
	st, err := cl.Stat(ctx, dst.id, dpath)
	switch {
	case err == nil:
		exists, isDir = true, st.Type == "dir"
		if st.Type == "symlink" {
			if t, err := cl.Stat(ctx, dst.id, dpath+"/."); err == nil && t.Type == "dir" {
				isDir = true
			}
		}
	case !errors.Is(err, api.ErrNotFound):
		return err
	}
	var dir, name string
	switch {
	case contents:
		if exists && !isDir {
			return fmt.Errorf("%s:%s is not a directory", dst.id, dpath)
		}
		dir, name = dpath, ""
	case isDir:
		dir, name = dpath, filepath.Base(local)
	case exists:
		if fi.IsDir() {
			return fmt.Errorf("cannot copy a directory onto the file %s:%s", dst.id, dpath)
		}
		dir, name = path.Dir(dpath), path.Base(dpath)
	case strings.HasSuffix(dst.path, "/") || dpath == "/":
		dir, name = dpath, filepath.Base(local)
	default:
		dir, name = path.Dir(dpath), path.Base(dpath)
	}
	if name == "/" || name == "." {
		name = ""
	}

	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(writeTar(pw, local, name, keepOwner, c.stderr))
	}()
	err = upload(ctx, dst.id, dir, pr)
	pr.CloseWithError(errors.New("upload ended"))
	return err
}

// writeTar writes the file or tree at src as a tar stream whose entries are
// named name/... ("" for the contents of a directory). Symlinks are stored
// as symlinks.
func writeTar(w io.Writer, src, name string, keepOwner bool, warn io.Writer) error {
	tw := tarball.NewWriter(w)
	tw.KeepOwner, tw.Seconds, tw.HardLinks = keepOwner, true, true
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		entry := path.Join(name, filepath.ToSlash(rel))
		if entry == "." || entry == "" {
			return nil // the directory itself, when copying its contents
		}
		target := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		err = tw.Add(entry, info, target, func() (io.ReadCloser, error) {
			return os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		})
		if errors.Is(err, tarball.ErrSkipped) {
			fmt.Fprintf(warn, "den: skipping %s: not a file, directory or symlink\n", p)
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// copyOut copies src from the sandbox to the local dst.
func (c *cli) copyOut(ctx context.Context, cl *client.Client, src cpPath, dst string, archive bool) error {
	contents := contentsOnly(src.path)
	rc, err := cl.Download(ctx, src.id, path.Clean(src.path))
	if err != nil {
		return err
	}
	defer rc.Close()
	if dst == "-" {
		_, err := io.Copy(c.stdout, rc)
		return err
	}
	return extract(rc, dst, contents, archive, c.stderr)
}

// extract unpacks a downloaded tar stream (entries under one root name, as
// the archive endpoint gives them) to the local dst with docker cp's rules.
// Every file is created through an os.Root; entries with absolute names or
// "..", and entries below a symlink, are refused, so nothing is written
// outside the destination or through a symlink; hard links must point
// inside it; devices and other special files are skipped. The copies
// belong to the caller and lose setuid and setgid bits unless archive is
// set: then they get the archive's uid/gid and keep those bits. Extended
// attributes are never restored (no file capabilities).
func extract(r io.Reader, dst string, contents, archive bool, warn io.Writer) error {
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if errors.Is(err, io.EOF) {
		return errors.New("the sandbox sent an empty archive")
	}
	if err != nil {
		return fmt.Errorf("read archive: %w", err)
	}
	first, err := entryName(hdr.Name)
	if err != nil {
		return err
	}
	rootName, _, below := strings.Cut(first, "/")
	srcIsDir := hdr.Typeflag == tar.TypeDir || below

	local := filepath.Clean(dst)
	var parent, newRoot string
	lfi, lerr := os.Stat(local)
	switch {
	case lerr != nil && !errors.Is(lerr, fs.ErrNotExist):
		return lerr
	case contents:
		if lerr == nil && !lfi.IsDir() {
			return fmt.Errorf("%s is not a directory", local)
		}
		if lerr != nil {
			if err := os.MkdirAll(local, 0o755); err != nil {
				return err
			}
		}
		parent, newRoot = local, ""
	case lerr == nil && lfi.IsDir():
		parent, newRoot = local, rootName
	case lerr == nil:
		if srcIsDir {
			return fmt.Errorf("cannot copy a directory onto the file %s", local)
		}
		parent, newRoot = filepath.Dir(local), filepath.Base(local)
	case strings.HasSuffix(dst, "/"):
		if err := os.MkdirAll(local, 0o755); err != nil {
			return err
		}
		parent, newRoot = local, rootName
	default:
		parent, newRoot = filepath.Dir(local), filepath.Base(local)
		if pfi, err := os.Stat(parent); err != nil || !pfi.IsDir() {
			return fmt.Errorf("%s: no such directory", parent)
		}
	}
	if newRoot == "." {
		newRoot = ""
	}
	root, err := os.OpenRoot(parent)
	if err != nil {
		return err
	}
	defer root.Close()
	x := &extractor{root: root, rootName: rootName, newRoot: newRoot, archive: archive, warn: warn}
	for {
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
		hdr, err = tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read archive: %w", err)
		}
	}
	return x.finish()
}

// entryName validates a tar entry name: relative, without "..".
func entryName(n string) (string, error) {
	if n == "" || strings.HasPrefix(n, "/") || strings.ContainsRune(n, 0) {
		return "", fmt.Errorf("refusing archive entry %q: not a relative name", n)
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", fmt.Errorf("refusing archive entry %q: \"..\" is not allowed", n)
		}
	}
	return path.Clean(n), nil
}

type extractor struct {
	root              *os.Root
	rootName, newRoot string
	archive           bool // keep owners and setuid/setgid bits
	warn              io.Writer
	dirs              []dirMode
}

type dirMode struct {
	name string
	hdr  *tar.Header
}

// target maps an entry name to its name under the root ("" for the
// destination directory itself).
func (x *extractor) target(n string) (string, error) {
	name, err := entryName(n)
	if err != nil {
		return "", err
	}
	var rest string
	switch {
	case x.rootName == ".":
		rest = strings.TrimPrefix(name, ".")
	case name == x.rootName:
		rest = ""
	case strings.HasPrefix(name, x.rootName+"/"):
		rest = name[len(x.rootName)+1:]
	default:
		return "", fmt.Errorf("refusing archive entry %q: not under %q", n, x.rootName)
	}
	t := path.Join(x.newRoot, rest)
	if t == "." {
		t = ""
	}
	return t, nil
}

// parents makes sure the directories above name exist, refusing to go
// through a symlink.
func (x *extractor) parents(name string) error {
	parts := strings.Split(name, "/")
	for i := 1; i < len(parts); i++ {
		p := filepath.FromSlash(strings.Join(parts[:i], "/"))
		fi, err := x.root.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := x.root.Mkdir(p, 0o755); err != nil {
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("refusing to write %s: %s is a symlink", name, p)
		case !fi.IsDir():
			return fmt.Errorf("cannot write %s: %s is not a directory", name, p)
		}
	}
	return nil
}

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	name, err := x.target(hdr.Name)
	if err != nil {
		return err
	}
	if name == "" {
		return nil // the destination directory itself
	}
	if err := x.parents(name); err != nil {
		return err
	}
	osName := filepath.FromSlash(name)
	existing, err := x.root.Lstat(osName)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if exists && !existing.IsDir() {
			return fmt.Errorf("cannot overwrite %s with a directory", name)
		}
		if !exists {
			if err := x.root.Mkdir(osName, 0o700); err != nil {
				return err
			}
		}
		x.dirs = append(x.dirs, dirMode{osName, hdr})
		return nil
	case tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
		if exists && existing.IsDir() {
			return fmt.Errorf("cannot overwrite the directory %s with a file", name)
		}
		if exists {
			// Replace: never write through an existing file's symlink.
			if err := x.root.Remove(osName); err != nil {
				return err
			}
		}
	default:
		fmt.Fprintf(x.warn, "den: skipping %s: not a file, directory or symlink\n", name)
		return nil
	}
	switch hdr.Typeflag {
	case tar.TypeSymlink:
		if err := x.root.Symlink(hdr.Linkname, osName); err != nil {
			return err
		}
		return x.owner(osName, hdr)
	case tar.TypeLink:
		old, err := x.target(hdr.Linkname)
		if err != nil {
			return err
		}
		if old == "" {
			return fmt.Errorf("refusing hard link %s to a directory", name)
		}
		return x.root.Link(filepath.FromSlash(old), osName)
	}
	file, err := x.root.OpenFile(osName, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(file, r)
	if err == nil && x.archive {
		err = x.chown(file.Chown, hdr)
	}
	if err == nil {
		err = file.Chmod(x.mode(hdr))
	}
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if !hdr.ModTime.IsZero() {
		x.root.Chtimes(osName, hdr.ModTime, hdr.ModTime)
	}
	return nil
}

// finish sets directory modes and times, deepest first, once their
// contents are written.
func (x *extractor) finish() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		// The owner first: a chown clears setuid and setgid bits.
		if err := x.owner(d.name, d.hdr); err != nil {
			return err
		}
		if err := x.root.Chmod(d.name, x.mode(d.hdr)); err != nil {
			return err
		}
		if !d.hdr.ModTime.IsZero() {
			x.root.Chtimes(d.name, d.hdr.ModTime, d.hdr.ModTime)
		}
	}
	return nil
}

// mode is the mode an extracted file or directory gets: the archive's,
// without setuid and setgid unless archive is set.
func (x *extractor) mode(hdr *tar.Header) os.FileMode {
	m := client.FileMode(uint32(hdr.Mode))
	if !x.archive {
		m &^= os.ModeSetuid | os.ModeSetgid
	}
	return m
}

// owner gives name (not following a symlink) the archive's uid/gid when
// archive is set; otherwise it keeps the caller's.
func (x *extractor) owner(name string, hdr *tar.Header) error {
	if !x.archive {
		return nil
	}
	return x.chown(func(uid, gid int) error { return x.root.Lchown(name, uid, gid) }, hdr)
}

func (x *extractor) chown(chown func(uid, gid int) error, hdr *tar.Header) error {
	if err := chown(hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("keep the owner %d:%d of %s (-a): %w (giving files other owners needs root; without -a the copies are yours)", hdr.Uid, hdr.Gid, hdr.Name, err)
	}
	return nil
}
