package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
)

// EmptyLayerDiffID is the diffID of an empty layer: the sha256 of an empty
// tar (two zero blocks), which AddLayerFromDir gives for an empty directory.
const EmptyLayerDiffID = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"

// DirOptions modify AddLayerFromDirOptions.
type DirOptions struct {
	// IDBase and IDRange shift owners, for an upper directory written from
	// inside a user namespace: an id in [IDBase, IDBase+IDRange) is stored
	// as id-IDBase, any other id as 65534 (the overflow id). IDRange 0
	// with IDBase > 0 means 65536. Both 0: ids are stored as they are.
	IDBase, IDRange int
}

// AddLayerFromDir makes a layer of dir, an overlayfs upper directory (what
// a sandbox wrote), and returns its diffID ("sha256:<hex>") and unpacked
// size (bytes of file contents).
//
// The diffID is the sha256 of the deterministic tar of dir, made by the
// same writer as Save uses, so Save of an image with this layer reproduces
// the diffID. dir holds files, directories, symlinks, hard links, overlayfs
// whiteouts (0/0 character devices) and opaque directories
// (trusted.overlay.opaque=y); other device nodes, fifos and sockets are
// skipped, user.overlay.* and other trusted.* xattrs ignored, symlinks
// never followed. A tree that depends on its lower layers (the overlayfs
// metacopy or redirect xattrs) is refused.
//
// The stored copy in layers/<hex> is made by streaming that tar into the
// store's hardened unpacker (in tmp/, then renamed into place), so it is
// exactly what importing the tar would give: modes, owners, mtimes, hard
// links within the layer, whiteouts as 0/0 character devices and opaque
// directories as trusted.overlay.opaque=y. If the layer is already in the
// store, the copy is discarded and the present layer reused. An empty dir
// gives EmptyLayerDiffID.
//
// dir should not change meanwhile (commit a stopped or frozen sandbox); a
// file that shrinks while being read is an error.
func (s *Store) AddLayerFromDir(ctx context.Context, dir string) (diffID string, size int64, err error) {
	return s.AddLayerFromDirOptions(ctx, dir, DirOptions{})
}

// AddLayerFromDirOptions is AddLayerFromDir with options.
func (s *Store) AddLayerFromDirOptions(ctx context.Context, dir string, opts DirOptions) (diffID string, size int64, err error) {
	diffID, size, err = s.addLayerFromDir(ctx, dir, opts)
	if err != nil {
		return "", 0, fmt.Errorf("add layer from %s: %w", dir, err)
	}
	return diffID, size, nil
}

func (s *Store) addLayerFromDir(ctx context.Context, dir string, opts DirOptions) (string, int64, error) {
	if opts.IDBase < 0 || opts.IDRange < 0 {
		return "", 0, fmt.Errorf("invalid id range %d+%d", opts.IDBase, opts.IDRange)
	}
	topt := tarOptions{idBase: int64(opts.IDBase), idRange: int64(opts.IDRange), maxBytes: s.maxLayerBytes()}
	if topt.idBase > 0 && topt.idRange == 0 {
		topt.idRange = 65536
	}
	tmp, root, err := s.newLayerDir("commit")
	if err != nil {
		return "", 0, err
	}
	published := false
	defer func() {
		if !published {
			removeAll(tmp)
		}
	}()

	// The tar of dir is hashed as it is written, and unpacked into root.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	h := sha256.New()
	type result struct {
		stats tarStats
		err   error
	}
	done := make(chan result, 1)
	go func() {
		st, err := writeLayerTar(wctx, io.MultiWriter(h, pw), dir, topt)
		pw.CloseWithError(err) // nil: EOF
		done <- result{st, err}
	}()
	ust, uerr := unpackTar(ctx, pr, root, unpackOptions{
		maxBytes:   s.maxLayerBytes(),
		maxEntries: s.maxEntries(),
		chown:      !s.rootless,
	})
	if uerr == nil {
		_, uerr = io.Copy(io.Discard, pr) // the end-of-archive blocks
	}
	if uerr != nil {
		cancel()
		pr.CloseWithError(uerr)
	}
	res := <-done
	switch {
	case res.err != nil && (uerr == nil || errors.Is(uerr, res.err)):
		return "", 0, res.err // the writer failed first
	case uerr != nil:
		return "", 0, uerr
	}
	if n := res.stats.Skipped; n > 0 {
		s.logf("image: layer from %s: skipped %d device nodes, fifos or sockets", dir, n)
	}
	if n := res.stats.SkippedWh; n > 0 {
		s.logf("image: layer from %s: skipped %d entries named .wh.* (a layer cannot hold them)", dir, n)
	}
	if n := res.stats.OverflowIDs; n > 0 {
		s.logf("image: layer from %s: %d owners outside ids %d..%d stored as %d", dir, n, topt.idBase, topt.idBase+topt.idRange-1, overflowID)
	}
	hx := hex.EncodeToString(h.Sum(nil))
	if ust.SkippedXattrs > 0 {
		// The store's filesystem refused some xattrs: the layer is what
		// was stored, so that Save reproduces its diffID.
		s.logf("image: layer from %s: the store dropped %d xattrs", dir, ust.SkippedXattrs)
		if hx, err = treeDigest(ctx, root); err != nil {
			return "", 0, err
		}
	}
	id := "sha256:" + hx
	if s.HasLayer(id) {
		n, err := s.layerSize(hx)
		return id, n, err
	}
	if err := s.writeMeta(hx, layerMeta{Size: ust.Size, Entries: ust.Entries}); err != nil {
		return "", 0, err
	}
	if err := s.publish(tmp, root, hx); err != nil {
		return "", 0, err
	}
	published = true
	return id, ust.Size, nil
}

// treeDigest returns the hex sha256 of the deterministic tar of root.
func treeDigest(ctx context.Context, root string) (string, error) {
	h := sha256.New()
	if _, err := writeLayerTar(ctx, h, root, tarOptions{}); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
