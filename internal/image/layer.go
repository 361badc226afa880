package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// srcLayer is one layer of an image being imported.
type srcLayer struct {
	diffID v1.Hash // from the config's rootfs.diff_ids
	digest v1.Hash // compressed digest from the manifest; zero when unknown
	size   int64   // compressed size from the manifest; -1 when unknown
	open   func() (io.ReadCloser, error)
}

var (
	magicGzip  = []byte{0x1f, 0x8b}
	magicZstd  = []byte{0x28, 0xb5, 0x2f, 0xfd}
	magicBzip2 = []byte("BZh")
	magicXz    = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
)

// decompress returns the decompressed stream of r, detecting gzip, zstd and
// uncompressed data by their magic bytes.
func decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, err := br.Peek(6)
	if err != nil && err != io.EOF && !errors.Is(err, bufio.ErrBufferFull) {
		return nil, err
	}
	switch {
	case bytes.HasPrefix(head, magicGzip):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return zr, nil
	case bytes.HasPrefix(head, magicZstd):
		zr, err := zstd.NewReader(br,
			zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderMaxMemory(1<<30),
			zstd.WithDecoderMaxWindow(1<<29))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		return zr.IOReadCloser(), nil
	case bytes.HasPrefix(head, magicBzip2):
		return nil, errors.New("bzip2 compression is not supported")
	case bytes.HasPrefix(head, magicXz):
		return nil, errors.New("xz compression is not supported")
	}
	return io.NopCloser(br), nil
}

// countingReader hashes and counts what is read through it, fails once more
// than limit bytes were read, and checks ctx.
type countingReader struct {
	ctx      context.Context
	r        io.Reader
	h        hash.Hash
	n        int64
	limit    int64 // < 0: none
	exceeded bool
	onRead   func(n int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	if c.limit >= 0 && c.n >= c.limit {
		// Allow reading exactly limit bytes; probe for one more.
		var one [1]byte
		k, err := c.r.Read(one[:])
		if k > 0 {
			c.exceeded = true
			return 0, errLimit
		}
		return 0, err
	}
	if c.limit >= 0 && int64(len(p)) > c.limit-c.n {
		p = p[:c.limit-c.n]
	}
	k, err := c.r.Read(p)
	if k > 0 {
		if c.h != nil {
			c.h.Write(p[:k])
		}
		c.n += int64(k)
		if c.onRead != nil {
			c.onRead(int64(k))
		}
	}
	return k, err
}

var errLimit = errors.New("size limit exceeded")

func (c *countingReader) digest() v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(c.h.Sum(nil))}
}

// progressState reports progress for one import.
type progressState struct {
	fn          Progress
	done, total int64
	lastReport  int64
}

func (p *progressState) add(n int64, what string) {
	if p == nil || p.fn == nil {
		return
	}
	p.done += n
	if p.done-p.lastReport >= 1<<20 || p.done == p.total {
		p.lastReport = p.done
		p.fn(p.done, p.total, what)
	}
}

func (p *progressState) report(what string) {
	if p == nil || p.fn == nil {
		return
	}
	p.lastReport = p.done
	p.fn(p.done, p.total, what)
}

// ensureLayer makes sure layer l is unpacked in the store, unpacking and
// verifying it if needed, and returns its unpacked size.
func (s *Store) ensureLayer(ctx context.Context, l srcLayer, prog *progressState) (int64, error) {
	id := l.diffID.String()
	hx := l.diffID.Hex
	if s.HasLayer(id) {
		return s.layerSize(hx)
	}
	what := "layer " + id
	tmp, err := os.MkdirTemp(s.tmp, "layer-"+hx[:12]+"-")
	if err != nil {
		return 0, fmt.Errorf("layer %s: %w", id, err)
	}
	root := filepath.Join(tmp, "root")
	ok := false
	defer func() {
		if !ok {
			removeAll(tmp)
		}
	}()
	if err := os.Mkdir(root, 0o755); err != nil {
		return 0, fmt.Errorf("layer %s: %w", id, err)
	}
	// The mode of the future layer directory; Mkdir applied the umask.
	if err := os.Chmod(root, 0o755); err != nil {
		return 0, fmt.Errorf("layer %s: %w", id, err)
	}

	stats, err := s.unpackVerified(ctx, l, root, prog, what)
	if err != nil {
		return 0, err
	}
	if stats.SkippedDevices > 0 {
		s.logf("image: layer %s: skipped %d device nodes/fifos", id, stats.SkippedDevices)
	}
	if stats.SkippedXattrs > 0 {
		s.logf("image: layer %s: ignored %d xattrs", id, stats.SkippedXattrs)
	}
	if err := s.writeMeta(hx, layerMeta{Size: stats.Size, Entries: stats.Entries, SkippedDevices: stats.SkippedDevices}); err != nil {
		return 0, fmt.Errorf("layer %s: %w", id, err)
	}
	// Atomically publish the complete, verified layer. If another import
	// published it meanwhile, keep that one.
	dst := filepath.Join(s.layers, hx)
	err = unix.Renameat2(unix.AT_FDCWD, root, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// No RENAME_NOREPLACE on this filesystem.
		if s.HasLayer(id) {
			err = unix.EEXIST
		} else {
			err = os.Rename(root, dst)
		}
	}
	switch {
	case err == nil:
		os.Remove(tmp)
	case errors.Is(err, unix.EEXIST), errors.Is(err, unix.ENOTEMPTY):
		removeAll(tmp)
	default:
		return 0, fmt.Errorf("layer %s: publishing: %w", id, err)
	}
	ok = true
	return stats.Size, nil
}

// unpackVerified streams the layer blob through the compressed-digest
// check, the decompressor, the diffID check and the unpacker into root.
func (s *Store) unpackVerified(ctx context.Context, l srcLayer, root string, prog *progressState, what string) (unpackStats, error) {
	id := l.diffID.String()
	rc, err := l.open()
	if err != nil {
		return unpackStats{}, fmt.Errorf("layer %s: opening blob: %w", id, err)
	}
	defer rc.Close()

	compLimit := int64(-1)
	if l.size >= 0 {
		compLimit = l.size
	}
	comp := &countingReader{ctx: ctx, r: rc, h: sha256.New(), limit: compLimit,
		onRead: func(n int64) { prog.add(n, what) }}
	// verifyCompressed checks the compressed stream once fully read.
	verifyCompressed := func() error {
		if comp.exceeded {
			return fmt.Errorf("layer %s: blob %s is larger than the %d bytes the manifest says", id, l.digest, l.size)
		}
		if l.size >= 0 && comp.n != l.size {
			return fmt.Errorf("layer %s: blob %s has %d bytes, the manifest says %d", id, l.digest, comp.n, l.size)
		}
		if l.digest.Hex != "" {
			if got := comp.digest(); got != l.digest {
				return fmt.Errorf("layer %s: compressed digest mismatch: manifest says %s, blob is %s", id, l.digest, got)
			}
		}
		return nil
	}
	// On an unpack error, a corrupt blob is the better explanation: finish
	// reading it (bounded by the manifest size) and report a mismatch.
	explain := func(err error) error {
		var r *refusal
		var le *limitError
		if errors.As(err, &r) || errors.As(err, &le) {
			return err // a well-formed but refused layer: no need to read on
		}
		if l.digest.Hex != "" && l.size >= 0 && ctx.Err() == nil && !comp.exceeded {
			if _, cerr := io.Copy(io.Discard, comp); cerr == nil || cerr == errLimit {
				if verr := verifyCompressed(); verr != nil {
					return fmt.Errorf("%w (%v)", verr, err)
				}
			}
		}
		return err
	}

	dr, err := decompress(comp)
	if err != nil {
		return unpackStats{}, explain(fmt.Errorf("layer %s: %w", id, err))
	}
	defer dr.Close()
	maxBytes := s.maxLayerBytes()
	uncomp := &countingReader{ctx: ctx, r: dr, h: sha256.New(), limit: maxBytes}
	tooBig := func() error {
		return fmt.Errorf("layer %s: more than %d bytes", id, maxBytes)
	}

	stats, err := unpackTar(ctx, uncomp, root, unpackOptions{
		maxBytes:   maxBytes,
		maxEntries: s.maxEntries(),
		chown:      !s.rootless,
	})
	if err == nil {
		// The diffID covers the whole stream, including anything after the
		// tar end-of-archive marker.
		_, err = io.Copy(io.Discard, uncomp)
	}
	if err == nil {
		_, err = io.Copy(io.Discard, comp)
	}
	if uncomp.exceeded {
		return stats, tooBig()
	}
	if err != nil {
		if comp.exceeded {
			return stats, verifyCompressed()
		}
		if ctx.Err() != nil {
			return stats, fmt.Errorf("layer %s: %w", id, ctx.Err())
		}
		return stats, explain(fmt.Errorf("layer %s: %w", id, err))
	}
	if err := verifyCompressed(); err != nil {
		return stats, err
	}
	if got := uncomp.digest(); got != l.diffID {
		return stats, fmt.Errorf("layer %s: uncompressed digest mismatch: the config's diffID is %s, the layer's content is %s", id, l.diffID, got)
	}
	prog.report(what)
	return stats, nil
}
