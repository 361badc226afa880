package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// This file is the hardened layer unpacker. Every filesystem operation is
// relative to a directory file descriptor that was reached from the layer
// root by opening one path component at a time with O_NOFOLLOW, so nothing
// is ever created, written, chowned or chmodded through a symlink, and since
// entry names never contain "..", nothing can land outside the layer.

const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"

	maxNameLen   = 4096 // PATH_MAX
	maxNameDepth = 512  // path components of one entry name
)

type unpackOptions struct {
	maxBytes   int64 // total bytes of regular file contents
	maxEntries int64
	chown      bool // apply the headers' uid/gid (needs root)
}

type unpackStats struct {
	Entries        int64
	Files          int64
	Dirs           int64
	Symlinks       int64
	Hardlinks      int64
	Whiteouts      int64
	Opaques        int64
	SkippedDevices int64 // char/block devices and fifos, never created
	SkippedXattrs  int64
	Size           int64 // bytes of regular file contents written
}

// refusal is an entry the unpacker refuses by policy (as opposed to an I/O
// or format error, which may be caused by a corrupt blob).
type refusal struct{ msg string }

func (e *refusal) Error() string { return e.msg }

func refuse(msg string) error { return &refusal{msg} }

func refusef(format string, args ...any) error { return &refusal{fmt.Sprintf(format, args...)} }

// limitError is an exceeded limit; it is reported as is, not as an error of
// the entry that crossed the limit.
type limitError struct{ msg string }

func (e *limitError) Error() string { return e.msg }

type dirFix struct {
	rel          string
	mode         uint32
	atime, mtime unix.Timespec
}

type unpacker struct {
	rootFD int
	opt    unpackOptions
	stats  unpackStats
	dirs   []dirFix
}

// unpackTar extracts the uncompressed tar stream r into the existing, empty
// directory dest. dest itself must not be reachable by untrusted users while
// this runs (the store keeps it under a 0700 directory).
func unpackTar(ctx context.Context, r io.Reader, dest string, opt unpackOptions) (unpackStats, error) {
	rootFD, err := unix.Open(dest, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return unpackStats{}, &os.PathError{Op: "open", Path: dest, Err: err}
	}
	defer unix.Close(rootFD)
	u := &unpacker{rootFD: rootFD, opt: opt}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return u.stats, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return u.stats, fmt.Errorf("reading tar: %w", err)
		}
		u.stats.Entries++
		if u.stats.Entries > opt.maxEntries {
			return u.stats, &limitError{fmt.Sprintf("more than %d entries", opt.maxEntries)}
		}
		if err := u.entry(hdr, tr); err != nil {
			var le *limitError
			if errors.As(err, &le) {
				return u.stats, le
			}
			return u.stats, fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	if err := u.fixDirs(); err != nil {
		return u.stats, err
	}
	return u.stats, nil
}

// cleanEntryName validates a tar entry name (or hard link target) and returns
// it cleaned and relative to the layer root; "" is the root itself.
func cleanEntryName(name string) (string, error) {
	switch {
	case name == "":
		return "", refuse("empty name")
	case len(name) > maxNameLen:
		return "", refusef("name longer than %d bytes", maxNameLen)
	case strings.IndexByte(name, 0) >= 0:
		return "", refuse("name contains a NUL byte")
	case strings.HasPrefix(name, "/"):
		return "", refuse("absolute path")
	}
	parts := strings.Split(name, "/")
	if len(parts) > maxNameDepth {
		return "", refusef("more than %d path components", maxNameDepth)
	}
	for _, p := range parts {
		if p == ".." {
			return "", refuse(`path contains a ".." component`)
		}
	}
	c := path.Clean(name)
	if c == "." {
		return "", nil
	}
	return c, nil
}

func splitRel(rel string) (dir, base string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return "", rel
	}
	return rel[:i], rel[i+1:]
}

func timespec(t time.Time) unix.Timespec {
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

func headerTimes(hdr *tar.Header) (atime, mtime unix.Timespec) {
	mtime = timespec(hdr.ModTime)
	atime = mtime
	if !hdr.AccessTime.IsZero() {
		atime = timespec(hdr.AccessTime)
	}
	return atime, mtime
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader:
		return nil // metadata for the archive, not an entry
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		// Never created: sandboxes get their /dev from the runtime. Still
		// validate the name so a hostile name is refused consistently.
		if _, err := cleanEntryName(hdr.Name); err != nil {
			return err
		}
		u.stats.SkippedDevices++
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeGNUSparse, tar.TypeSymlink, tar.TypeLink:
	default:
		return refusef("unsupported tar entry type %q", hdr.Typeflag)
	}
	rel, err := cleanEntryName(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.Uid < 0 || uint64(hdr.Uid) >= 1<<32-1 || hdr.Gid < 0 || uint64(hdr.Gid) >= 1<<32-1 {
		return refusef("invalid owner %d:%d", hdr.Uid, hdr.Gid)
	}
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return refuse("the layer root can only be a directory")
		}
		return u.rootDir(hdr)
	}
	dirRel, base := splitRel(rel)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(dirRel, base)
	}

	pfd, err := u.openDir(dirRel, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)

	// Validate a hard link's target before touching anything.
	linkFD, linkBase := -1, ""
	if hdr.Typeflag == tar.TypeLink {
		linkFD, linkBase, err = u.linkTarget(rel, hdr.Linkname)
		if err != nil {
			return err
		}
		defer unix.Close(linkFD)
	}

	// Later entries replace earlier ones, except that a directory entry over
	// an existing directory merges with it.
	var st unix.Stat_t
	switch err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil:
		if hdr.Typeflag == tar.TypeDir && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			break
		}
		if err := removeAllAt(pfd, base); err != nil {
			return fmt.Errorf("replacing existing %q: %w", rel, err)
		}
	case errors.Is(err, unix.ENOENT):
	default:
		return err
	}

	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.dir(pfd, rel, base, hdr)
	case tar.TypeReg, tar.TypeGNUSparse:
		return u.file(pfd, base, hdr, r)
	case tar.TypeSymlink:
		return u.symlink(pfd, base, hdr)
	case tar.TypeLink:
		if err := unix.Linkat(linkFD, linkBase, pfd, base, 0); err != nil {
			return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
		}
		u.stats.Hardlinks++
		return nil
	}
	return nil
}

// openDir opens the directory rel (relative to the layer root) without
// following any symlink, creating missing components (mode 0755) if create
// is set. The caller closes the returned descriptor.
func (u *unpacker) openDir(rel string, create bool) (int, error) {
	fd, err := unix.Openat(u.rootFD, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if rel == "" {
		return fd, nil
	}
	done := ""
	for _, c := range strings.Split(rel, "/") {
		next, err := openChildDir(fd, c)
		if errors.Is(err, unix.ENOENT) && create {
			err = unix.Mkdirat(fd, c, 0o755)
			if err == nil || errors.Is(err, unix.EEXIST) {
				next, err = openChildDir(fd, c)
			}
		}
		if err != nil {
			err = componentError(fd, c, path.Join(done, c), err)
			unix.Close(fd)
			return -1, err
		}
		unix.Close(fd)
		fd = next
		done = path.Join(done, c)
	}
	return fd, nil
}

func openChildDir(fd int, name string) (int, error) {
	for {
		n, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		return n, err
	}
}

// componentError explains why the path component name (at rel) could not be
// opened as a directory.
func componentError(dirFD int, name, rel string, err error) error {
	var st unix.Stat_t
	if unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			return refusef("path component %q is a symlink (not followed)", rel)
		case unix.S_IFDIR:
		default:
			return refusef("path component %q is not a directory", rel)
		}
	}
	if errors.Is(err, unix.ENOENT) {
		return refusef("%q does not exist in this layer", rel)
	}
	return fmt.Errorf("opening %q: %w", rel, err)
}

// linkTarget validates a hard link target: inside the layer, reached
// without symlinks, an existing regular file. It returns a descriptor of
// the target's directory and the target's base name.
func (u *unpacker) linkTarget(rel, linkname string) (int, string, error) {
	target, err := cleanEntryName(linkname)
	if err != nil {
		return -1, "", fmt.Errorf("hard link target %q: %w", linkname, err)
	}
	if target == "" {
		return -1, "", refusef("hard link target %q is the layer root", linkname)
	}
	if target == rel {
		return -1, "", refusef("hard link to itself")
	}
	tdir, tbase := splitRel(target)
	if strings.HasPrefix(tbase, whiteoutPrefix) {
		return -1, "", refusef("hard link target %q is a whiteout", linkname)
	}
	tfd, err := u.openDir(tdir, false)
	if err != nil {
		return -1, "", fmt.Errorf("hard link target %q: %w", linkname, err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		unix.Close(tfd)
		if errors.Is(err, unix.ENOENT) {
			return -1, "", refusef("hard link target %q does not exist in this layer", linkname)
		}
		return -1, "", fmt.Errorf("hard link target %q: %w", linkname, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(tfd)
		return -1, "", refusef("hard link target %q is not a regular file", linkname)
	}
	return tfd, tbase, nil
}

// removeAllAt removes name (recursively if it is a directory) from dirFD
// without following symlinks.
func removeAllAt(dirFD int, name string) error {
	err := unix.Unlinkat(dirFD, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, err := openChildDir(dirFD, name)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err != nil {
		f.Close()
		return err
	}
	for _, n := range names {
		if err := removeAllAt(fd, n); err != nil {
			f.Close()
			return err
		}
	}
	f.Close()
	return unix.Unlinkat(dirFD, name, unix.AT_REMOVEDIR)
}

func (u *unpacker) chown(fn func() error) error {
	if !u.opt.chown {
		return nil
	}
	return fn()
}

func (u *unpacker) rootDir(hdr *tar.Header) error {
	if err := u.chown(func() error { return unix.Fchown(u.rootFD, hdr.Uid, hdr.Gid) }); err != nil {
		return err
	}
	u.xattrs(u.rootFD, hdr, false)
	atime, mtime := headerTimes(hdr)
	u.dirs = append(u.dirs, dirFix{rel: "", mode: uint32(hdr.Mode) & 0o7777, atime: atime, mtime: mtime})
	u.stats.Dirs++
	return nil
}

func (u *unpacker) dir(pfd int, rel, base string, hdr *tar.Header) error {
	// Created 0755 so that a restrictive mode cannot get in the way of
	// extracting the directory's own contents; the header's mode is applied
	// by fixDirs at the end.
	if err := unix.Mkdirat(pfd, base, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	if err := u.chown(func() error {
		return unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)
	}); err != nil {
		return err
	}
	if hasXattrs(hdr) {
		fd, err := openChildDir(pfd, base)
		if err != nil {
			return err
		}
		u.xattrs(fd, hdr, false)
		unix.Close(fd)
	}
	atime, mtime := headerTimes(hdr)
	u.dirs = append(u.dirs, dirFix{rel: rel, mode: uint32(hdr.Mode) & 0o7777, atime: atime, mtime: mtime})
	u.stats.Dirs++
	return nil
}

func (u *unpacker) file(pfd int, base string, hdr *tar.Header, r io.Reader) error {
	if hdr.Size > u.opt.maxBytes-u.stats.Size {
		return &limitError{fmt.Sprintf("more than %d bytes of file contents", u.opt.maxBytes)}
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), base)
	n, err := io.Copy(f, r)
	u.stats.Size += n
	if err == nil && n != hdr.Size {
		err = io.ErrUnexpectedEOF
	}
	if err == nil {
		// chown before chmod: chown clears setuid/setgid bits, and before
		// xattrs: it also drops security.capability.
		err = u.chown(func() error { return unix.Fchown(fd, hdr.Uid, hdr.Gid) })
	}
	if err == nil {
		err = unix.Fchmod(fd, uint32(hdr.Mode)&0o7777)
	}
	if err == nil {
		u.xattrs(fd, hdr, true)
		atime, mtime := headerTimes(hdr)
		err = unix.UtimesNanoAt(pfd, base, []unix.Timespec{atime, mtime}, unix.AT_SYMLINK_NOFOLLOW)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	u.stats.Files++
	return nil
}

func (u *unpacker) symlink(pfd int, base string, hdr *tar.Header) error {
	if hdr.Linkname == "" {
		return refuse("symlink with an empty target")
	}
	// The target is stored verbatim and never followed here; it is resolved
	// inside the sandbox.
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
		return err
	}
	if err := u.chown(func() error {
		return unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)
	}); err != nil {
		return err
	}
	atime, mtime := headerTimes(hdr)
	if err := unix.UtimesNanoAt(pfd, base, []unix.Timespec{atime, mtime}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	u.stats.Symlinks++
	return nil
}

// whiteout converts an AUFS-style whiteout entry to overlayfs form.
func (u *unpacker) whiteout(dirRel, base string) error {
	pfd, err := u.openDir(dirRel, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if base == whiteoutOpaque {
		if err := unix.Fsetxattr(pfd, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
			return fmt.Errorf("marking %q opaque: %w", dirRel, err)
		}
		u.stats.Opaques++
		return nil
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil // other AUFS metadata (.wh..wh.plnk etc.): meaningless here
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return refusef("invalid whiteout %q", base)
	}
	if err := removeAllAt(pfd, name); err != nil {
		return fmt.Errorf("replacing existing %q: %w", path.Join(dirRel, name), err)
	}
	// overlayfs whiteout: a character device 0/0, owned by root.
	if err := unix.Mknodat(pfd, name, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("creating whiteout for %q: %w", path.Join(dirRel, name), err)
	}
	if err := u.chown(func() error { return unix.Fchownat(pfd, name, 0, 0, unix.AT_SYMLINK_NOFOLLOW) }); err != nil {
		return err
	}
	u.stats.Whiteouts++
	return nil
}

const paxXattr = "SCHILY.xattr."

func hasXattrs(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, paxXattr) {
			return true
		}
	}
	return false
}

// allowedXattr: only user.* (minus user.overlay.*, which overlayfs would
// interpret under the userxattr mount option) and, on regular files,
// security.capability. trusted.*, security.selinux, ACLs etc. are dropped.
func allowedXattr(name string, regular bool) bool {
	if name == "security.capability" {
		return regular
	}
	return strings.HasPrefix(name, "user.") && !strings.HasPrefix(name, "user.overlay.")
}

// xattrs applies the allowed xattrs of hdr to fd; they are best effort.
func (u *unpacker) xattrs(fd int, hdr *tar.Header, regular bool) {
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattr)
		if !ok {
			continue
		}
		if !allowedXattr(name, regular) || unix.Fsetxattr(fd, name, []byte(v), 0) != nil {
			u.stats.SkippedXattrs++
		}
	}
}

// fixDirs applies the directories' modes and times, deepest first, after
// everything has been extracted.
func (u *unpacker) fixDirs() error {
	// The last header for a path wins.
	last := make(map[string]int, len(u.dirs))
	for i, d := range u.dirs {
		last[d.rel] = i
	}
	order := make([]int, 0, len(last))
	for _, i := range last {
		order = append(order, i)
	}
	depth := func(rel string) int {
		if rel == "" {
			return 0
		}
		return strings.Count(rel, "/") + 1
	}
	sort.Slice(order, func(a, b int) bool {
		da, db := depth(u.dirs[order[a]].rel), depth(u.dirs[order[b]].rel)
		if da != db {
			return da > db
		}
		return order[a] > order[b]
	})
	for _, i := range order {
		d := u.dirs[i]
		fd, err := u.openDir(d.rel, false)
		if err != nil {
			continue // replaced by a later entry, which then owns the name
		}
		err = unix.Fchmod(fd, d.mode)
		if err == nil {
			err = unix.UtimesNanoAt(fd, ".", []unix.Timespec{d.atime, d.mtime}, 0)
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("directory %q: %w", d.rel, err)
		}
	}
	return nil
}
