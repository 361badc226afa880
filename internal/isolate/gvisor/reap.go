package gvisor

import (
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/den-dev/den/internal/host"
	"golang.org/x/sys/unix"
)

// `runsc run --detach` leaves the sandbox and gofer processes behind when
// it exits, and runsc's commands leave short-lived helpers of their own;
// all are reparented to the nearest child subreaper, else to the host's
// PID 1. `runsc delete` (and so Stop, Destroy and a stopping checkpoint)
// waits until the sandbox is gone, and a zombie is not gone: on hosts whose
// PID 1 reaps late (seen here: about 1.5 s) every stop waits for it. The
// reaper makes the daemon their subreaper and reaps them as they exit.
//
// It reaps only zombie children whose command name is "exe": that is what
// runsc's processes are called (runsc re-executes /proc/self/exe), and no
// program the daemon starts itself, and waits for with os/exec, is called
// that (the daemon runs runsc and its own helpers under their own names).
type reaper struct {
	kick chan struct{}
}

var (
	reapOnce sync.Once
	theReap  *reaper
)

// startReaper makes this process a child subreaper and starts reaping the
// runsc processes it adopts. It is process-wide; nil if the process cannot
// be a subreaper.
func startReaper() *reaper {
	reapOnce.Do(func() {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return
		}
		r := &reaper{kick: make(chan struct{}, 1)}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGCHLD)
		go r.loop(sig)
		theReap = r
	})
	return theReap
}

// adopt makes the reaper look at this process's children now.
func (r *reaper) adopt() {
	if r == nil {
		return
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *reaper) loop(sig <-chan os.Signal) {
	tick := time.NewTicker(5 * time.Second) // a safety net for a lost signal
	defer tick.Stop()
	for {
		select {
		case <-sig:
		case <-r.kick:
		case <-tick.C:
		}
		reapRunsc()
	}
}

// reapRunsc reaps this process's zombie children called "exe".
func reapRunsc() {
	for _, pid := range children() {
		if comm, f, err := host.ProcStat(pid); err == nil && comm == "exe" && len(f) > 0 && f[0] == "Z" {
			var ws unix.WaitStatus
			unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		}
	}
}

// children lists the pids whose parent is a thread of this process.
func children() []int {
	tasks, _ := os.ReadDir("/proc/self/task")
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}
