package microvm

import (
	"bufio"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// guestModules are the kernel modules the guest init loads (with their
// dependencies, from modules.dep): the virtio-mmio transport, disks,
// the agent's serial port, the NIC, and the root filesystem's types.
var guestModules = []string{"virtio_mmio", "virtio_blk", "virtio_console", "virtio_net", "erofs", "overlay"}

// cpioWriter writes a newc archive.
type cpioWriter struct {
	w   *bufio.Writer
	ino uint32
	n   int64
}

func (c *cpioWriter) header(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) error {
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	if _, err := c.w.WriteString(hdr + name + "\x00"); err != nil {
		return err
	}
	c.n += int64(len(hdr) + len(name) + 1)
	return c.pad()
}

func (c *cpioWriter) pad() error {
	for c.n%4 != 0 {
		if err := c.w.WriteByte(0); err != nil {
			return err
		}
		c.n++
	}
	return nil
}

func (c *cpioWriter) dir(name string) error {
	return c.header(name, 0o040755, 0, 0, 0)
}

func (c *cpioWriter) file(name, src string, perm uint32) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := c.header(name, 0o100000|perm, st.Size(), 0, 0); err != nil {
		return err
	}
	n, err := io.Copy(c.w, f)
	if err != nil {
		return err
	}
	if n != st.Size() {
		return fmt.Errorf("%s changed while archived", src)
	}
	c.n += n
	return c.pad()
}

func (c *cpioWriter) bytes(name string, b []byte, perm uint32) error {
	if err := c.header(name, 0o100000|perm, int64(len(b)), 0, 0); err != nil {
		return err
	}
	c.w.Write(b)
	c.n += int64(len(b))
	return c.pad()
}

func (c *cpioWriter) close() error {
	if err := c.header("TRAILER!!!", 0, 0, 0, 0); err != nil {
		return err
	}
	return c.w.Flush()
}

// moduleOrder resolves names (module names, _ or -) to .ko paths under
// /lib/modules/<release>, dependencies first, each once.
func moduleOrder(release string, names []string) ([]string, error) {
	base := filepath.Join("/lib/modules", release)
	b, err := os.ReadFile(filepath.Join(base, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("read modules.dep: %w", err)
	}
	deps := map[string][]string{}
	byName := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		mod, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		deps[mod] = strings.Fields(rest)
		n := strings.TrimSuffix(filepath.Base(mod), ".ko")
		byName[strings.ReplaceAll(n, "-", "_")] = mod
	}
	var order []string
	seen := map[string]bool{}
	var visit func(string)
	visit = func(m string) {
		if seen[m] {
			return
		}
		seen[m] = true
		for _, d := range deps[m] {
			visit(d)
		}
		order = append(order, m)
	}
	for _, n := range names {
		m, ok := byName[strings.ReplaceAll(n, "-", "_")]
		if !ok {
			// Built into the kernel, or not available: the guest copes or
			// reports the missing device.
			continue
		}
		visit(m)
	}
	for i, m := range order {
		if strings.HasSuffix(m, ".ko") {
			order[i] = filepath.Join(base, m)
		} else {
			return nil, fmt.Errorf("module %s is compressed; den needs uncompressed modules", m)
		}
	}
	return order, nil
}

// elfDeps lists the dynamic loader and libraries an executable needs
// (none for den's static binary; a test binary built with cgo has some).
func elfDeps(exe string) ([]string, error) {
	f, err := elf.Open(exe)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, _ := io.ReadAll(p.Open())
			out = append(out, strings.TrimRight(string(b), "\x00"))
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	libs, _ := f.ImportedLibraries()
	for _, l := range libs {
		found := false
		for _, d := range []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"} {
			if _, err := os.Stat(filepath.Join(d, l)); err == nil {
				out = append(out, filepath.Join(d, l))
				found = true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("%s needs %s, not found", exe, l)
		}
	}
	return out, nil
}

// initramfs returns the guest's initramfs, building it if needed: the den
// binary as /init, its libraries if it is dynamic, and the kernel modules
// in load order (/modules/order). It is cached in stateDir, keyed by the
// binary (path, size, mtime, inode) and the kernel release.
func initramfs(stateDir, exe, release string) (string, error) {
	real, err := os.Readlink(exe)
	if err != nil {
		real = exe
	}
	st, err := os.Stat(exe)
	if err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	ino := uint64(0)
	if sys, ok := st.Sys().(interface{ Ino() uint64 }); ok {
		ino = sys.Ino()
	}
	h := sha256.New()
	fmt.Fprintf(h, "v1|%s|%d|%d|%d|%s|%s", real, st.Size(), st.ModTime().UnixNano(), ino, release, strings.Join(guestModules, ","))
	key := hex.EncodeToString(h.Sum(nil)[:12])
	dir := filepath.Join(stateDir, "initramfs")
	out := filepath.Join(dir, key+".cpio")
	if _, err := os.Stat(out); err == nil {
		os.Chtimes(out, time.Now(), time.Now())
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	mods, err := moduleOrder(release, guestModules)
	if err != nil {
		return "", err
	}
	libs, err := elfDeps(exe)
	if err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "tmp-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	c := &cpioWriter{w: bufio.NewWriterSize(tmp, 1<<20)}
	dirs := map[string]bool{}
	mkdirs := func(p string) error {
		var chain []string
		for d := filepath.Dir(p); d != "/" && d != "."; d = filepath.Dir(d) {
			chain = append([]string{d}, chain...)
		}
		for _, d := range chain {
			if !dirs[d] {
				dirs[d] = true
				if err := c.dir(strings.TrimPrefix(d, "/")); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, d := range []string{"/dev", "/proc", "/sys", "/den", "/modules"} {
		dirs[d] = true
		if err := c.dir(strings.TrimPrefix(d, "/")); err != nil {
			return "", err
		}
	}
	// The kernel opens /dev/console for init before anything is mounted.
	if err := c.header("dev/console", 0o020600, 0, 5, 1); err != nil {
		return "", err
	}
	if err := c.file("init", exe, 0o755); err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	for _, l := range libs {
		if err := mkdirs(l); err != nil {
			return "", err
		}
		if err := c.file(strings.TrimPrefix(l, "/"), l, 0o755); err != nil {
			return "", fmt.Errorf("initramfs: %w", err)
		}
	}
	var order []string
	for _, m := range mods {
		name := filepath.Base(m)
		if err := c.file("modules/"+name, m, 0o644); err != nil {
			return "", fmt.Errorf("initramfs: %w", err)
		}
		order = append(order, name)
	}
	if err := c.bytes("modules/order", []byte(strings.Join(order, "\n")+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := c.close(); err != nil {
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	// Initramfs of other binaries not used for a day go.
	old, _ := filepath.Glob(filepath.Join(dir, "*.cpio"))
	for _, o := range old {
		if st, err := os.Stat(o); err == nil && o != out && time.Since(st.ModTime()) > 24*time.Hour {
			os.Remove(o)
		}
	}
	return out, nil
}
