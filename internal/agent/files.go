package agent

import (
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
	"golang.org/x/sys/unix"
)

// File operations run inside the sandbox's own root (the agent is PID 1
// after pivot_root), so "..", absolute symlinks and symlinks to host paths
// all resolve within the sandbox. Magic links (/proc/*/fd, /proc/*/exe) are
// refused so an open descriptor of the agent can never be reopened.

// cleanPath makes p absolute and clean; "" is an error.
func cleanPath(p string) (string, error) {
	if p == "" {
		return "", api.FieldError("path", "missing")
	}
	if len(p) > 4096 {
		return "", api.FieldError("path", "longer than 4096 bytes")
	}
	for i := 0; i < len(p); i++ {
		if p[i] == 0 {
			return "", api.FieldError("path", "contains a NUL byte")
		}
	}
	return path.Clean("/" + p), nil
}

// openFile opens p without following magic links.
func openFile(p string, flags int, mode uint32) (*os.File, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Mode:    uint64(mode),
		Resolve: unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOSYS) {
		// gVisor's sentry (2022 builds) has no openat2. Its agent sees only
		// the sandbox's own mounts, so a plain open stays inside; magic
		// links are still refused by the check below.
		fd, err = unix.Open(p, flags|unix.O_CLOEXEC, mode)
		if err == nil {
			if target, lerr := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)); lerr == nil && !strings.HasPrefix(target, "/") {
				unix.Close(fd)
				return nil, &os.PathError{Op: "open", Path: p, Err: unix.ELOOP}
			}
		}
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// fileError maps an OS error to an API error naming the path.
func fileError(err error) error {
	if err == nil {
		return nil
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return err
	}
	msg := err.Error()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return api.Errorf(api.KindNotFound, "%s", msg)
	case errors.Is(err, fs.ErrExist), errors.Is(err, syscall.ENOTEMPTY):
		return api.Errorf(api.KindConflict, "%s", msg)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.ELOOP),
		errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTDIR),
		errors.Is(err, syscall.EXDEV), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.EROFS):
		return api.Errorf(api.KindInvalid, "%s", msg)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return api.Errorf(api.KindTooLarge, "%s", msg)
	}
	return api.Errorf(api.KindInternal, "%s", msg)
}

func fileInfo(p string, st fs.FileInfo) *api.FileInfo {
	fi := &api.FileInfo{
		Name:    st.Name(),
		Path:    p,
		Size:    st.Size(),
		Mode:    uint32(st.Mode().Perm()),
		ModTime: st.ModTime().UTC(),
	}
	if p == "/" {
		fi.Name = "/"
	}
	m := st.Mode()
	if m&fs.ModeSetuid != 0 {
		fi.Mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		fi.Mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		fi.Mode |= 0o1000
	}
	switch {
	case m.IsRegular():
		fi.Type = "file"
	case m.IsDir():
		fi.Type = "dir"
	case m&fs.ModeSymlink != 0:
		fi.Type = "symlink"
		fi.Target, _ = os.Readlink(p)
	default:
		fi.Type = "other"
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		fi.UID, fi.GID = int(sys.Uid), int(sys.Gid)
	}
	return fi
}

func statFile(p string) (*api.FileInfo, error) {
	st, err := os.Lstat(p)
	if err != nil {
		return nil, fileError(err)
	}
	return fileInfo(p, st), nil
}

func listDir(p string) ([]*api.FileInfo, error) {
	f, err := openFile(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fileError(err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fileError(err)
	}
	out := make([]*api.FileInfo, 0, len(names))
	for _, n := range names {
		full := path.Join(p, n)
		st, err := os.Lstat(full)
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, fileInfo(full, st))
	}
	sortInfos(out)
	return out, nil
}

func writeFile(p string, r io.Reader, mode uint32) (*api.FileInfo, error) {
	if mode == 0 {
		mode = 0o644
	}
	if mode > 0o7777 {
		return nil, api.FieldError("mode", "%o is not a permission mode", mode)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, fileError(err)
	}
	f, err := openFile(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, mode)
	if err != nil {
		return nil, fileError(err)
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return nil, fileError(err)
	}
	if err := f.Chmod(fs.FileMode(mode&0o777) | modeBits(mode)); err != nil {
		f.Close()
		return nil, fileError(err)
	}
	if err := f.Close(); err != nil {
		return nil, fileError(err)
	}
	return statFile(p)
}

func modeBits(mode uint32) fs.FileMode {
	var m fs.FileMode
	if mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func mkdir(p string, mode uint32, parents bool) (*api.FileInfo, error) {
	if mode == 0 {
		mode = 0o755
	}
	if mode > 0o7777 {
		return nil, api.FieldError("mode", "%o is not a permission mode", mode)
	}
	var err error
	if parents {
		err = os.MkdirAll(p, fs.FileMode(mode&0o777))
	} else {
		err = os.Mkdir(p, fs.FileMode(mode&0o777))
	}
	if err != nil {
		return nil, fileError(err)
	}
	return statFile(p)
}

func removeFile(p string, recursive bool) error {
	if p == "/" {
		return api.FieldError("path", "refusing to remove /")
	}
	if recursive {
		if _, err := os.Lstat(p); err != nil {
			return fileError(err)
		}
		return fileError(os.RemoveAll(p))
	}
	return fileError(os.Remove(p))
}

func rename(from, to string) (*api.FileInfo, error) {
	if from == "/" || to == "/" {
		return nil, api.FieldError("path", "cannot rename /")
	}
	if err := os.Rename(from, to); err != nil {
		return nil, fileError(err)
	}
	return statFile(to)
}
