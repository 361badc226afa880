package microvm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// imageCache turns lower directories into read-only erofs images.
//
// The cache key of a directory is its absolute path and a fingerprint of
// its whole tree: every entry's relative name, type and mode, owner,
// size, device numbers, and modification and change times. An image
// layer's directory never changes, so its image is built once; a host
// directory such as /usr does change (package upgrades), and any change
// to a file's content, metadata or name moves a ctime, so the next Start
// builds a new image. The walk costs a stat per entry per Start.
// Images not used for a week are removed.
type imageCache struct {
	dir string
	mu  sync.Mutex
	// building holds one lock per key so concurrent starts of boxes of
	// the same image build it once.
	building map[string]*sync.Mutex
}

func newImageCache(dir string) *imageCache {
	return &imageCache{dir: dir, building: map[string]*sync.Mutex{}}
}

// fingerprint hashes the tree under dir.
func fingerprint(dir string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "erofs-v1|%s\n", dir)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("stat %s", p)
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%q %o %d:%d %d %d %d.%d %d.%d %d\n", rel, st.Mode, st.Uid, st.Gid, st.Size, st.Rdev,
			st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec, st.Ino)
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)[:16]), nil
}

// image returns the erofs image of dir, building it if needed.
func (c *imageCache) image(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	key, err := fingerprint(dir)
	if err != nil {
		return "", fmt.Errorf("fingerprint %s: %w", dir, err)
	}
	out := filepath.Join(c.dir, key+".erofs")
	c.mu.Lock()
	l := c.building[key]
	if l == nil {
		l = &sync.Mutex{}
		c.building[key] = l
	}
	c.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	if _, err := os.Stat(out); err == nil {
		now := time.Now()
		os.Chtimes(out, now, now)
		return out, nil
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return "", err
	}
	// Unique per process: another daemon or test may build it too.
	tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
	os.Remove(tmp)
	// Uncompressed (guests read it at memory speed), owners and xattrs
	// kept as on disk (canonical ids; overlay's opaque xattrs), device
	// nodes kept (overlay whiteouts are 0/0 character devices).
	cmd := exec.Command("mkfs.erofs", "--quiet", "--preserve-mtime", tmp, dir)
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("mkfs.erofs %s: %v: %s", dir, err, tail(b, 400))
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", err
	}
	c.gc(out)
	return out, nil
}

// gc removes images unused for a week.
func (c *imageCache) gc(keep string) {
	old, _ := filepath.Glob(filepath.Join(c.dir, "*.erofs"))
	for _, o := range old {
		if st, err := os.Stat(o); err == nil && o != keep && time.Since(st.ModTime()) > 7*24*time.Hour {
			os.Remove(o)
		}
	}
}
