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
	"sync"

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
	// open opens the compressed blob; a registry download is bound to ctx.
	open func(ctx context.Context) (io.ReadCloser, error)
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

// progressState reports progress for one import or pull. It is safe for
// concurrent use, and never calls its callbacks concurrently.
type progressState struct {
	fn Progress
	// layer, if set, receives per-layer progress: the bytes of the
	// compressed blob of diffID read so far and the blob's size.
	layer func(diffID string, done, total int64)

	mu          sync.Mutex
	done, total int64
	lastReport  int64
}

func (p *progressState) add(n int64, what string) {
	if p == nil || p.fn == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
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
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastReport = p.done
	p.fn(p.done, p.total, what)
}

// layerProgress tracks the progress of one layer blob; its methods are
// called by one goroutine. A nil *layerProgress does nothing.
type layerProgress struct {
	p                 *progressState
	diffID            string
	done, total, last int64
}

func (p *progressState) forLayer(diffID string, total int64) *layerProgress {
	if p == nil || p.layer == nil {
		return nil
	}
	return &layerProgress{p: p, diffID: diffID, total: total}
}

func (l *layerProgress) add(n int64) {
	if l == nil {
		return
	}
	l.done += n
	if l.done-l.last >= 1<<20 || l.done == l.total {
		l.report()
	}
}

func (l *layerProgress) report() {
	if l == nil {
		return
	}
	l.last = l.done
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	l.p.layer(l.diffID, l.done, l.total)
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
	tmp, root, err := s.newLayerDir("layer-" + hx[:12])
	if err != nil {
		return 0, fmt.Errorf("layer %s: %w", id, err)
	}
	ok := false
	defer func() {
		if !ok {
			removeAll(tmp)
		}
	}()

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
	if err := s.publish(tmp, root, hx); err != nil {
		return 0, fmt.Errorf("layer %s: %w", id, err)
	}
	ok = true
	return stats.Size, nil
}

// newLayerDir makes a new directory under tmp holding an empty directory
// "root" (mode 0755): the future layer.
func (s *Store) newLayerDir(prefix string) (tmp, root string, err error) {
	tmp, err = os.MkdirTemp(s.tmp, prefix+"-")
	if err != nil {
		return "", "", err
	}
	root = filepath.Join(tmp, "root")
	if err = os.Mkdir(root, 0o755); err == nil {
		// The mode of the future layer directory; Mkdir applied the umask.
		err = os.Chmod(root, 0o755)
	}
	if err != nil {
		removeAll(tmp)
		return "", "", err
	}
	return tmp, root, nil
}

// publish atomically moves the complete, verified layer root (made by
// newLayerDir) to layers/<hx> and removes tmp. If the layer was published
// meanwhile (by a concurrent import), that one is kept.
func (s *Store) publish(tmp, root, hx string) error {
	dst := filepath.Join(s.layers, hx)
	err := unix.Renameat2(unix.AT_FDCWD, root, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// No RENAME_NOREPLACE on this filesystem.
		if s.HasLayer("sha256:" + hx) {
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
		return fmt.Errorf("publishing: %w", err)
	}
	return nil
}

// unpackVerified streams the layer blob through the compressed-digest
// check, the decompressor, the diffID check and the unpacker into root.
func (s *Store) unpackVerified(ctx context.Context, l srcLayer, root string, prog *progressState, what string) (unpackStats, error) {
	id := l.diffID.String()
	rc, err := l.open(ctx)
	if err != nil {
		return unpackStats{}, fmt.Errorf("layer %s: opening blob: %w", id, err)
	}
	defer rc.Close()

	compLimit := int64(-1)
	if l.size >= 0 {
		compLimit = l.size
	}
	lp := prog.forLayer(id, l.size)
	comp := &countingReader{ctx: ctx, r: rc, h: sha256.New(), limit: compLimit,
		onRead: func(n int64) { prog.add(n, what); lp.add(n) }}
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
			// A source that verifies the blob itself (a registry download)
			// fails the read that reaches the end: all bytes are in then.
			if _, cerr := io.Copy(io.Discard, comp); cerr == nil || cerr == errLimit || comp.n == l.size {
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
		if err != nil && ctx.Err() == nil && l.size >= 0 && comp.n == l.size && !comp.exceeded {
			// The source's own check failed at the end; ours says more.
			if verr := verifyCompressed(); verr != nil {
				return stats, verr
			}
		}
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
	if lp != nil && lp.last != lp.done {
		lp.report()
	}
	return stats, nil
}
