package agent

import (
	"sync"
	"time"

	"github.com/den-dev/den/api"
)

// A service is a background process the agent starts again when it ends,
// as systemd would for a unit with Restart=always or on-failure. Every run
// keeps the process id and writes to the same output rings, so logs read
// across restarts. A signal through the API (den kill) never ends the
// policy: only stopping or removing the sandbox does.
type service struct {
	id       string
	res      *resolved
	policy   string
	mu       sync.Mutex
	restarts int
	stopped  bool
}

// Backoff between runs: doubling from minBackoff to maxBackoff, back to
// the start after a run that lasted stableRun.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 10 * time.Second
	stableRun  = 10 * time.Second
)

func validRestart(p string) bool {
	return p == "" || p == "no" || p == "always" || p == "on-failure"
}

// supervise runs after each exit of a service's process.
func (a *Agent) supervise(svc *service, p *Process) {
	backoff := minBackoff
	for {
		<-p.Done()
		st := p.Status()
		svc.mu.Lock()
		again := !svc.stopped && (svc.policy == "always" || (svc.policy == "on-failure" && (st.ExitCode != 0 || st.Reason != api.ReasonExited)))
		svc.mu.Unlock()
		if !again {
			p.stdout.Close()
			p.stderr.Close()
			return
		}
		if time.Since(p.Started) >= stableRun {
			backoff = minBackoff
		}
		time.Sleep(backoff)
		backoff = min(backoff*2, maxBackoff)
		svc.mu.Lock()
		if svc.stopped {
			svc.mu.Unlock()
			p.stdout.Close()
			p.stderr.Close()
			return
		}
		next, err := a.spawn(svc.res)
		if err != nil {
			svc.mu.Unlock()
			a.opts.Log.Warn("restart service", "id", svc.id, "err", err)
			p.stdout.Close()
			p.stderr.Close()
			return
		}
		svc.restarts++
		svc.mu.Unlock()
		next.ID = svc.id
		next.service = svc
		next.name = svc.res.name
		a.replace(next)
		p = next
	}
}

// replace puts a service's new run in place of its previous one.
func (a *Agent) replace(p *Process) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, q := range a.order {
		if q.ID == p.ID {
			a.order[i] = p
		}
	}
}

// stop ends a service's restarts: the sandbox is stopping.
func (svc *service) stop() {
	svc.mu.Lock()
	svc.stopped = true
	svc.mu.Unlock()
}

func (svc *service) isStopped() bool {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	return svc.stopped
}
