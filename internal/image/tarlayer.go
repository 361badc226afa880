package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// This file is the deterministic layer tar writer, used by Save (to turn an
// unpacked layer back into a layer tar) and by AddLayerFromDir (to make a
// layer of an overlayfs upper directory and compute its diffID). The same
// tree always gives the same bytes:
//
//   - entries in depth-first order, the names of a directory sorted
//     bytewise, every directory before its contents; no entry for the root;
//   - names relative, directories with a trailing "/";
//   - PAX format: numeric uid/gid only (no user or group names), mode bits
//     including setuid/setgid/sticky, mtime to the nanosecond, no atime or
//     ctime;
//   - xattrs as SCHILY.xattr records, only those the unpacker keeps (user.*
//     except user.overlay.*, and security.capability on regular files);
//   - a regular file with more links is stored once, its later names (in
//     that order) as hard links to the first;
//   - an overlayfs whiteout (a 0/0 character device) becomes an empty
//     regular file ".wh.NAME", an opaque directory (trusted.overlay.opaque=y)
//     gets an empty ".wh..wh..opq" right after its own entry; both markers
//     with mode 0600, owner 0:0 and mtime 0, whatever the source;
//   - other device nodes, fifos and sockets are skipped, and so are names
//     beginning with ".wh." (a tar cannot hold them: they would be read as
//     whiteouts).
//
// The tree is read without following symlinks: every directory is opened
// relative to its parent's descriptor with O_NOFOLLOW, every file too.

// overflowID is the owner given to ids outside a mapped range (the
// kernel's overflow uid/gid).
const overflowID = 65534

type tarOptions struct {
	// idBase and idRange shift owners: an id in [idBase, idBase+idRange)
	// becomes id-idBase, any other id overflowID. idRange 0: ids as they
	// are.
	idBase, idRange int64
	// maxBytes, if > 0, bounds the total size of the regular files: the
	// writer fails (with a *limitError) before writing more.
	maxBytes int64
}

type tarStats struct {
	Entries     int64
	Skipped     int64 // device nodes, fifos, sockets
	SkippedWh   int64 // names beginning with .wh.
	OverflowIDs int64 // owners outside the id range
}

// markerTime is the mtime of whiteout and opaque marker entries.
var markerTime = time.Unix(0, 0)

type layerTarWriter struct {
	ctx   context.Context
	tw    *tar.Writer
	opt   tarOptions
	links map[[2]uint64]string // (dev, ino) of files with more links -> first name
	stats tarStats
	bytes int64 // of regular files so far
	buf   []byte
}

// writeLayerTar writes the deterministic tar of the tree root to w.
func writeLayerTar(ctx context.Context, w io.Writer, root string, opt tarOptions) (tarStats, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return tarStats{}, &os.PathError{Op: "open", Path: root, Err: err}
	}
	lw := &layerTarWriter{
		ctx:   ctx,
		tw:    tar.NewWriter(w),
		opt:   opt,
		links: map[[2]uint64]string{},
		buf:   make([]byte, 256<<10),
	}
	_, opaque, err := lw.xattrs(fd, false, ".")
	if err == nil && opaque {
		err = lw.marker(whiteoutOpaque)
	}
	if err == nil {
		err = lw.dir(fd, "", 0)
	} else {
		unix.Close(fd)
	}
	if err == nil {
		err = lw.tw.Close()
	}
	return lw.stats, err
}

func (lw *layerTarWriter) mapID(id uint32) int {
	if lw.opt.idRange <= 0 {
		return int(id)
	}
	if v := int64(id) - lw.opt.idBase; v >= 0 && v < lw.opt.idRange {
		return int(v)
	}
	lw.stats.OverflowIDs++
	return overflowID
}

func (lw *layerTarWriter) header(name string, typ byte, st *unix.Stat_t) *tar.Header {
	return &tar.Header{
		Typeflag: typ,
		Name:     name,
		Mode:     int64(st.Mode & 0o7777),
		Uid:      lw.mapID(st.Uid),
		Gid:      lw.mapID(st.Gid),
		ModTime:  time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Format:   tar.FormatPAX,
	}
}

func (lw *layerTarWriter) write(hdr *tar.Header) error {
	if err := lw.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("%s: %w", hdr.Name, err)
	}
	lw.stats.Entries++
	return nil
}

// marker writes a whiteout or opaque marker entry.
func (lw *layerTarWriter) marker(name string) error {
	return lw.write(&tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     0o600,
		ModTime:  markerTime,
		Format:   tar.FormatPAX,
	})
}

// dir writes the contents of the directory fd (whose name in the tar is
// prefix, "" or ending in "/"), and closes fd.
func (lw *layerTarWriter) dir(fd int, prefix string, depth int) error {
	f := os.NewFile(uintptr(fd), prefix)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("reading directory %q: %w", prefix, err)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := lw.ctx.Err(); err != nil {
			return err
		}
		if err := lw.entry(fd, prefix, name, depth+1); err != nil {
			return err
		}
	}
	return nil
}

func (lw *layerTarWriter) entry(dirFD int, prefix, name string, depth int) error {
	rel := prefix + name
	if strings.HasPrefix(name, whiteoutPrefix) {
		lw.stats.SkippedWh++
		return nil
	}
	if depth > maxNameDepth || len(rel)+1 > maxNameLen {
		return fmt.Errorf("%q: path too long for a layer (more than %d components or %d bytes)", rel, maxNameDepth, maxNameLen)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // removed meanwhile
		}
		return fmt.Errorf("%q: %w", rel, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return lw.subdir(dirFD, rel, name, depth)
	case unix.S_IFREG:
		return lw.file(dirFD, rel, name)
	case unix.S_IFLNK:
		target, err := readlinkat(dirFD, name)
		if err != nil {
			return fmt.Errorf("%q: %w", rel, err)
		}
		hdr := lw.header(rel, tar.TypeSymlink, &st)
		hdr.Linkname = target
		return lw.write(hdr)
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			return lw.marker(prefix + whiteoutPrefix + name)
		}
	}
	lw.stats.Skipped++
	return nil
}

func (lw *layerTarWriter) subdir(dirFD int, rel, name string, depth int) error {
	fd, err := openChildDir(dirFD, name)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("%q: %w", rel, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return fmt.Errorf("%q: %w", rel, err)
	}
	hdr := lw.header(rel+"/", tar.TypeDir, &st)
	recs, opaque, err := lw.xattrs(fd, false, rel)
	if err == nil {
		hdr.PAXRecords = recs
		err = lw.write(hdr)
	}
	if err == nil && opaque {
		err = lw.marker(rel + "/" + whiteoutOpaque)
	}
	if err != nil {
		unix.Close(fd)
		return err
	}
	return lw.dir(fd, rel+"/", depth)
}

func (lw *layerTarWriter) file(dirFD int, rel, name string) error {
	const flags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	fd, err := unix.Openat(dirFD, name, flags|unix.O_NOATIME, 0)
	if errors.Is(err, unix.EPERM) {
		fd, err = unix.Openat(dirFD, name, flags, 0) // O_NOATIME needs ownership
	}
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("%q: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		lw.stats.Skipped++ // replaced meanwhile
		return nil
	}
	if st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := lw.links[key]; ok {
			hdr := lw.header(rel, tar.TypeLink, &st)
			hdr.Linkname = first
			return lw.write(hdr)
		}
		lw.links[key] = rel
	}
	if lw.opt.maxBytes > 0 && st.Size > lw.opt.maxBytes-lw.bytes {
		return &limitError{fmt.Sprintf("more than %d bytes of file contents", lw.opt.maxBytes)}
	}
	lw.bytes += st.Size
	hdr := lw.header(rel, tar.TypeReg, &st)
	hdr.Size = st.Size
	recs, _, err := lw.xattrs(fd, true, rel)
	if err != nil {
		return err
	}
	hdr.PAXRecords = recs
	if err := lw.write(hdr); err != nil {
		return err
	}
	n, err := io.CopyBuffer(lw.tw, io.LimitReader(ctxReader{lw.ctx, f}, st.Size), lw.buf)
	if err == nil && n != st.Size {
		err = fmt.Errorf("file shrank from %d to %d bytes while being read", st.Size, n)
	}
	if err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	return nil
}

// ctxReader fails reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// xattrs returns the PAX records of the xattrs of fd that a layer keeps,
// and whether fd is an opaque directory. The overlayfs xattrs that make an
// upper directory depend on its lower layers (metacopy, redirect) are
// refused: such a tree cannot become a layer on its own.
func (lw *layerTarWriter) xattrs(fd int, regular bool, rel string) (map[string]string, bool, error) {
	names, err := flistxattr(fd)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("%q: listing xattrs: %w", rel, err)
	}
	var recs map[string]string
	opaque := false
	for _, name := range names {
		switch {
		case name == "trusted.overlay.opaque":
			v, err := fgetxattr(fd, name)
			if err != nil {
				return nil, false, fmt.Errorf("%q: xattr %s: %w", rel, name, err)
			}
			opaque = v == "y"
		case name == "trusted.overlay.metacopy", name == "trusted.overlay.redirect":
			return nil, false, refusef("%q has the overlayfs xattr %s: its data is in a lower layer (mount overlays with metacopy=off,redirect_dir=off)", rel, name)
		case allowedXattr(name, regular):
			v, err := fgetxattr(fd, name)
			if errors.Is(err, unix.ENODATA) {
				continue // removed meanwhile
			}
			if err != nil {
				return nil, false, fmt.Errorf("%q: xattr %s: %w", rel, name, err)
			}
			if recs == nil {
				recs = map[string]string{}
			}
			recs[paxXattr+name] = v
		}
	}
	return recs, opaque, nil
}

func flistxattr(fd int) ([]string, error) {
	size := 1024
	for {
		buf := make([]byte, size)
		n, err := unix.Flistxattr(fd, buf)
		if errors.Is(err, unix.ERANGE) && size < 1<<20 {
			size *= 4
			continue
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, b := range strings.Split(string(buf[:n]), "\x00") {
			if b != "" {
				names = append(names, b)
			}
		}
		sort.Strings(names)
		return names, nil
	}
}

func fgetxattr(fd int, name string) (string, error) {
	size := 256
	for {
		buf := make([]byte, size)
		n, err := unix.Fgetxattr(fd, name, buf)
		if errors.Is(err, unix.ERANGE) && size < 1<<20 {
			size *= 4
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

func readlinkat(dirFD int, name string) (string, error) {
	for size := 256; ; size *= 4 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirFD, name, buf)
		if err != nil {
			return "", err
		}
		if n < size || size >= 1<<16 {
			return string(buf[:n]), nil
		}
	}
}
