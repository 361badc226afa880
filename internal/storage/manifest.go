package storage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Manifest is the checksum record of an immutable tree (a snapshot): one
// entry per file, directories and the root (".") included, in walk order
// (names sorted within each directory). Times are not recorded.
type Manifest struct {
	Entries []Entry `json:"entries"`
	Digest  string  `json:"digest"` // "sha256:" and the hex SHA-256 of the JSON of Entries
}

// Entry is one file of a Manifest.
type Entry struct {
	Path   string            `json:"path"` // slash-separated, relative to the tree; "." is the root
	Type   string            `json:"type"` // dir, file, symlink, char, block, fifo, socket
	Mode   uint32            `json:"mode"` // permission and set-id/sticky bits
	UID    int               `json:"uid"`
	GID    int               `json:"gid"`
	Size   int64             `json:"size"`
	Target string            `json:"target,omitempty"` // symlink target
	SHA256 string            `json:"sha256,omitempty"` // hex, regular files (not on Link entries)
	Xattrs map[string]string `json:"xattrs,omitempty"` // name → base64 of the value
	Rdev   uint64            `json:"rdev,omitempty"`   // device number of char and block devices
	Link   string            `json:"link,omitempty"`   // an earlier entry this one is a hard link of
}

// BuildManifest walks dir and hashes its regular files, runtime.NumCPU() at
// a time.
func BuildManifest(ctx context.Context, dir string) (*Manifest, error) {
	m, _, err := BuildManifestCached(ctx, dir, nil)
	return m, err
}

// FileKey identifies a file's contents without reading them: a btrfs
// snapshot keeps its source's inode numbers and times, and any change to a
// file's data changes its ctime, which nobody can set back.
type FileKey struct {
	Ino                uint64
	Size, Mtime, Ctime int64
}

// HashCache maps the keys of files hashed before to their SHA-256.
type HashCache map[FileKey]string

// BuildManifestCached is BuildManifest that takes a file's hash from cache
// when its key is there (the same file in an earlier snapshot of the same
// tree), and returns the cache for this tree's files.
func BuildManifestCached(ctx context.Context, dir string, cache HashCache) (*Manifest, HashCache, error) {
	var (
		entries []Entry
		files   []int // indexes of entries to hash
		links   = map[fileID]string{}
		keys    = map[int]FileKey{}
	)
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: p, Err: err}
		}
		e := Entry{Path: filepath.ToSlash(rel), Mode: st.Mode & 0o7777, UID: int(st.Uid), GID: int(st.Gid)}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			e.Type = "dir"
		case unix.S_IFREG:
			e.Type, e.Size = "file", st.Size
		case unix.S_IFLNK:
			e.Type, e.Size = "symlink", st.Size
			if e.Target, err = os.Readlink(p); err != nil {
				return err
			}
		case unix.S_IFCHR:
			e.Type, e.Rdev = "char", st.Rdev
		case unix.S_IFBLK:
			e.Type, e.Rdev = "block", st.Rdev
		case unix.S_IFIFO:
			e.Type = "fifo"
		default:
			e.Type = "socket"
		}
		if e.Type != "dir" && st.Nlink > 1 {
			id := fileID{st.Dev, st.Ino}
			if first, ok := links[id]; ok {
				e.Link = first
			} else {
				links[id] = e.Path
			}
		}
		xs, err := listXattrs(p)
		if err != nil {
			return err
		}
		if len(xs) > 0 {
			e.Xattrs = make(map[string]string, len(xs))
			for _, x := range xs {
				e.Xattrs[x.name] = base64.StdEncoding.EncodeToString(x.value)
			}
		}
		if e.Type == "file" && e.Link == "" {
			k := FileKey{Ino: st.Ino, Size: st.Size, Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}
			keys[len(entries)] = k
			if sum, ok := cache[k]; ok {
				e.SHA256 = sum
			} else {
				files = append(files, len(entries))
			}
		}
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("manifest of %s: %w", dir, err)
	}
	if err := hashFiles(ctx, dir, entries, files); err != nil {
		return nil, nil, fmt.Errorf("manifest of %s: %w", dir, err)
	}
	next := make(HashCache, len(keys))
	for i, k := range keys {
		next[k] = entries[i].SHA256
	}
	m := &Manifest{Entries: entries}
	m.Digest = m.digest()
	return m, next, nil
}

func hashFiles(ctx context.Context, dir string, entries []Entry, files []int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan int)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range min(runtime.NumCPU(), max(len(files), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			for i := range jobs {
				sum, err := hashFile(filepath.Join(dir, filepath.FromSlash(entries[i].Path)), buf)
				if err != nil {
					once.Do(func() { first = err; cancel() })
					continue
				}
				entries[i].SHA256 = sum
			}
		}()
	}
feed:
	for _, i := range files {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// Files of at least bigFile bytes (a microVM's sparse disk image) are
// hashed by their non-zero blocks: "zs1:" and the hex SHA-256 of each
// non-zero 4 KiB block with its index, then the size. The holes of a
// sparse file are skipped without reading, so an 8 GiB disk holding
// 100 MiB hashes like 100 MiB, and the sum depends on the content only
// (a hole and a block of zeros are the same).
const (
	bigFile  = 16 << 20
	zsPrefix = "zs1:"
	zsBlock  = 4096
	hashBuf  = 1 << 20
)

func hashFile(path string, buf []byte) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if st.Size() >= bigFile {
		return hashBlocks(f, st.Size(), buf)
	}
	return hashAll(f, buf)
}

func hashAll(f *os.File, buf []byte) (string, error) {
	h := sha256.New()
	if _, err := io.CopyBuffer(h, struct{ io.Reader }{f}, buf); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashBlocks is the "zs1:" sum of a file of size bytes.
func hashBlocks(f *os.File, size int64, buf []byte) (string, error) {
	h := sha256.New()
	zero := make([]byte, zsBlock)
	buf = buf[:len(buf)/zsBlock*zsBlock]
	var idx [8]byte
	next := int64(0) // first byte not yet hashed (a block boundary)
	err := dataRanges(int(f.Fd()), size, func(data, end int64) error {
		off := max(data/zsBlock*zsBlock, next)
		for off < end {
			n, err := f.ReadAt(buf[:min(int64(len(buf)), (end-off+zsBlock-1)/zsBlock*zsBlock)], off)
			if n == 0 {
				if err == nil || errors.Is(err, io.EOF) {
					return fmt.Errorf("%s: shorter than its size", f.Name())
				}
				return err
			}
			for i := 0; i < n; i += zsBlock {
				b := buf[i:min(i+zsBlock, n)]
				if bytes.Equal(b, zero[:len(b)]) {
					continue
				}
				binary.BigEndian.PutUint64(idx[:], uint64(off+int64(i))/zsBlock)
				h.Write(idx[:])
				h.Write(b)
			}
			off += int64(n)
		}
		next = off
		return nil
	})
	if err != nil {
		return "", err
	}
	binary.BigEndian.PutUint64(idx[:], uint64(size))
	h.Write(idx[:])
	return zsPrefix + hex.EncodeToString(h.Sum(nil)), nil
}

func (m *Manifest) digest() string {
	b, err := json.Marshal(m.Entries)
	if err != nil {
		panic(err) // strings, numbers and maps of strings always marshal
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Verify recomputes the manifest of dir and compares it with m. The error
// names the first path that differs (in m's order, then added paths) and
// what differs, and counts the other differences.
func (m *Manifest) Verify(ctx context.Context, dir string) error {
	if d := m.digest(); d != m.Digest {
		return fmt.Errorf("verify %s: the manifest's digest is %s, its entries give %s", dir, m.Digest, d)
	}
	now, err := BuildManifest(ctx, dir)
	if err != nil {
		return fmt.Errorf("verify %s: %w", dir, err)
	}
	if now.Digest == m.Digest {
		return nil
	}
	have := make(map[string]*Entry, len(now.Entries))
	for i := range now.Entries {
		have[now.Entries[i].Path] = &now.Entries[i]
	}
	var diffs []string
	for i := range m.Entries {
		want := &m.Entries[i]
		got, ok := have[want.Path]
		if !ok {
			diffs = append(diffs, want.Path+": removed")
			continue
		}
		delete(have, want.Path)
		if want.Type == "file" && want.SHA256 != got.SHA256 && strings.HasPrefix(got.SHA256, zsPrefix) && !strings.HasPrefix(want.SHA256, zsPrefix) {
			// Recorded before big files were hashed by blocks: compare
			// the whole-content sum.
			if f, err := os.OpenFile(filepath.Join(dir, filepath.FromSlash(got.Path)), os.O_RDONLY|unix.O_NOFOLLOW, 0); err == nil {
				if sum, err := hashAll(f, make([]byte, hashBuf)); err == nil {
					got.SHA256 = sum
				}
				f.Close()
			}
		}
		if d := diffEntry(want, got); d != "" {
			diffs = append(diffs, want.Path+": "+d)
		}
	}
	for i := range now.Entries {
		if _, ok := have[now.Entries[i].Path]; ok {
			diffs = append(diffs, now.Entries[i].Path+": added")
		}
	}
	if len(diffs) == 0 { // only sums of another kind differed, and matched
		return nil
	}
	more := ""
	if len(diffs) > 1 {
		more = fmt.Sprintf(" (and %d more differences)", len(diffs)-1)
	}
	return fmt.Errorf("verify %s: %s%s: %w", dir, diffs[0], more, ErrMismatch)
}

// ErrMismatch is wrapped by Verify's error when the tree differs.
var ErrMismatch = errors.New("tree does not match its manifest")

func diffEntry(want, got *Entry) string {
	switch {
	case want.Type != got.Type:
		return fmt.Sprintf("type %s, want %s", got.Type, want.Type)
	case want.Mode != got.Mode:
		return fmt.Sprintf("mode %#o, want %#o", got.Mode, want.Mode)
	case want.UID != got.UID || want.GID != got.GID:
		return fmt.Sprintf("owner %d:%d, want %d:%d", got.UID, got.GID, want.UID, want.GID)
	case want.Size != got.Size:
		return fmt.Sprintf("size %d, want %d", got.Size, want.Size)
	case want.Target != got.Target:
		return fmt.Sprintf("target %q, want %q", got.Target, want.Target)
	case want.SHA256 != got.SHA256:
		return fmt.Sprintf("content sha256 %s, want %s", got.SHA256, want.SHA256)
	case want.Rdev != got.Rdev:
		return fmt.Sprintf("device %#x, want %#x", got.Rdev, want.Rdev)
	case want.Link != got.Link:
		return fmt.Sprintf("hard link to %q, want %q", got.Link, want.Link)
	}
	for k, v := range want.Xattrs {
		if g, ok := got.Xattrs[k]; !ok {
			return "xattr " + k + " removed"
		} else if g != v {
			return "xattr " + k + " changed"
		}
	}
	for k := range got.Xattrs {
		if _, ok := want.Xattrs[k]; !ok {
			return "xattr " + k + " added"
		}
	}
	return ""
}
