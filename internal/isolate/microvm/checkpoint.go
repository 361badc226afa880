package microvm

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/storage"
)

// A checkpoint directory holds:
//
//	memory     QEMU's migration stream (CPU, devices and RAM; zero pages
//	           take no room)
//	disk.img   the writable disk as it was at that instant (sparse)
//	vm.json    the machine (memory, CPUs, accelerator, kernel, images,
//	           command line) a restore must rebuild
//
// QEMU 7.2 has no file: migration URI, so the stream goes through
// exec:cat. The VM is stopped before migrating, so the stream is one
// pass and the disk copy matches the memory.

// Checkpoint saves box b into dir.
func (r *Runtime) Checkpoint(ctx context.Context, ib isolate.Box, dir string, keepRunning bool) error {
	b, ok := ib.(*box)
	if !ok || b.rt != r {
		return errors.New("checkpoint: not a box of this microvm runtime")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return errors.New("checkpoint: the box is stopped")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	wasPaused := b.paused
	// The session ends while the guest runs, so it sees the port close
	// before its memory is saved.
	b.link.Detach()
	if !wasPaused {
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := b.qmp.run(ctx, "stop", nil); err != nil {
		b.attach(ctx)
		return fmt.Errorf("checkpoint: %w", err)
	}
	// Resumes the box if the checkpoint fails half way.
	resume := func() {
		if !wasPaused {
			b.qmp.run(context.Background(), "cont", nil)
		}
	}
	mem := filepath.Join(dir, "memory")
	os.Remove(mem)
	if _, err := b.qmp.run(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(64) << 30}); err != nil {
		resume()
		b.attach(ctx)
		return fmt.Errorf("checkpoint: %w", err)
	}
	if _, err := b.qmp.run(ctx, "migrate", map[string]any{"uri": "exec:cat > " + shellQuote(mem)}); err != nil {
		resume()
		b.attach(ctx)
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := b.waitMigration(ctx); err != nil {
		b.qmp.run(context.Background(), "migrate_cancel", nil)
		resume()
		b.attach(ctx)
		return fmt.Errorf("checkpoint: %w", err)
	}
	// The VM is stopped and its disk flushed: copy it as it is now.
	if err := storage.CopyFile(filepath.Join(b.spec.Dir, "disk.img"), filepath.Join(dir, "disk.img")); err != nil {
		resume()
		b.attach(ctx)
		return fmt.Errorf("checkpoint: copy disk: %w", err)
	}
	vm := b.vm
	raw, _ := json.Marshal(vm)
	if err := os.WriteFile(filepath.Join(dir, "vm.json"), raw, 0o600); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if !keepRunning {
		// Memory and disk are saved: no flush (the VM is stopped).
		return b.stopLocked(ctx, false)
	}
	if !wasPaused {
		if _, err := b.qmp.run(ctx, "cont", nil); err != nil {
			return fmt.Errorf("checkpoint: resume: %w", err)
		}
		if err := b.attach(ctx); err != nil {
			return fmt.Errorf("checkpoint: reattach the agent: %w", err)
		}
		// The guest's clock stood still while its memory was saved.
		if err := b.setClock(ctx); err != nil {
			return fmt.Errorf("checkpoint: set the guest's clock: %w", err)
		}
	} else {
		b.needAttach = true
	}
	return nil
}

// waitMigration polls until the running migration completes or fails.
func (b *box) waitMigration(ctx context.Context) error {
	for {
		raw, err := b.qmp.run(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var st struct {
			Status string `json:"status"`
			Error  string `json:"error-desc"`
		}
		json.Unmarshal(raw, &st)
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.Error)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-b.done:
			return errors.New("QEMU exited")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// incoming loads a migration stream into a QEMU started with -incoming
// defer and -S, then runs the VM.
func (b *box) incoming(ctx context.Context, mem string) error {
	if _, err := b.qmp.run(ctx, "migrate-incoming", map[string]any{"uri": "exec:cat < " + shellQuote(mem)}); err != nil {
		return err
	}
	if err := b.waitMigration(ctx); err != nil {
		return err
	}
	for {
		st, err := b.qmp.status(ctx)
		if err != nil {
			return err
		}
		if st == "paused" || st == "running" || st == "prelaunch" {
			break
		}
		if st != "inmigrate" {
			return fmt.Errorf("VM state after the migration: %s", st)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	_, err := b.qmp.run(ctx, "cont", nil)
	return err
}

// Restore boots spec's box from the checkpoint in dir: its disk replaces
// the box's, and the VM runs on from the saved memory. The checkpoint may
// be of another box (a fork): before Restore returns, the guest has taken
// spec's hostname, its own MAC and its slot's addresses and routes.
// Connections the guest had open are then broken in a fork (their
// address is gone); processes, files and memory carry over.
func (r *Runtime) Restore(ctx context.Context, spec *isolate.Spec, dir string) (isolate.Box, error) {
	if err := validate(spec); err != nil {
		return nil, err
	}
	var vm vmConfig
	raw, err := os.ReadFile(filepath.Join(dir, "vm.json"))
	if err == nil {
		err = json.Unmarshal(raw, &vm)
	}
	if err != nil {
		return nil, fmt.Errorf("restore: read checkpoint: %w", err)
	}
	if vm.Accel != r.info.Accel {
		return nil, fmt.Errorf("restore: the checkpoint was taken under %s, this host runs %s", vm.Accel, r.info.Accel)
	}
	if vm.Net != spec.Net {
		return nil, fmt.Errorf("restore: the checkpoint was taken with network %v, the box now has %v", vm.Net, spec.Net)
	}
	if vm.Ident == nil {
		// A checkpoint made before den kept the guest's identity: the
		// guest has the one it booted with.
		vm.Ident = bootIdentity(vm)
	}
	if spec.Net {
		// The box's own MAC, whichever box the checkpoint is of: the
		// guest takes it after the restore (boot, identify).
		vm.MAC = guestMAC(spec.ID)
	}
	// The machine is the checkpoint's: same images in the same order.
	for _, img := range vm.Lowers {
		if _, err := os.Stat(img); err != nil {
			return nil, fmt.Errorf("restore: layer image %s is gone: %w", img, err)
		}
	}
	if _, err := os.Stat(vm.Initrd); err != nil {
		// Same layout, another build of den: the initramfs's content is
		// in the saved memory, QEMU only needs one to load.
		vm.Initrd, err = initramfs(r.cfg.StateDir, r.cfg.Exe, r.info.KernelVer)
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
	}
	if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	disk := filepath.Join(spec.Dir, "disk.img")
	if err := storage.CopyFile(filepath.Join(dir, "disk.img"), disk+".restore"); err != nil {
		return nil, fmt.Errorf("restore: copy disk: %w", err)
	}
	if err := os.Rename(disk+".restore", disk); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	return r.boot(ctx, spec, vm, nil, dir)
}

// bootIdentity is the identity a guest booted with: the hostname and
// network on its kernel command line, and its MAC.
func bootIdentity(vm vmConfig) *guestIdentity {
	for _, f := range strings.Fields(vm.Cmdline) {
		v, ok := strings.CutPrefix(f, "den.cfg=")
		if !ok {
			continue
		}
		var gc guestConfig
		raw, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil || json.Unmarshal(raw, &gc) != nil {
			return nil
		}
		id := &guestIdentity{Hostname: gc.Hostname, Net: gc.Net}
		if vm.Net {
			id.MAC = vm.MAC
		}
		return id
	}
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
