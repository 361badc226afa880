package agent

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/tarball"
	"golang.org/x/sys/unix"
)

func sortInfos(v []*api.FileInfo) {
	sort.Slice(v, func(i, j int) bool { return v[i].Name < v[j].Name })
}

// writeTar writes the file or tree at p as a tar stream whose names start
// with p's base name. Symlinks are stored as symlinks, never followed; a file
// swapped for a symlink mid-walk is skipped (opened with O_NOFOLLOW).
func writeTar(w io.Writer, p string) error {
	st, err := os.Lstat(p)
	if err != nil {
		return fileError(err)
	}
	parent := path.Dir(p)
	if p == "/" {
		parent = "/"
	}
	tw := tarball.NewWriter(w)
	tw.KeepOwner, tw.HardLinks = true, true
	walk := func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			if full == p {
				return err
			}
			return nil // vanished or unreadable below the top: skip
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(full, parent), "/")
		if rel == "" {
			rel = "."
		}
		target := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			target, _ = os.Readlink(full)
		}
		err = tw.Add(rel, info, target, func() (io.ReadCloser, error) {
			f, err := openFile(full, unix.O_RDONLY|unix.O_NOFOLLOW, 0)
			if err != nil {
				return nil, tarball.Skip(err)
			}
			return f, nil
		})
		if errors.Is(err, tarball.ErrSkipped) {
			return nil // devices, fifos, sockets are not copied; nor files that cannot be opened
		}
		return err
	}
	if st.IsDir() {
		err = filepath.WalkDir(p, walk)
	} else {
		err = walk(p, fs.FileInfoToDirEntry(st), nil)
	}
	if err != nil {
		return fileError(err)
	}
	return tw.Close()
}

// ExtractTar unpacks a tar stream into dir with the same guarantees as the
// agent's archive upload; the daemon uses it for build contexts.
func ExtractTar(r io.Reader, dir string) error { return extractTar(r, dir, nil) }

// extractTar unpacks a tar stream into dir (created if missing). Every entry
// is created through an os.Root at dir, so no name, symlink or hardlink in
// the archive can reach outside dir; entries with absolute names or ".."
// are refused. Entries keep the archive's uid/gid, or with owner belong
// to owner (and so does dir when this creates it).
func extractTar(r io.Reader, dir string, owner *user) error {
	_, statErr := os.Lstat(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fileError(err)
	}
	if owner != nil && errors.Is(statErr, fs.ErrNotExist) {
		os.Lchown(dir, int(owner.uid), int(owner.gid))
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fileError(err)
	}
	defer root.Close()
	tr := tar.NewReader(r)
	type dirMode struct {
		name string
		mode fs.FileMode
	}
	var dirs []dirMode
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return api.Errorf(api.KindInvalid, "read tar: %v", err)
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		if name == "." {
			continue
		}
		mode := fs.FileMode(hdr.Mode&0o777) | modeBits(uint32(hdr.Mode))
		if parent := path.Dir(name); parent != "." {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return fileError(fmt.Errorf("%s: %w", hdr.Name, err))
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fileError(err)
			}
			dirs = append(dirs, dirMode{name, mode})
		case tar.TypeReg:
			root.Remove(name) // replace, never write through an existing symlink
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fileError(err)
			}
			_, err = io.Copy(f, tr)
			if err == nil {
				err = f.Chmod(mode)
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fileError(err)
			}
		case tar.TypeSymlink:
			root.Remove(name)
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return fileError(err)
			}
		case tar.TypeLink:
			target, err := entryName(hdr.Linkname)
			if err != nil {
				return err
			}
			root.Remove(name)
			if err := root.Link(target, name); err != nil {
				return fileError(err)
			}
		default:
			continue // devices and fifos are not created
		}
		if owner != nil {
			root.Lchown(name, int(owner.uid), int(owner.gid))
		} else if hdr.Uid >= 0 && hdr.Uid <= 65535 && hdr.Gid >= 0 && hdr.Gid <= 65535 {
			root.Lchown(name, hdr.Uid, hdr.Gid)
		}
		if hdr.Typeflag != tar.TypeSymlink && hdr.Typeflag != tar.TypeDir {
			root.Chtimes(name, hdr.ModTime, hdr.ModTime)
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		root.Chmod(dirs[i].name, dirs[i].mode)
	}
	return nil
}

// entryName validates a tar entry name: relative, no "..".
func entryName(n string) (string, error) {
	if strings.HasPrefix(n, "/") {
		return "", api.Errorf(api.KindInvalid, "tar entry %q: absolute names are not allowed", n)
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", api.Errorf(api.KindInvalid, "tar entry %q: \"..\" is not allowed", n)
		}
	}
	if strings.ContainsRune(n, 0) {
		return "", api.Errorf(api.KindInvalid, "tar entry %q: NUL in name", n)
	}
	return path.Clean(n), nil
}
