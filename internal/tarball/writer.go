// Package tarball writes files from a local file system as a tar stream. It
// is the one tar writer of the CLI (den cp, den image build) and of the
// agent (a sandbox's archive download), so that the entries all of them
// send are built alike: no user or group names, symlinks stored as
// symlinks, hard links kept as links, and a regular file's body exactly
// the size its header says even if the file changes while it is read.
package tarball

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"syscall"
	"time"
)

// ErrSkipped is what Add returns for an entry it left out of the stream:
// one that is neither a regular file, a directory nor a symlink (devices,
// fifos and sockets are never copied), or one whose open function returned
// an error wrapping ErrSkipped.
var ErrSkipped = errors.New("left out of the archive")

// Writer adds files to a tar stream.
type Writer struct {
	tw    *tar.Writer
	links map[[2]uint64]string

	// KeepOwner keeps each file's uid and gid; otherwise entries are 0:0.
	KeepOwner bool
	// Seconds truncates modification times to whole seconds (a copy is
	// never newer than its source) and drops access and change times;
	// otherwise the tar writer rounds them to the nearest second.
	Seconds bool
	// HardLinks writes a regular file with several links once, and each
	// later name of it as a hard link to the first.
	HardLinks bool
}

// NewWriter returns a Writer that writes a tar stream to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{tw: tar.NewWriter(w), links: map[[2]uint64]string{}}
}

// Add writes one entry named name (a directory's gets a trailing "/"):
// info is the file's Lstat, target a symlink's target, and open opens a
// regular file; it is called only when the file's body is to be written.
func (w *Writer) Add(name string, info fs.FileInfo, target string, open func() (io.ReadCloser, error)) error {
	mode := info.Mode()
	if !mode.IsRegular() && !mode.IsDir() && mode&fs.ModeSymlink == 0 {
		return ErrSkipped
	}
	hdr, err := tar.FileInfoHeader(info, target)
	if err != nil {
		return err
	}
	hdr.Name = name
	if mode.IsDir() {
		hdr.Name += "/"
	}
	if w.Seconds {
		hdr.ModTime = hdr.ModTime.Truncate(time.Second)
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	}
	hdr.Uname, hdr.Gname = "", ""
	if !w.KeepOwner {
		hdr.Uid, hdr.Gid = 0, 0
	}
	if sys, ok := info.Sys().(*syscall.Stat_t); ok && w.HardLinks && mode.IsRegular() && sys.Nlink > 1 {
		key := [2]uint64{uint64(sys.Dev), sys.Ino}
		if first, ok := w.links[key]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			return w.tw.WriteHeader(hdr)
		}
		w.links[key] = hdr.Name
	}
	if !mode.IsRegular() {
		return w.tw.WriteHeader(hdr)
	}
	f, err := open()
	if err != nil {
		return err
	}
	defer f.Close()
	if err := w.tw.WriteHeader(hdr); err != nil {
		return err
	}
	// Exactly the header's size, even if the file changed meanwhile.
	n, err := io.Copy(w.tw, io.LimitReader(f, hdr.Size))
	if err == nil && n < hdr.Size {
		_, err = io.CopyN(w.tw, zeros{}, hdr.Size-n)
	}
	return err
}

// AddBytes writes a regular file named name holding b, mode 0644, dated now.
func (w *Writer) AddBytes(name string, b []byte) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: time.Now().Truncate(time.Second)}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err := w.tw.Write(b)
	return err
}

// Close writes the end of the stream; it does not close the underlying writer.
func (w *Writer) Close() error { return w.tw.Close() }

// Skip wraps err (why a file could not be opened) so that Add leaves the
// entry out and returns an error that errors.Is ErrSkipped.
func Skip(err error) error { return fmt.Errorf("%w: %w", ErrSkipped, err) }

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
