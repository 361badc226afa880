package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/isolate"
	"golang.org/x/sys/unix"
)

type box struct {
	rt   *Runtime
	spec *isolate.Spec
	link *agent.Link
	done chan struct{}

	smu         sync.Mutex
	pid         int           // runsc's sandbox process
	sandboxDone chan struct{} // closed when that process ends
	swapping    bool          // a checkpoint that keeps the box running replaces its sandbox
	swapped     chan struct{} // a swap ended

	mu       sync.Mutex // serializes lifecycle calls
	paused   bool
	attached bool
	stopped  bool
}

// The abilities of the gvisor tier (isolate's optional interfaces).
var (
	_ isolate.Runtime      = (*Runtime)(nil)
	_ isolate.Cleaner      = (*Runtime)(nil)
	_ isolate.Loader       = (*Runtime)(nil)
	_ isolate.Checkpointer = (*Runtime)(nil)

	_ isolate.Box     = (*box)(nil)
	_ isolate.Pauser  = (*box)(nil)
	_ isolate.Statser = (*box)(nil)
)

// newBox watches the sandbox process pid: Done closes when it ends.
func (r *Runtime) newBox(spec *isolate.Spec, pid int) (*box, error) {
	if err := r.checkSandbox(pid, spec.ID); err != nil {
		return nil, err
	}
	b := &box{rt: r, spec: spec, pid: pid, link: agent.NewLink(), done: make(chan struct{}), swapped: make(chan struct{}, 1)}
	ch, err := watch(pid)
	if err != nil {
		return nil, fmt.Errorf("box %s: %w", spec.ID, err)
	}
	b.sandboxDone = ch
	go b.supervise()
	return b, nil
}

// supervise closes Done when the box's sandbox ends, unless a checkpoint
// is replacing it with a new one.
func (b *box) supervise() {
	for {
		b.smu.Lock()
		ch := b.sandboxDone
		b.smu.Unlock()
		<-ch
		for {
			b.smu.Lock()
			if b.sandboxDone != ch {
				b.smu.Unlock()
				break // a new sandbox: watch it
			}
			if !b.swapping {
				b.smu.Unlock()
				close(b.done)
				b.link.Close() // requests fail rather than wait for a box that is gone
				return
			}
			b.smu.Unlock()
			<-b.swapped
		}
	}
}

// watch returns a channel closed when process pid ends. It waits through
// the runtime's poller (no thread per box): a pidfd becomes readable when
// its process exits. The sandbox is not our child (runsc run --detach
// leaves it), so this is the way to see it go.
func watch(pid int) (chan struct{}, error) {
	pidfd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd: %w", err)
	}
	pf := os.NewFile(uintptr(pidfd), "pidfd")
	rc, err := pf.SyscallConn()
	if err != nil {
		pf.Close()
		return nil, fmt.Errorf("pidfd: %w", err)
	}
	ch := make(chan struct{})
	go func() {
		rc.Read(func(fd uintptr) bool {
			n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return n > 0
		})
		pf.Close()
		close(ch)
	}()
	return ch, nil
}

// network is the runsc network flag the box was started with (runsc
// checkpoint --leave-running boots the sandbox anew with it).
func (b *box) network() string {
	if b.spec.Net {
		return "--network=sandbox"
	}
	return "--network=none"
}

func (b *box) Agent() *agent.Client { return b.link.Client() }
func (b *box) Pid() int {
	b.smu.Lock()
	defer b.smu.Unlock()
	return b.pid
}
func (b *box) Done() <-chan struct{} { return b.done }

// fifos is the daemon's end of a box's stdio: it reads the box's stdout
// and writes its stdin.
type fifos struct {
	r, w *os.File
}

func (f *fifos) Read(p []byte) (int, error)  { return f.r.Read(p) }
func (f *fifos) Write(p []byte) (int, error) { return f.w.Write(p) }
func (f *fifos) Close() error {
	f.r.Close()
	return f.w.Close()
}

// attach opens the box's FIFOs and starts a link session with its agent.
// Call with b.mu held, or before b is shared.
func (b *box) attach(ctx context.Context) error {
	run := b.rt.boxRun(b.spec.ID)
	// Non-blocking opens: a FIFO nobody holds any more (the box is gone)
	// fails instead of waiting.
	out, err := os.OpenFile(filepath.Join(run, "out"), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open the agent's stdout: %w", err)
	}
	in, err := os.OpenFile(filepath.Join(run, "in"), os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		out.Close()
		return fmt.Errorf("open the agent's stdin: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-b.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := b.link.Attach(ctx, &fifos{r: out, w: in}); err != nil {
		select {
		case <-b.done:
			return errors.New("the sandbox exited before its agent answered")
		default:
		}
		return err
	}
	b.attached = true
	return nil
}

// Stop kills the box's sandbox and frees everything but its storage.
func (b *box) Stop(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stop(ctx)
}

func (b *box) stop(ctx context.Context) error {
	if b.stopped {
		return nil
	}
	b.link.Close()
	if err := b.rt.clean(ctx, b.spec); err != nil {
		return err
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	b.stopped = true
	return nil
}

// Pause freezes every process of the box (runsc pause: gVisor's kernel
// stops its tasks), the agent included.
func (b *box) Pause(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.paused {
		return nil
	}
	if _, err := b.rt.runsc(ctx, nil, "pause", b.spec.ID); err != nil {
		if b.rt.containerState(ctx, b.spec.ID) != "paused" {
			return err
		}
	}
	b.paused = true
	return nil
}

// Resume lets the box's processes run on.
func (b *box) Resume(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.paused {
		if _, err := b.rt.runsc(ctx, nil, "resume", b.spec.ID); err != nil {
			if b.rt.containerState(ctx, b.spec.ID) != "running" {
				return err
			}
		}
		b.paused = false
	}
	if !b.attached {
		// Loaded while paused: the agent can answer now.
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return b.attach(actx)
	}
	return nil
}

// checkpointTimeout bounds writing or reading a checkpoint image.
const checkpointTimeout = 5 * time.Minute

// Checkpoint saves box b (of this runtime) into dir with runsc
// checkpoint. The agent's link session ends first (the image keeps no
// daemon connection). runsc checkpoint always ends the sandbox (this
// runsc's --leave-running restores into a sandbox that takes runsc's own
// stdio and waits for it), so with keepRunning the box is restored at once
// from dir, on the same FIFOs, and runs on in a new sandbox: Pid changes
// (Load finds the new one), Done stays open.
//
// This gVisor cannot save a TCP connection over the box's eth0 (one
// closed less than about a minute ago counts too; loopback ones are
// fine), and a save that fails ends the sandbox: the error then says so,
// and Done closes.
func (r *Runtime) Checkpoint(ctx context.Context, ib isolate.Box, dir string, keepRunning bool) error {
	b, ok := ib.(*box)
	if !ok || b.rt != r {
		return errors.New("checkpoint: not a box of this gvisor runtime")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return fmt.Errorf("checkpoint %s: the box is stopped", b.spec.ID)
	}
	select {
	case <-b.done:
		return fmt.Errorf("checkpoint %s: the box is gone", b.spec.ID)
	default:
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint %s: %w", b.spec.ID, err)
	}
	if err := os.WriteFile(filepath.Join(dir, hostnameFile), []byte(b.spec.Hostname), 0o600); err != nil {
		return fmt.Errorf("checkpoint %s: %w", b.spec.ID, err)
	}
	b.link.Detach()
	b.attached = false
	b.smu.Lock()
	b.swapping = keepRunning
	old := b.sandboxDone
	b.smu.Unlock()
	endSwap := func() {
		b.smu.Lock()
		b.swapping = false
		b.smu.Unlock()
		select {
		case b.swapped <- struct{}{}:
		default:
		}
	}
	cctx, cancel := context.WithTimeout(ctx, checkpointTimeout)
	defer cancel()
	run := r.boxRun(b.spec.ID)
	_, err := r.runsc(cctx, []string{b.network(), "--log=" + filepath.Join(run, "runsc.log")}, "checkpoint", "--image-path", dir, b.spec.ID)
	if err != nil {
		endSwap()
		if why := saveRejected(run); why != "" {
			err = fmt.Errorf("gVisor cannot save this box: %s", why)
		}
		if r.containerState(ctx, b.spec.ID) == "running" {
			b.attach(ctx)
		} else {
			err = fmt.Errorf("%w; the box ended", err)
		}
		return fmt.Errorf("checkpoint %s: %w", b.spec.ID, err)
	}
	// The sandbox exits once its state is saved.
	select {
	case <-old:
	case <-time.After(10 * time.Second):
		syscall.Kill(b.Pid(), syscall.SIGKILL)
		<-old
	}
	if !keepRunning {
		return b.stop(ctx)
	}
	err = func() error {
		r.runsc(ctx, nil, "delete", "--force", b.spec.ID)
		if b.spec.Net {
			if err := r.setupNet(b.spec); err != nil {
				return err
			}
		}
		pid, err := r.launch(cctx, b.spec, dir)
		if err != nil {
			if msg := logTail(run); msg != "" {
				err = fmt.Errorf("%w; runsc log: %s", err, msg)
			}
			return err
		}
		ch, err := watch(pid)
		if err != nil {
			return err
		}
		b.smu.Lock()
		b.pid, b.sandboxDone = pid, ch
		b.smu.Unlock()
		return nil
	}()
	endSwap()
	if err != nil {
		b.stop(ctx)
		return fmt.Errorf("checkpoint %s: saved, but the box could not run on: %w", b.spec.ID, err)
	}
	if err := b.attach(ctx); err != nil {
		return fmt.Errorf("checkpoint %s: the box runs on but its agent does not answer: %w", b.spec.ID, err)
	}
	return nil
}

// saveRejected finds in the box's runsc log why gVisor refused to save
// it (an open TCP connection, a host socket), or "".
func saveRejected(run string) string {
	b, _ := os.ReadFile(filepath.Join(run, "runsc.log"))
	i := bytes.LastIndex(b, []byte("save rejected due to "))
	if i < 0 {
		return ""
	}
	s := string(b[i+len("save rejected due to "):])
	if j := strings.Index(s, ":\\n"); j >= 0 {
		s = s[:j]
	}
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}

// Stats reports the box's resource use: CPU and memory from its cgroup
// (gVisor's sentry and gofer included), the tasks gVisor's kernel runs,
// and its network namespace's interface counters.
func (b *box) Stats() (isolate.Stats, error) {
	u := b.rt.cg.Usage(b.spec.ID)
	st := isolate.Stats{CPU: u.CPU, Memory: u.Memory, Pids: u.Pids}
	dev, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", b.Pid()))
	if err != nil {
		return st, fmt.Errorf("box %s: read network counters: %w", b.spec.ID, err)
	}
	lines := strings.Split(string(dev), "\n")
	if len(lines) > 2 {
		lines = lines[2:]
	}
	for _, line := range lines {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if strings.TrimSpace(name) == "lo" || len(f) < 9 {
			continue
		}
		rx, _ := strconv.ParseInt(f[0], 10, 64)
		tx, _ := strconv.ParseInt(f[8], 10, 64)
		st.NetRxBytes += rx
		st.NetTxBytes += tx
	}
	return st, nil
}

// OOMKills counts the kernel's out-of-memory kills in the box's cgroup.
func (b *box) OOMKills() uint64 { return b.rt.cg.OOMKills(b.spec.ID) }

// SetLimits changes the box's cgroup limits while it runs. gVisor's
// kernel keeps the memory size it booted with (what /proc/meminfo shows
// inside); the host enforces the new limit. The pids limit changes in the
// sentry too (pids.go).
func (b *box) SetLimits(l isolate.Limits) error {
	if err := b.rt.cg.setLimits(b.spec.ID, l); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return b.setBoxPids(ctx, l.Pids)
}
