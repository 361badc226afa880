package microvm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/den-dev/den/internal/isolate"
)

// Adopt takes over the files another tier kept for spec's box (escalation
// from linux or gvisor): the upper and work directories in spec.Dir, with
// the canonical ids those tiers store, become the contents of the box's
// new ext4 disk (mkfs.ext4 -d copies owners, modes, xattrs and overlay
// whiteouts), and leave the directory. A box that has a disk already is
// left alone.
func (r *Runtime) Adopt(ctx context.Context, spec *isolate.Spec) error {
	disk := filepath.Join(spec.Dir, "disk.img")
	if _, err := os.Stat(disk); err == nil {
		return nil
	}
	stage := filepath.Join(spec.Dir, "adopt.tmp")
	os.RemoveAll(stage)
	if err := os.Mkdir(stage, 0o700); err != nil {
		return fmt.Errorf("adopt files: %w", err)
	}
	defer os.RemoveAll(stage)
	var moved []string
	undo := func() {
		for _, d := range moved {
			os.Rename(filepath.Join(stage, d), filepath.Join(spec.Dir, d))
		}
	}
	for _, d := range []string{"upper", "work"} {
		if _, err := os.Lstat(filepath.Join(spec.Dir, d)); err != nil {
			continue
		}
		if err := os.Rename(filepath.Join(spec.Dir, d), filepath.Join(stage, d)); err != nil {
			undo()
			return fmt.Errorf("adopt files: %w", err)
		}
		moved = append(moved, d)
	}
	// Overlay's work directories hold nothing to keep.
	os.RemoveAll(filepath.Join(stage, "work"))
	tmp := disk + ".tmp"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err == nil {
		err = f.Truncate(r.diskSize(spec.Limits))
		f.Close()
	}
	if err != nil {
		os.Remove(tmp)
		undo()
		return fmt.Errorf("create disk: %w", err)
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", "-d", stage, tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		undo()
		return fmt.Errorf("mkfs.ext4 -d: %v: %s", err, tail(out, 300))
	}
	if err := os.Rename(tmp, disk); err != nil {
		undo()
		return err
	}
	return nil
}
