package sandbox

import (
	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/storage"
)

// trees is den's storage of sandbox, snapshot and volume trees (btrfs
// subvolumes with quotas, or plain directories), as the manager and its
// snapshot and volume stores use it. It keeps no state of its own.
type trees struct{ st *storage.Store }

// storeRoot is where sandbox, snapshot and volume trees live.
func (t trees) storeRoot() string { return t.st.Root() }

// newTree makes a sandbox's (empty) state directory.
func (t trees) newTree(dir string) error { return t.st.Create(dir) }

// copyTree makes dst a copy of src (cheap on btrfs).
func (t trees) copyTree(src, dst string, readonly bool) error {
	return t.st.Snapshot(src, dst, readonly)
}

// deleteTree removes a state directory or snapshot. Idempotent.
func (t trees) deleteTree(dir string) error { return t.st.Delete(dir) }

// setQuota applies a sandbox's disk limit to its state directory.
func (t trees) setQuota(dir string, bytes api.Size) error {
	if bytes <= 0 {
		return nil
	}
	if !t.st.Quotas() {
		return api.Errorf(api.KindUnsupported, "disk quotas need den's managed filesystem (btrfs), which this daemon does not have: see den info")
	}
	return t.st.SetQuota(dir, int64(bytes))
}

// diskUsed is the bytes a tree holds.
func (t trees) diskUsed(dir string) int64 {
	if n, err := t.st.Usage(dir); err == nil {
		return n
	}
	return dirSize(dir)
}
