package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/den-dev/den/internal/isolate"
)

// HostImage is the name of the built-in image made of the host's own
// operating-system files.
const HostImage = "host"

// hostLayerVersion changes when the layout of the generated layer changes.
const hostLayerVersion = "host-v1"

// hostDirs are top-level host directories shared read-only (id-mapped)
// beneath each sandbox's copy-on-write layer. A host where one is a symlink
// (merged /usr) gets the symlink in the generated layer instead.
var hostDirs = []string{"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// hostSecrets are /etc entries never copied even when world-readable.
var hostSecrets = map[string]bool{
	"shadow": true, "shadow-": true, "gshadow": true, "gshadow-": true, "ssh": true,
	"ssl/private": true, "den": true, "machine-id": true, ".pwd.lock": true,
	"security/opasswd": true, "sudoers.d": true, "wireguard": true, "NetworkManager/system-connections": true,
}

// hostLayers returns the overlays of the host image, generating its small
// private layer (a filtered copy of /etc, the package databases, empty
// home directories) under dir on first use.
func hostLayers(dir string) ([]isolate.Overlay, error) {
	hostBuild.Lock()
	defer hostBuild.Unlock()
	layer := filepath.Join(dir, hostLayerVersion)
	if _, err := os.Stat(layer); errors.Is(err, fs.ErrNotExist) {
		if err := buildHostLayer(layer); err != nil {
			return nil, fmt.Errorf("build host image: %w", err)
		}
	}
	out := []isolate.Overlay{{Target: "/", Lowers: []string{layer}, Name: "root"}}
	for _, d := range hostDirs {
		st, err := os.Lstat("/" + d)
		if err != nil || !st.IsDir() {
			continue
		}
		out = append(out, isolate.Overlay{Target: "/" + d, Lowers: []string{"/" + d}, Name: d})
	}
	return out, nil
}

var hostBuild sync.Mutex

func buildHostLayer(layer string) error {
	tmp := layer + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(filepath.Dir(layer), 0o700); err != nil {
		return err
	}
	dirs := map[string]os.FileMode{
		"proc": 0o555, "sys": 0o555, "dev": 0o755, "run": 0o755, "tmp": 0o1777 | os.ModeSticky,
		"root": 0o700, "home": 0o755, "mnt": 0o755, "media": 0o755, "opt": 0o755, "srv": 0o755,
		"var": 0o755, "var/tmp": 0o1777, "var/log": 0o755, "var/cache": 0o755, "var/lib": 0o755,
		"var/lib/apt": 0o755, "var/cache/apt/archives/partial": 0o755, "var/spool": 0o755,
	}
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	for d, mode := range dirs {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o755); err != nil {
			return err
		}
		perm := mode.Perm()
		if mode&0o1000 != 0 || mode&os.ModeSticky != 0 {
			perm |= os.ModeSticky
		}
		if err := os.Chmod(filepath.Join(tmp, d), perm); err != nil {
			return err
		}
	}
	for _, d := range hostDirs {
		st, err := os.Lstat("/" + d)
		if err != nil {
			continue
		}
		if st.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink("/" + d)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, filepath.Join(tmp, d)); err != nil {
				return err
			}
		} else if err := os.Mkdir(filepath.Join(tmp, d), st.Mode().Perm()); err != nil {
			return err
		}
	}
	if err := copyPublicTree("/etc", filepath.Join(tmp, "etc"), "", hostSecrets, false); err != nil {
		return fmt.Errorf("copy /etc: %w", err)
	}
	for _, d := range []string{"var/lib/dpkg", "var/lib/apt/lists"} {
		if _, err := os.Stat("/" + d); err != nil {
			continue
		}
		if err := copyPublicTree("/"+d, filepath.Join(tmp, d), "", nil, true); err != nil {
			return fmt.Errorf("copy /%s: %w", d, err)
		}
	}
	if err := writeShadow(filepath.Join(tmp, "etc")); err != nil {
		return err
	}
	return os.Rename(tmp, layer)
}

// copyPublicTree copies the world-readable part of src to dst: files and
// symlinks readable by everyone, directories readable and searchable by
// everyone, minus the names in skip (relative to the top). With link set,
// regular files are hard-linked when possible (the layer is read-only).
func copyPublicTree(src, dst, rel string, skip map[string]bool, link bool) error {
	st, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if skip[rel] {
		return nil
	}
	mode := st.Mode()
	sys := st.Sys().(*syscall.Stat_t)
	switch {
	case mode&os.ModeSymlink != 0:
		t, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(t, dst)
	case mode.IsDir():
		if mode.Perm()&0o005 != 0o005 {
			return nil
		}
		if err := os.Mkdir(dst, mode.Perm()); err != nil {
			return err
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range ents {
			r := e.Name()
			if rel != "" {
				r = rel + "/" + e.Name()
			}
			if err := copyPublicTree(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()), r, skip, link); err != nil {
				return err
			}
		}
		os.Chmod(dst, mode.Perm()|mode&(os.ModeSetgid|os.ModeSticky))
		return os.Lchown(dst, int(sys.Uid), int(sys.Gid))
	case mode.IsRegular():
		if mode.Perm()&0o004 == 0 {
			return nil
		}
		if link && os.Link(src, dst) == nil {
			return nil
		}
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode.Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
		os.Chmod(dst, mode.Perm()|mode&(os.ModeSetuid|os.ModeSetgid))
		return os.Lchown(dst, int(sys.Uid), int(sys.Gid))
	}
	return nil // devices, fifos, sockets
}

// writeShadow writes /etc/shadow and /etc/gshadow with every account
// locked, so tools like useradd and passwd work without host hashes.
func writeShadow(etc string) error {
	shadowGid := 0
	var shadow, gshadow strings.Builder
	scan := func(file string, fn func([]string)) {
		f, err := os.Open(filepath.Join(etc, file))
		if err != nil {
			return
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Split(sc.Text(), ":"); len(fields) >= 3 && fields[0] != "" {
				fn(fields)
			}
		}
	}
	scan("passwd", func(f []string) { fmt.Fprintf(&shadow, "%s:*:19000:0:99999:7:::\n", f[0]) })
	scan("group", func(f []string) {
		fmt.Fprintf(&gshadow, "%s:*::\n", f[0])
		if f[0] == "shadow" {
			fmt.Sscan(f[2], &shadowGid)
		}
	})
	for name, body := range map[string]string{"shadow": shadow.String(), "gshadow": gshadow.String()} {
		p := filepath.Join(etc, name)
		if err := os.WriteFile(p, []byte(body), 0o640); err != nil {
			return err
		}
		if err := os.Chown(p, 0, shadowGid); err != nil {
			return err
		}
	}
	return nil
}
