package agent

import (
	"bytes"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/den-dev/den/api"
)

// StopRequest is the body of PathStop: the graceful first half of a
// sandbox's stop, as docker stop's. The tier kills what is left after.
type StopRequest struct {
	Signal  string       `json:"signal,omitempty"`  // default TERM
	Timeout api.Duration `json:"timeout,omitempty"` // how long to wait for the processes to end
}

// StopResult says how many processes were left when the wait ended.
type StopResult struct {
	Signalled int `json:"signalled"`
	Left      int `json:"left"`
}

// handleStop ends every service's restarts, sends the stop signal to
// every process of the sandbox (the agent's own ancestors and kernel
// threads aside) and waits until they have all ended or the timeout has
// passed. It kills nothing: the tier's stop does that right after.
func (a *Agent) handleStop(w http.ResponseWriter, r *http.Request) {
	var req StopRequest
	if r.ContentLength != 0 {
		if err := decodeBody(r, &req); err != nil {
			WriteError(w, err)
			return
		}
	}
	sig := syscall.SIGTERM
	if req.Signal != "" {
		var err error
		if sig, err = ParseSignal(req.Signal); err != nil {
			WriteError(w, err)
			return
		}
	}
	a.mu.Lock()
	for _, p := range a.order {
		if p.service != nil {
			p.service.stop()
		}
	}
	a.mu.Unlock()
	pids := sandboxProcs()
	for _, pid := range pids {
		syscall.Kill(pid, sig)
		// A terminal's shell ignores TERM: it is hung up, as when the
		// terminal closes.
		if procStat(pid).tty {
			syscall.Kill(pid, syscall.SIGHUP)
		}
	}
	deadline := time.Now().Add(req.Timeout.D())
	left := pids
	for len(left) > 0 && time.Now().Before(deadline) && r.Context().Err() == nil {
		time.Sleep(20 * time.Millisecond)
		left = sandboxProcs()
	}
	writeJSON(w, 200, StopResult{Signalled: len(pids), Left: len(left)})
}

// sandboxProcs lists the live processes of the sandbox but the agent, its
// ancestors (a tier's launcher, where the agent is not PID 1) and kernel
// threads (a microVM's guest kernel shows them in /proc).
func sandboxProcs() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	skip := map[int]bool{}
	for pid := os.Getpid(); pid > 0 && !skip[pid]; {
		skip[pid] = true
		pid = procStat(pid).ppid
	}
	var out []int
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || skip[pid] {
			continue
		}
		if st := procStat(pid); st.ok && !st.zombie && !st.kthread {
			out = append(out, pid)
		}
	}
	return out
}

type statEntry struct {
	ok, zombie, kthread bool
	tty                 bool // it has a controlling terminal
	ppid                int
}

// pfKthread is PF_KTHREAD in the flags field of /proc/PID/stat.
const pfKthread = 0x00200000

func procStat(pid int) statEntry {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return statEntry{}
	}
	// pid (comm) state ppid pgrp session tty_nr tpgid flags ...
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return statEntry{}
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) < 7 {
		return statEntry{}
	}
	e := statEntry{ok: true, zombie: string(f[0]) == "Z", tty: string(f[4]) != "0"}
	e.ppid, _ = strconv.Atoi(string(f[1]))
	flags, _ := strconv.ParseUint(string(f[6]), 10, 64)
	e.kthread = flags&pfKthread != 0
	return e
}
