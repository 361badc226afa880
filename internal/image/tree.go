package image

import (
	"context"
	"io"
)

// WriteTree writes the deterministic layer tar of an overlayfs upper
// directory (or any tree) to w, ids as they are on disk; see
// writeLayerTar for the format. It is how snapshots leave the host.
func WriteTree(ctx context.Context, w io.Writer, dir string) error {
	_, err := writeLayerTar(ctx, w, dir, tarOptions{})
	return err
}

// UnpackTree extracts a layer tar written by WriteTree (or any layer tar)
// into the existing, empty directory dest with the hardened unpacker,
// in overlayfs's whiteout format, owners applied; at most maxBytes of file
// contents.
func (s *Store) UnpackTree(ctx context.Context, r io.Reader, dest string, maxBytes int64) error {
	_, err := unpackTar(ctx, r, dest, unpackOptions{maxBytes: maxBytes, maxEntries: s.maxEntries(), chown: !s.rootless})
	return err
}
