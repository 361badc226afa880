package agent

import (
	"errors"
	"fmt"
	"syscall"
)

// FileLimit is RLIMIT_NOFILE, soft and hard, of the agent and so of every
// command (they inherit it; without CAP_SYS_RESOURCE, which den's
// capability set leaves out, none can raise its hard limit).
//
// Unbounded, the limit a command gets is whatever its tier's init started
// with: the daemon's own on the linux tier (often 524288, up to
// fs.nr_open), gVisor's 1048576; times a sandbox's pids limit (4096 by
// default) that is far more open files than the host's fs.file-max
// allows, and the host's file table is shared by every sandbox and every
// unprivileged host process. 65536 per process is what the most demanding
// common servers ask for (Elasticsearch's production checks want 65535),
// and 64 times the soft limit most distributions give a login. The soft
// limit equals the hard one because the agent, which holds a few
// descriptors per running command, passes its own limit on to commands: a
// lower soft limit for commands would cap the agent too. (Go programs
// raise their soft limit to the hard one anyway.) A sandbox as a whole is
// bounded further by its memory limit, to which the kernel charges every
// open file, and by its pids limit.
const FileLimit = 65536

// limitFiles sets the agent's RLIMIT_NOFILE to FileLimit. Where the hard
// limit is lower and cannot be raised (the linux tier's init has
// CAP_SYS_RESOURCE only in its own user namespace, and some hosts withhold
// it even from the daemon), the soft limit becomes the hard one.
func limitFiles() error {
	want := syscall.Rlimit{Cur: FileLimit, Max: FileLimit}
	// syscall.Setrlimit also stops os/exec from restoring, in commands,
	// the soft limit the agent started with.
	err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want)
	if errors.Is(err, syscall.EPERM) {
		var lim syscall.Rlimit
		if err = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Max < FileLimit {
			want = syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
			err = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want)
		}
	}
	if err != nil {
		return fmt.Errorf("limit open files to %d: %w", want.Max, err)
	}
	return nil
}
