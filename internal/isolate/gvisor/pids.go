package gvisor

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/den-dev/den/internal/agent"
)

// A box's pids limit is enforced inside gVisor's kernel, so that a fork
// bomb fails there with EAGAIN, as in the linux tier, and the box, its
// agent and its sentry stay up.
//
// The box's host cgroup holds gVisor's own tasks: the sentry's and gofer's
// threads and, on the systrap platform, a stub process or thread for every
// address space and thread of the box (about 2.5 host tasks per task,
// measured). With the limit enforced only there, a fork bomb drove the host
// count to the limit, the sentry failed to make a stub thread and panicked
// ("createSysmsgThread: failed to get clone"), and the box was gone.
//
// Inside, the limit is RLIMIT_NPROC, which gVisor's kernel enforces for
// every process without CAP_SYS_ADMIN or CAP_SYS_RESOURCE (no command has
// either; the agent has both, so its own threads are never refused): the
// agent sets it on itself at start and when the limit changes, and every
// command inherits it. (gVisor's pids cgroup would count per box rather
// than per user, but this runsc charges a fork to whichever of its seven
// v1 hierarchies comes first in a map, so a limit there stops about one
// fork in seven; and a v2 cgroup can only be joined at fork through
// clone3, which the commands' seccomp filter refuses.) RLIMIT_NPROC counts
// the tasks of one user: root's include the agent's threads, hence
// procsReserve; and a command that switches to many users gets the limit
// for each, until the host's backstop (hostPids) ends its own box only.
const procsReserve = 32

// pidsArg, after agentArg, gives the agent the box's pids limit (0: none).
const pidsArg = "--pids="

// hostPids is the host cgroup's pids limit, a backstop, of a box whose
// commands may run limit tasks: room for gVisor's stubs of every task the
// agent's RLIMIT_NPROC allows, and for the sentry's and gofer's threads.
func hostPids(limit int) int64 { return 3*int64(limit+procsReserve) + 256 }

// agentPidsLimit reads pidsArg from the agent's arguments.
func agentPidsLimit(args []string) (int, error) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, pidsArg); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("bad %s%s", pidsArg, v)
			}
			return n, nil
		}
	}
	return 0, nil
}

// limitProcs sets the agent's RLIMIT_NPROC, and so its future commands',
// for a pids limit (0: unlimited).
func limitProcs(limit int) error {
	lim := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	if limit > 0 {
		n := uint64(limit + procsReserve)
		lim = unix.Rlimit{Cur: n, Max: n}
	}
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &lim); err != nil {
		return fmt.Errorf("set the commands' process limit (RLIMIT_NPROC): %w", err)
	}
	return nil
}

// setBoxPids changes a running box's pids limit inside, through its agent;
// commands started from then on get it.
func (b *box) setBoxPids(ctx context.Context, limit int) error {
	return b.Agent().JSON(ctx, "POST", agent.PathLimits, nil, map[string]int{"pids": limit}, nil)
}
