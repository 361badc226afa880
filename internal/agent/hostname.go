package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// HostsFile is where a sandbox's resolver finds its own name.
const HostsFile = "/etc/hosts"

// SetHostname sets the sandbox's hostname and names it in hosts (the
// sandbox's /etc/hosts, as seen from the caller), as NameInHosts does. A
// hosts file den cannot write (an image's read-only or odd /etc) only
// costs the lookup: it is reported on stderr (the box's log), not failed.
func SetHostname(name, hosts string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := NameInHosts(hosts, name); err != nil {
		fmt.Fprintf(os.Stderr, "den: name the sandbox in %s: %v\n", hosts, err)
	}
	return nil
}

// NameInHosts makes file say that name is this machine, as Debian's
// installer and Docker do: a "127.0.1.1 NAME" line, so hostname -f, sudo
// and Java find their own name without a DNS lookup that can stall. The
// file's other lines (the image's) stay; an earlier 127.0.1.1 line (a
// previous name, or a fork's source's) goes. A missing file is written
// with the localhost lines; one that is not a regular file (a symlink
// the image manages) is left alone.
func NameInHosts(file, name string) error {
	fi, err := os.Lstat(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			return err
		}
		return os.WriteFile(file, hostsNaming([]byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"), name), 0o644)
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return nil
	}
	old, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if want := hostsNaming(old, name); !bytes.Equal(old, want) {
		return os.WriteFile(file, want, 0o644)
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
