package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// hostsFile is where a sandbox's resolver finds its own name, relative
// to the sandbox's root.
const hostsFile = "etc/hosts"

// SetHostname sets the sandbox's hostname and names it in the /etc/hosts
// of the sandbox's root directory root (as seen from the caller), as
// NameInHosts does. A hosts file den cannot write (an image's read-only or
// odd /etc) only costs the lookup: it is reported on stderr (the box's
// log), not failed.
func SetHostname(name, root string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := NameInHosts(root, name); err != nil {
		fmt.Fprintf(os.Stderr, "den: name the sandbox in /etc/hosts: %v\n", err)
	}
	return nil
}

// NameInHosts makes the /etc/hosts of the root directory root say that
// name is this machine, as Debian's installer and Docker do: a
// "127.0.1.1 NAME" line, so hostname -f, sudo and Java find their own
// name without a DNS lookup that can stall. The file's other lines (the
// image's) stay; an earlier 127.0.1.1 line (a previous name, or a fork's
// source's) goes. A missing file is written with the localhost lines; one
// that is not a regular file (a symlink the image manages) is left alone.
// The file is reached through an os.Root at root, so symlinks in the
// image's /etc cannot lead the write out of it (the microVM's guest init
// writes it from outside the sandbox's root).
func NameInHosts(root, name string) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	fi, err := r.Lstat(hostsFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := r.MkdirAll(path.Dir(hostsFile), 0o755); err != nil {
			return err
		}
		return r.WriteFile(hostsFile, hostsNaming([]byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"), name), 0o644)
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return nil
	}
	old, err := r.ReadFile(hostsFile)
	if err != nil {
		return err
	}
	if want := hostsNaming(old, name); !bytes.Equal(old, want) {
		return r.WriteFile(hostsFile, want, 0o644)
	}
	return nil
}

// hostsNaming is hosts file content old with name's 127.0.1.1 line.
func hostsNaming(old []byte, name string) []byte {
	var b bytes.Buffer
	for line := range strings.Lines(string(old)) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "127.0.1.1" {
			continue
		}
		b.WriteString(line)
		if !strings.HasSuffix(line, "\n") {
			b.WriteByte('\n')
		}
	}
	b.WriteString("127.0.1.1\t" + name)
	if short, _, ok := strings.Cut(name, "."); ok && short != "" {
		b.WriteString(" " + short)
	}
	b.WriteByte('\n')
	return b.Bytes()
}
