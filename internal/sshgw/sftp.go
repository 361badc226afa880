package sshgw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"sync"
	"time"

	"github.com/pkg/sftp"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// The sftp subsystem is served from den's file API, so it works on every
// tier and every path resolves inside the sandbox. That API moves whole
// files as streams; sftp reads and writes at offsets, which arrive slightly
// out of order from the server's workers. Reads keep a window of the
// stream behind them (reopening the file for a jump backwards); writes
// stream in offset order, holding early arrivals up to a bound. Setting
// attributes (scp -p, chmod in sftp) runs chmod, chown, touch or truncate
// inside the sandbox.

// sftpWindow is how far behind the furthest read a read may ask without
// reopening the file, and how far ahead of the stream a write may arrive.
const sftpWindow = 8 << 20

func (s *session) sftp() error {
	fs := &sftpFS{ctx: s.ctx, c: s.l.c, id: s.l.sb.ID, writers: map[string]*fileWriter{}}
	start := "/"
	if fi, err := fs.c.Stat(s.ctx, fs.id, "/root"); err == nil && fi.Type == "dir" {
		start = "/root"
	}
	h := sftp.Handlers{FileGet: fs, FilePut: fs, FileCmd: logCmd{fs, s}, FileList: fs}
	// The server closes what it serves when done; the channel stays open
	// for the exit status.
	rw := struct {
		io.Reader
		io.Writer
		io.Closer
	}{s.ch, s.ch, io.NopCloser(nil)}
	rs := sftp.NewRequestServer(rw, h, sftp.WithStartDirectory(start))
	defer rs.Close()
	if err := rs.Serve(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

type sftpFS struct {
	ctx context.Context
	c   *client.Client
	id  string

	mu      sync.Mutex
	writers map[string]*fileWriter // uploads in progress, by path
}

// fsErr maps API errors to the errors sftp reports with its own codes.
func fsErr(err error) error {
	var ae *api.Error
	if errors.As(err, &ae) && ae.Kind == api.KindNotFound {
		return os.ErrNotExist
	}
	return err
}

func (f *sftpFS) Fileread(r *sftp.Request) (io.ReaderAt, error) {
	fi, err := f.c.Stat(f.ctx, f.id, r.Filepath)
	if err != nil {
		return nil, fsErr(err)
	}
	if fi.Type == "dir" {
		return nil, fmt.Errorf("%s is a directory", r.Filepath)
	}
	return &fileReader{f: f, path: r.Filepath}, nil
}

// fileReader serves ReadAt from one sequential stream of the file.
type fileReader struct {
	f    *sftpFS
	path string
	mu   sync.Mutex
	rc   io.ReadCloser
	buf  []byte // the stream's bytes [start, start+len(buf))
	base int64
	eof  bool
}

func (fr *fileReader) ReadAt(p []byte, off int64) (int, error) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if fr.rc == nil || off < fr.base {
		if err := fr.reopen(); err != nil {
			return 0, err
		}
	}
	want := off + int64(len(p))
	for fr.base+int64(len(fr.buf)) < want && !fr.eof {
		chunk := make([]byte, 64<<10)
		n, err := io.ReadFull(fr.rc, chunk)
		fr.buf = append(fr.buf, chunk[:n]...)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			fr.eof = true
		} else if err != nil {
			return 0, err
		}
		// Keep the window behind the furthest read (trimmed in large
		// steps, so the copy is amortised).
		if int64(len(fr.buf)) > 2*sftpWindow {
			drop := min(int64(len(fr.buf))-sftpWindow, off-fr.base)
			if drop > 0 {
				fr.buf = append([]byte(nil), fr.buf[drop:]...)
				fr.base += drop
			}
		}
	}
	if off >= fr.base+int64(len(fr.buf)) {
		return 0, io.EOF
	}
	n := copy(p, fr.buf[off-fr.base:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (fr *fileReader) reopen() error {
	if fr.rc != nil {
		fr.rc.Close()
	}
	rc, err := fr.f.c.ReadFile(fr.f.ctx, fr.f.id, fr.path)
	if err != nil {
		return fsErr(err)
	}
	fr.rc, fr.buf, fr.base, fr.eof = rc, nil, 0, false
	return nil
}

func (fr *fileReader) Close() error {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if fr.rc != nil {
		return fr.rc.Close()
	}
	return nil
}

func (f *sftpFS) Filewrite(r *sftp.Request) (io.WriterAt, error) {
	fl := r.Pflags()
	if fl.Append {
		return nil, fmt.Errorf("appending is not supported by den's file API: upload the whole file: %w", sftp.ErrSSHFxOpUnsupported)
	}
	if fl.Excl {
		if _, err := f.c.Stat(f.ctx, f.id, r.Filepath); err == nil {
			return nil, os.ErrExist
		}
	}
	pr, pw := io.Pipe()
	w := &fileWriter{fs: f, path: r.Filepath, pw: pw, pending: map[int64][]byte{}, size: -1, done: make(chan struct{})}
	f.mu.Lock()
	f.writers[r.Filepath] = w
	f.mu.Unlock()
	go func() {
		_, err := f.c.WriteFile(f.ctx, f.id, r.Filepath, pr, 0)
		w.err = fsErr(err)
		pr.CloseWithError(errors.New("the upload ended"))
		close(w.done)
	}()
	return w, nil
}

// fileWriter streams WriteAt calls to one upload, in offset order.
// Attributes set while it is open (scp sets the size, and with -p the mode
// and times, before closing) apply when the upload is complete.
type fileWriter struct {
	fs      *sftpFS
	path    string
	mu      sync.Mutex
	size    int64 // the size asked for while open; -1: none
	attrs   *sftp.FileStat
	flags   sftp.FileAttrFlags
	pw      *io.PipeWriter
	next    int64
	pending map[int64][]byte
	held    int
	done    chan struct{}
	err     error // the upload's, once done is closed
}

func (w *fileWriter) WriteAt(p []byte, off int64) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case off < w.next:
		return 0, fmt.Errorf("den's file API writes files front to back: a write at %d after %d: %w", off, w.next, sftp.ErrSSHFxOpUnsupported)
	case off > w.next:
		if w.held+len(p) > sftpWindow {
			return 0, fmt.Errorf("writes arrive too far out of order (at %d, expecting %d)", off, w.next)
		}
		w.pending[off] = append([]byte(nil), p...)
		w.held += len(p)
		return len(p), nil
	}
	if err := w.write(p); err != nil {
		return 0, err
	}
	for {
		b, ok := w.pending[w.next]
		if !ok {
			return len(p), nil
		}
		delete(w.pending, w.next)
		w.held -= len(b)
		if err := w.write(b); err != nil {
			return 0, err
		}
	}
}

func (w *fileWriter) write(b []byte) error {
	n, err := w.pw.Write(b)
	w.next += int64(n)
	if err != nil {
		<-w.done
		if w.err != nil {
			return w.err
		}
	}
	return err
}

// setAttrs records attributes set while the upload is open.
func (w *fileWriter) setAttrs(fl sftp.FileAttrFlags, a *sftp.FileStat) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if fl.Size {
		if int64(a.Size) < w.next {
			return fmt.Errorf("den's file API cannot truncate a file while writing it (at %d, %d written): %w", a.Size, w.next, sftp.ErrSSHFxOpUnsupported)
		}
		w.size = int64(a.Size)
		fl.Size = false
	}
	if fl.UidGid || fl.Permissions || fl.Acmodtime {
		w.flags, w.attrs = fl, a
	}
	return nil
}

// Close writes what is held (the gaps of a sparse write as zeros), ends the
// upload, applies attributes set meanwhile and returns the outcome.
func (w *fileWriter) Close() error {
	w.fs.mu.Lock()
	if w.fs.writers[w.path] == w {
		delete(w.fs.writers, w.path)
	}
	w.fs.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.flush(); err != nil {
		return err
	}
	w.pw.Close()
	<-w.done
	if w.err != nil || w.attrs == nil {
		return w.err
	}
	return w.fs.applyAttrs(w.path, w.flags, w.attrs)
}

// flush writes the held writes in order, the gaps between them (and up to
// a size set while open) as zeros.
func (w *fileWriter) flush() error {
	for len(w.pending) > 0 {
		first := int64(-1)
		for off := range w.pending {
			if first < 0 || off < first {
				first = off
			}
		}
		if err := w.write(make([]byte, first-w.next)); err != nil {
			return err
		}
		b := w.pending[first]
		delete(w.pending, first)
		if err := w.write(b); err != nil {
			return err
		}
	}
	if w.size > w.next {
		return w.write(make([]byte, w.size-w.next))
	}
	return nil
}

func (f *sftpFS) Filecmd(r *sftp.Request) error {
	switch r.Method {
	case "Setstat":
		return f.setstat(r)
	case "Rename", "PosixRename":
		_, err := f.c.Rename(f.ctx, f.id, r.Filepath, r.Target)
		return fsErr(err)
	case "Rmdir":
		fi, err := f.c.Stat(f.ctx, f.id, r.Filepath)
		if err != nil {
			return fsErr(err)
		}
		if fi.Type != "dir" {
			return fmt.Errorf("%s is not a directory", r.Filepath)
		}
		return fsErr(f.c.RemoveFile(f.ctx, f.id, r.Filepath, false))
	case "Remove":
		fi, err := f.c.Stat(f.ctx, f.id, r.Filepath)
		if err != nil {
			return fsErr(err)
		}
		if fi.Type == "dir" {
			return fmt.Errorf("%s is a directory: use rmdir", r.Filepath)
		}
		return fsErr(f.c.RemoveFile(f.ctx, f.id, r.Filepath, false))
	case "Mkdir":
		_, err := f.c.Mkdir(f.ctx, f.id, r.Filepath, 0, false)
		return fsErr(err)
	}
	return sftp.ErrSSHFxOpUnsupported // Symlink, Link
}

// setstat applies the attributes an sftp client sets (scp -p, chmod):
// to an upload in progress when it is complete, else at once.
func (f *sftpFS) setstat(r *sftp.Request) error {
	fl, a := r.AttrFlags(), r.Attributes()
	f.mu.Lock()
	w := f.writers[r.Filepath]
	f.mu.Unlock()
	if w != nil {
		return w.setAttrs(fl, a)
	}
	return f.applyAttrs(r.Filepath, fl, a)
}

// applyAttrs sets attributes with the sandbox's own truncate, chown, chmod
// and touch.
func (f *sftpFS) applyAttrs(p string, fl sftp.FileAttrFlags, a *sftp.FileStat) error {
	script := ""
	args := []string{"/bin/sh", "-c", "", "setstat", p}
	if fl.Size {
		script += `truncate -s "$2" -- "$1" && `
		args = append(args, strconv.FormatUint(a.Size, 10))
	} else {
		args = append(args, "")
	}
	if fl.UidGid {
		script += `chown "$3" -- "$1" && `
		args = append(args, fmt.Sprintf("%d:%d", a.UID, a.GID))
	} else {
		args = append(args, "")
	}
	if fl.Permissions {
		script += `chmod "$4" -- "$1" && `
		args = append(args, strconv.FormatUint(uint64(a.Mode&0o7777), 8))
	} else {
		args = append(args, "")
	}
	if fl.Acmodtime {
		script += `touch -m -d "@$5" -- "$1" && `
		args = append(args, strconv.FormatUint(uint64(a.Mtime), 10))
	}
	if script == "" {
		return nil
	}
	args[2] = script + "true"
	res, err := f.c.Exec(f.ctx, f.id, api.ExecRequest{Cmd: args, Timeout: api.Duration(30 * time.Second)})
	if err != nil {
		return fsErr(err)
	}
	if res.ExitCode != 0 || res.Reason != api.ReasonExited {
		return fmt.Errorf("set attributes of %s: %s", p, firstLine(res.Stderr))
	}
	return nil
}

func firstLine(b []byte) string {
	for i, c := range b {
		if c == '\n' {
			return string(b[:i])
		}
	}
	return string(b)
}

func (f *sftpFS) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	switch r.Method {
	case "List":
		list, err := f.c.ListDir(f.ctx, f.id, r.Filepath)
		if err != nil {
			return nil, fsErr(err)
		}
		out := make(listerAt, len(list))
		for i, fi := range list {
			out[i] = fileInfo{fi}
		}
		return out, nil
	case "Stat":
		fi, err := f.follow(r.Filepath)
		if err != nil {
			return nil, err
		}
		return listerAt{fileInfo{fi}}, nil
	case "Lstat":
		fi, err := f.c.Stat(f.ctx, f.id, r.Filepath)
		if err != nil {
			return nil, fsErr(err)
		}
		return listerAt{fileInfo{fi}}, nil
	case "Readlink":
		fi, err := f.c.Stat(f.ctx, f.id, r.Filepath)
		if err != nil {
			return nil, fsErr(err)
		}
		if fi.Type != "symlink" {
			return nil, fmt.Errorf("%s is not a symbolic link", r.Filepath)
		}
		return listerAt{fileInfo{&api.FileInfo{Name: fi.Target, Type: "symlink"}}}, nil
	}
	return nil, sftp.ErrSSHFxOpUnsupported
}

// follow stats p, following symbolic links (at most 40, as the kernel).
func (f *sftpFS) follow(p string) (*api.FileInfo, error) {
	for range 40 {
		fi, err := f.c.Stat(f.ctx, f.id, p)
		if err != nil {
			return nil, fsErr(err)
		}
		if fi.Type != "symlink" {
			return fi, nil
		}
		t := fi.Target
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(p), t)
		}
		p = t
	}
	return nil, fmt.Errorf("%s: too many levels of symbolic links", p)
}

type listerAt []os.FileInfo

func (l listerAt) ListAt(out []os.FileInfo, off int64) (int, error) {
	if off >= int64(len(l)) {
		return 0, io.EOF
	}
	n := copy(out, l[off:])
	if n < len(out) {
		return n, io.EOF
	}
	return n, nil
}

// fileInfo is an api.FileInfo as os.FileInfo, with its owner.
type fileInfo struct{ fi *api.FileInfo }

func (i fileInfo) Name() string       { return i.fi.Name }
func (i fileInfo) Size() int64        { return i.fi.Size }
func (i fileInfo) ModTime() time.Time { return i.fi.ModTime }
func (i fileInfo) IsDir() bool        { return i.fi.Type == "dir" }
func (i fileInfo) Sys() any           { return nil }
func (i fileInfo) Uid() uint32        { return uint32(i.fi.UID) }
func (i fileInfo) Gid() uint32        { return uint32(i.fi.GID) }

func (i fileInfo) Mode() os.FileMode {
	m := client.FileMode(i.fi.Mode)
	switch i.fi.Type {
	case "dir":
		m |= os.ModeDir
	case "symlink":
		m |= os.ModeSymlink
	case "other":
		m |= os.ModeIrregular
	}
	return m
}

// logCmd logs the file commands that fail, at debug level.
type logCmd struct {
	*sftpFS
	s *session
}

func (l logCmd) Filecmd(r *sftp.Request) error {
	err := l.sftpFS.Filecmd(r)
	if err != nil {
		l.s.g.cfg.Log.Debug("ssh: sftp", "sandbox", l.id, "op", r.Method, "path", r.Filepath, "err", err)
	}
	return err
}
