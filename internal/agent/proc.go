package agent

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/den-dev/den/api"
	"golang.org/x/sys/unix"
)

// launcher owns one locked OS thread. Confinement (capabilities, seccomp,
// no_new_privs, cgroup namespace) is applied to that thread only, and every
// command is forked from it, so commands inherit the confinement while the
// agent's other threads keep what they need to serve files.
type launcher struct {
	reqs chan *launchReq
}

type launchReq struct {
	path string
	argv []string
	attr *syscall.ProcAttr
	reg  func(pid int) // registers the pid with the reaper before it can be reaped
	pid  int
	err  error
	done chan struct{}
}

func startLauncher(setup func() error) (*launcher, error) {
	l := &launcher{reqs: make(chan *launchReq)}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the agent
		if setup != nil {
			if err := setup(); err != nil {
				ready <- err
				return
			}
		}
		ready <- nil
		for r := range l.reqs {
			r.pid, r.err = l.fork(r)
			close(r.done)
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return l, nil
}

func (l *launcher) fork(r *launchReq) (int, error) {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	pid, err := syscall.ForkExec(r.path, r.argv, r.attr)
	if err == nil {
		r.reg(pid)
		// Commands are the OOM killer's first choice, never the agent
		// (PID 1 of the sandbox): raising a score needs no privilege.
		// (Processes the command forks in the microseconds before this
		// write keep the agent's score.)
		os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte(commandOOMScore), 0)
	}
	return pid, err
}

func (l *launcher) start(path string, argv []string, attr *syscall.ProcAttr, reg func(int)) (int, error) {
	r := &launchReq{path: path, argv: argv, attr: attr, reg: reg, done: make(chan struct{})}
	l.reqs <- r
	<-r.done
	return r.pid, r.err
}

// commandOOMScore is the oom_score_adj of every command.
const commandOOMScore = "500"

// exitInfo is what wait4 reports for one process.
type exitInfo struct {
	status syscall.WaitStatus
	rusage syscall.Rusage
}

// The reaper collects every child that exits (the agent is PID 1, so that
// includes orphans re-parented to it) and hands statuses to their owners.
var reaper = struct {
	mu      sync.Mutex
	waiters map[int]chan exitInfo
	once    sync.Once
}{waiters: map[int]chan exitInfo{}}

func startReaper() {
	reaper.once.Do(func() {
		ch := make(chan os.Signal, 64)
		signal.Notify(ch, syscall.SIGCHLD)
		go func() {
			for range ch {
				reapAll()
			}
		}()
	})
}

func reapAll() {
	for {
		var ws syscall.WaitStatus
		var ru syscall.Rusage
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, &ru)
		if pid <= 0 || err != nil {
			return
		}
		reaper.mu.Lock()
		if w, ok := reaper.waiters[pid]; ok {
			delete(reaper.waiters, pid)
			w <- exitInfo{ws, ru}
		}
		reaper.mu.Unlock()
	}
}

// register must be called with reaper.mu held (the launcher does).
func registerPid(pid int) chan exitInfo {
	ch := make(chan exitInfo, 1)
	reaper.waiters[pid] = ch
	return ch
}

// Process is one command started by the agent.
type Process struct {
	ID      string
	Pid     int
	Argv    []string
	Started time.Time
	stdout  *ring
	stderr  *ring
	stdinW  *os.File

	mu          sync.Mutex
	stdinMu     sync.Mutex // serializes writers of stdinW
	stdinClosed atomic.Bool
	done        chan struct{}
	status      api.ExitStatus
	ended       time.Time
	timedOut    bool
	name        string
	service     *service // nil for plain processes
	tty         bool     // stdinW is a terminal's master side
}

// Done is closed when the process has exited and its output is complete.
func (p *Process) Done() <-chan struct{} { return p.done }

// Status is valid after Done.
func (p *Process) Status() api.ExitStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// Info describes the process.
func (p *Process) Info() api.ProcessInfo {
	_, outN := p.stdout.Len()
	_, errN := p.stderr.Len()
	info := api.ProcessInfo{ID: p.ID, Pid: p.Pid, Name: p.name, Cmd: p.Argv, State: api.ProcRunning, Started: p.Started.UTC(), Output: outN + errN}
	if svc := p.service; svc != nil {
		svc.mu.Lock()
		info.Restart, info.Restarts = svc.policy, svc.restarts
		svc.mu.Unlock()
	}
	select {
	case <-p.done:
		st := p.Status()
		info.State, info.Exit = api.ProcExited, &st
		p.mu.Lock()
		info.Ended = p.ended.UTC()
		p.mu.Unlock()
	default:
	}
	return info
}

// Signal sends sig to the process group and the rest of the process's tree
// (tree.go): the descendants that left the group or outlived the command.
func (p *Process) Signal(sig syscall.Signal) error {
	return signalTree(p, sig)
}

// outputGrace is how long output is still collected after the command
// exited, for pipes held open by its background children.
const outputGrace = 250 * time.Millisecond

var procSeq struct {
	sync.Mutex
	n int
}

func nextProcID() string {
	procSeq.Lock()
	defer procSeq.Unlock()
	procSeq.n++
	return "p" + strconv.Itoa(procSeq.n)
}

// spawn starts a command. spec must be resolved (absolute path, env, dir, ids).
func (a *Agent) spawn(spec *resolved) (*Process, error) {
	devnull, err := os.Open("/dev/null")
	if err != nil {
		return nil, fmt.Errorf("open /dev/null: %w", err)
	}
	defer devnull.Close()
	var outR, outW, errR, errW, inW, stdin *os.File
	closeAll := func() {
		for _, f := range []*os.File{outR, outW, errR, errW, inW, stdin} {
			if f != nil && f != devnull {
				f.Close()
			}
		}
	}
	sys := &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: spec.uid, Gid: spec.gid, Groups: spec.groups},
	}
	if spec.tty {
		// One terminal for all three streams; the command leads a new
		// session with it as controlling terminal, so job control and ^C work.
		master, slave, err := openPty(spec.rows, spec.cols)
		if err != nil {
			return nil, err
		}
		outR, outW, stdin = master, slave, slave
		if inW, err = dupFile(master); err != nil {
			closeAll()
			return nil, err
		}
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		sys.Setpgid = true
		if outR, outW, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("stdout pipe: %w", err)
		}
		if errR, errW, err = os.Pipe(); err != nil {
			closeAll()
			return nil, fmt.Errorf("stderr pipe: %w", err)
		}
		stdin = devnull
		if spec.stdin != nil || spec.stdinOpen {
			var inR *os.File
			if inR, inW, err = os.Pipe(); err != nil {
				closeAll()
				return nil, fmt.Errorf("stdin pipe: %w", err)
			}
			stdin = inR
		}
	}
	childErr := errW
	if childErr == nil {
		childErr = outW
	}
	id := spec.id
	if id == "" {
		id = nextProcID()
	}
	attr := &syscall.ProcAttr{
		Dir:   spec.dir,
		Env:   mergeEnv(spec.env, []string{procMarkEnv + "=" + id}), // see tree.go
		Files: []uintptr{stdin.Fd(), outW.Fd(), childErr.Fd()},
		Sys:   sys,
	}
	if spec.stdoutRing == nil {
		spec.stdoutRing, spec.stderrRing = newRing(a.opts.OutputLimit), newRing(a.opts.OutputLimit)
	}
	p := &Process{
		ID:      id,
		Argv:    spec.argv,
		stdout:  spec.stdoutRing,
		stderr:  spec.stderrRing,
		stdinW:  inW,
		done:    make(chan struct{}),
		Started: time.Now(),
		tty:     spec.tty,
	}
	var wait chan exitInfo
	pid, err := a.launch.start(spec.path, spec.argv, attr, func(pid int) { wait = registerPid(pid) })
	// The child has its ends now.
	for _, f := range []*os.File{outW, errW, stdin} {
		if f != nil && f != devnull {
			f.Close()
		}
	}
	outW, errW, stdin = nil, nil, nil
	if err != nil {
		closeAll()
		return nil, err
	}
	p.Pid = pid
	if inW != nil && spec.stdin != nil {
		go func() {
			p.stdinMu.Lock()
			defer p.stdinMu.Unlock()
			inW.Write(spec.stdin)
			if !spec.stdinOpen {
				p.stdinClosed.Store(true)
				inW.Close()
			}
		}()
	}
	var timer *time.Timer
	if spec.timeout > 0 {
		timer = time.AfterFunc(spec.timeout, func() {
			p.mu.Lock()
			p.timedOut = true
			p.mu.Unlock()
			signalTree(p, syscall.SIGKILL)
		})
	}
	pumps := sync.WaitGroup{}
	pumps.Add(1)
	go pump(outR, p.stdout, &pumps)
	if errR != nil {
		pumps.Add(1)
		go pump(errR, p.stderr, &pumps)
	}
	go func() {
		info := <-wait
		if timer != nil {
			timer.Stop()
		}
		end := time.Now()
		// Wait for the pipes to drain; background children may hold them.
		drained := make(chan struct{})
		go func() { pumps.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(outputGrace):
			outR.SetReadDeadline(time.Now())
			if errR != nil {
				errR.SetReadDeadline(time.Now())
			}
			<-drained
		}
		p.mu.Lock()
		p.status = exitStatus(info, end.Sub(p.Started), p.timedOut)
		p.ended = end
		p.mu.Unlock()
		if p.stdinW != nil { // unblocks a writer stuck on a full pipe
			p.stdinClosed.Store(true)
			p.stdinW.Close()
		}
		if !spec.keepRings { // a service's next run writes on
			p.stdout.Close()
			p.stderr.Close()
		}
		close(p.done)
	}()
	return p, nil
}

func pump(r *os.File, dst *ring, wg *sync.WaitGroup) {
	defer wg.Done()
	defer r.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			dst.Write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

func exitStatus(info exitInfo, wall time.Duration, timedOut bool) api.ExitStatus {
	st := api.ExitStatus{
		Duration: api.Duration(wall),
		CPU:      api.Duration(time.Duration(info.rusage.Utime.Nano() + info.rusage.Stime.Nano())),
		MaxRSS:   info.rusage.Maxrss * 1024,
	}
	ws := info.status
	switch {
	case timedOut:
		st.Reason = api.ReasonTimeout
		st.ExitCode = 124
		if ws.Signaled() {
			st.Signal = unix.SignalName(ws.Signal())
		}
	case ws.Signaled():
		st.Reason = api.ReasonSignaled
		st.Signal = unix.SignalName(ws.Signal())
		st.ExitCode = 128 + int(ws.Signal())
	default:
		st.Reason = api.ReasonExited
		st.ExitCode = ws.ExitStatus()
	}
	return st
}
