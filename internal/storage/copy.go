package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

type fileID struct{ dev, ino uint64 }

// copier copies a tree the way a snapshot must see it: owners, modes,
// times, every extended attribute (overlayfs's trusted.overlay.* included),
// symbolic links, hard links (of any file type: overlayfs links its
// whiteouts), device nodes (whiteouts are 0:0 character devices), fifos,
// sockets and holes. Inode flags (chattr) are not copied.
type copier struct {
	links map[fileID]string // source inode with several links → first copy
	buf   []byte
}

// copyTree copies the contents and attributes of directory src into the
// existing directory dst.
func copyTree(src, dst string) error {
	c := &copier{links: map[fileID]string{}}
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("copy: %w", &os.PathError{Op: "lstat", Path: src, Err: err})
	}
	if err := c.dir(src, dst); err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	if err := c.attrs(src, dst, &st); err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	return nil
}

func (c *copier) dir(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		s, d := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		var st unix.Stat_t
		if err := unix.Lstat(s, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: s, Err: err}
		}
		if err := c.entry(s, d, &st); err != nil {
			return err
		}
	}
	return nil
}

// copyFault, when set (by tests), fails the copy of the paths it errors on.
var copyFault func(src string) error

func (c *copier) entry(s, d string, st *unix.Stat_t) error {
	if copyFault != nil {
		if err := copyFault(s); err != nil {
			return &os.PathError{Op: "copy", Path: s, Err: err}
		}
	}
	typ := st.Mode & unix.S_IFMT
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		id := fileID{st.Dev, st.Ino}
		if first, ok := c.links[id]; ok {
			return os.Link(first, d)
		}
		c.links[id] = d
	}
	var err error
	switch typ {
	case unix.S_IFDIR:
		if err = unix.Mkdir(d, 0o700); err == nil {
			err = c.dir(s, d)
		}
	case unix.S_IFREG:
		err = c.file(s, d, st.Size)
	case unix.S_IFLNK:
		var target string
		if target, err = os.Readlink(s); err == nil {
			err = unix.Symlink(target, d)
		}
	default: // character and block devices, fifos, sockets
		err = unix.Mknod(d, st.Mode&unix.S_IFMT|0o600, int(st.Rdev))
	}
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return err
		}
		return &os.PathError{Op: "copy", Path: s, Err: err}
	}
	return c.attrs(s, d, st)
}

// attrs gives d the owner, extended attributes, mode and times of s, in
// that order: chown clears set-id bits and security.capability.
func (c *copier) attrs(s, d string, st *unix.Stat_t) error {
	if os.Geteuid() == 0 || int(st.Uid) != os.Geteuid() || int(st.Gid) != os.Getegid() {
		if err := unix.Lchown(d, int(st.Uid), int(st.Gid)); err != nil {
			return &os.PathError{Op: "lchown", Path: d, Err: err}
		}
	}
	xs, err := listXattrs(s)
	if err != nil {
		return err
	}
	for _, x := range xs {
		if err := unix.Lsetxattr(d, x.name, x.value, 0); err != nil {
			return &os.PathError{Op: "setxattr " + x.name, Path: d, Err: err}
		}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Fchmodat(unix.AT_FDCWD, d, st.Mode&0o7777, 0); err != nil {
			return &os.PathError{Op: "chmod", Path: d, Err: err}
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, d, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimes", Path: d, Err: err}
	}
	return nil
}

type xattr struct {
	name  string
	value []byte
}

// listXattrs returns the extended attributes of path (not following a
// symbolic link) in the order the filesystem lists them.
func listXattrs(path string) ([]xattr, error) {
	var names []byte
	for size := 256; ; size *= 4 {
		names = make([]byte, size)
		n, err := unix.Llistxattr(path, names)
		if err == unix.ERANGE {
			continue
		}
		if err == unix.ENOTSUP {
			return nil, nil
		}
		if err != nil {
			return nil, &os.PathError{Op: "listxattr", Path: path, Err: err}
		}
		names = names[:n]
		break
	}
	var out []xattr
	for len(names) > 0 {
		i := 0
		for i < len(names) && names[i] != 0 {
			i++
		}
		name := string(names[:i])
		names = names[min(i+1, len(names)):]
		if name == "" {
			continue
		}
		for size := 256; ; size *= 4 {
			v := make([]byte, size)
			n, err := unix.Lgetxattr(path, name, v)
			if err == unix.ERANGE {
				continue
			}
			if err == unix.ENODATA {
				break // removed meanwhile
			}
			if err != nil {
				return nil, &os.PathError{Op: "getxattr " + name, Path: path, Err: err}
			}
			out = append(out, xattr{name, v[:n]})
			break
		}
	}
	return out, nil
}

// file copies regular file s to the new file d: a reflink where the
// filesystem shares extents, else copy_file_range over the data ranges
// only, so holes stay holes.
func (c *copier) file(s, d string, size int64) (err error) {
	in, err := os.OpenFile(s, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(d, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	if size == 0 {
		return nil
	}
	ifd, ofd := int(in.Fd()), int(out.Fd())
	if unix.IoctlFileClone(ofd, ifd) == nil {
		return nil
	}
	if err := dataRanges(ifd, size, func(off, end int64) error {
		if err := c.copyRange(ifd, ofd, off, end-off); err != nil {
			return &os.PathError{Op: "copy data", Path: s, Err: err}
		}
		return nil
	}); err != nil {
		return err
	}
	return out.Truncate(size)
}

// dataRanges calls fn, in order, for each range [off, end) of the first
// size bytes of file fd that may hold data: holes are skipped (where the
// filesystem has no SEEK_DATA, all of it is one range).
func dataRanges(fd int, size int64, fn func(off, end int64) error) error {
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			return nil // only a hole is left
		}
		if err != nil { // no SEEK_DATA: all of it is data
			data = off
		}
		end, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			end = size
		}
		end = min(end, size)
		if err := fn(data, end); err != nil {
			return err
		}
		off = end
	}
	return nil
}

// CopyFile makes dst (replacing it) a copy of regular file src as a tree
// copy makes one: a reflink where the filesystem shares extents, else the
// data ranges only, so holes stay holes. dst is synced to disk.
func CopyFile(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	c := &copier{}
	if err := c.file(src, dst, st.Size()); err != nil {
		os.Remove(dst)
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err == nil {
		err = f.Sync()
		f.Close()
	}
	if err != nil {
		os.Remove(dst)
	}
	return err
}

func (c *copier) copyRange(ifd, ofd int, off, n int64) error {
	roff, woff := off, off
	for n > 0 {
		k, err := unix.CopyFileRange(ifd, &roff, ofd, &woff, int(min(n, 1<<30)), 0)
		if err != nil {
			switch err {
			case unix.EXDEV, unix.EINVAL, unix.ENOSYS, unix.EOPNOTSUPP, unix.EBADF:
				return c.copySlow(ifd, ofd, roff, n)
			}
			return err
		}
		if k == 0 {
			return nil // the file shrank meanwhile
		}
		n -= int64(k)
	}
	return nil
}

func (c *copier) copySlow(ifd, ofd int, off, n int64) error {
	if c.buf == nil {
		c.buf = make([]byte, 1<<20)
	}
	for n > 0 {
		k, err := unix.Pread(ifd, c.buf[:min(n, int64(len(c.buf)))], off)
		if err != nil {
			return err
		}
		if k == 0 {
			return nil
		}
		if _, err := unix.Pwrite(ofd, c.buf[:k], off); err != nil {
			return err
		}
		off += int64(k)
		n -= int64(k)
	}
	return nil
}

// walkUsage sums st_blocks*512 over the tree at path, each inode once.
func walkUsage(path string) (int64, error) {
	seen := map[fileID]bool{}
	var total int64
	err := filepath.WalkDir(path, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if err == unix.ENOENT {
				return nil
			}
			return &os.PathError{Op: "lstat", Path: p, Err: err}
		}
		if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			id := fileID{st.Dev, st.Ino}
			if seen[id] {
				return nil
			}
			seen[id] = true
		}
		total += st.Blocks * 512
		return nil
	})
	return total, err
}
