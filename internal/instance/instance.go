// Package instance is a den serve's identity on its host: the lock that
// makes its data directory its own, the record of what it made outside
// that directory (run directory, bridge, nftables table, cgroup parent),
// and the name of its cgroup parent. den system reset reads both to find
// and remove what a daemon left.
package instance

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultData is den serve's default data directory.
const DefaultData = "/var/lib/den"

// Record is what a daemon made outside its data directory, written to
// DATA/daemon.json at every start.
type Record struct {
	Pid          int       `json:"pid"`
	Started      time.Time `json:"started"`
	Run          string    `json:"run"`              // --run
	Bridge       string    `json:"bridge,omitempty"` // --bridge, when networking is on
	Table        string    `json:"table,omitempty"`  // its nftables table (family inet)
	CgroupParent string    `json:"cgroup_parent"`    // the parent group of its boxes
	Runtimes     []string  `json:"runtimes,omitempty"`
	Runsc        string    `json:"runsc,omitempty"`
	Platform     string    `json:"runsc_platform,omitempty"`
}

// Canonical is the absolute path of dir with symlinks resolved (as far as
// it exists), so one directory has one identity whatever it is called.
func Canonical(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r, nil
	}
	return abs, nil
}

// CgroupParent is the cgroup parent of the boxes of the daemon whose data
// directory is data (canonical): "den" for the default /var/lib/den (so
// boxes a daemon of an earlier release started there are still found),
// else "den-" and 12 hex digits of the SHA-256 of the path. It is the same
// at every start on one data directory and differs between two, so two
// daemons never share a parent and a daemon finds its own groups again
// after a crash.
func CgroupParent(data string) string {
	if data == DefaultData {
		return "den"
	}
	h := sha256.Sum256([]byte(data))
	return "den-" + hex.EncodeToString(h[:6])
}

// Lock is the exclusive hold of a process on a data directory (an flock
// on DATA/daemon.lock, which the kernel releases when the process ends,
// however it ends).
type Lock struct {
	f    *os.File
	data string
}

// BusyError says that another process holds a data directory.
type BusyError struct {
	Data    string
	Pid     int    // 0 if unknown
	Command string // its command line, if known
}

func (e *BusyError) Error() string {
	who := "another process"
	if e.Pid > 0 {
		who = "process " + strconv.Itoa(e.Pid)
		if e.Command != "" {
			who += " (" + e.Command + ")"
		}
	}
	return fmt.Sprintf("%s is using the data directory %s", who, e.Data)
}

// Acquire takes data's lock, without waiting, and writes this process's
// pid into it. If another process holds it the error is a *BusyError.
func Acquire(data string) (*Lock, error) {
	p := filepath.Join(data, "daemon.lock")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, holder(data)
		}
		return nil, fmt.Errorf("lock %s: %w", p, err)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &Lock{f: f, data: data}, nil
}

// holder describes who holds data's lock.
func holder(data string) *BusyError {
	e := &BusyError{Data: data}
	b, _ := os.ReadFile(filepath.Join(data, "daemon.lock"))
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
		e.Pid = pid
		if c, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
			e.Command = strings.TrimSpace(strings.ReplaceAll(string(c), "\x00", " "))
		}
	}
	return e
}

// Release lets the data directory go.
func (l *Lock) Release() {
	if l != nil && l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// Write records rec (with this process's pid) in DATA/daemon.json.
func (l *Lock) Write(rec Record) error {
	rec.Pid = os.Getpid()
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(l.data, "daemon.json")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// Read returns the record of the last daemon that started on data, and
// false if none is recorded (a daemon of an earlier release, or none).
func Read(data string) (Record, bool, error) {
	var rec Record
	b, err := os.ReadFile(filepath.Join(data, "daemon.json"))
	if errors.Is(err, os.ErrNotExist) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, false, fmt.Errorf("read %s: %w", filepath.Join(data, "daemon.json"), err)
	}
	return rec, true, nil
}
