package server_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// Read-only calls (inspect, ls, stats, ps, logs, sessions, port ls) leave
// a paused or hibernated sandbox asleep; preview traffic and exec wake it. /metrics
// counts sandboxes in every state.
func TestReadOnlyCallsLeaveSandboxAsleep(t *testing.T) {
	e := newEnv(t)
	testSleepers(t, e, api.CreateRequest{}, api.ResumedRestarted)
}

// testSleepers runs the read-only calls on a sandbox of req (on one
// tier) paused, then hibernated; resumed says how that tier's resume
// brings a hibernated sandbox back.
func testSleepers(t *testing.T, e *env, req api.CreateRequest, resumed string) {
	ctx := context.Background()
	sb := e.create(t, req)
	p, err := e.c.StartProcess(ctx, sb.ID, api.ExecRequest{Name: "talker", Shell: "echo hello; sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "true", Session: "s"})
	if _, err := e.c.SharePort(ctx, sb.ID, 8000, true); err != nil {
		t.Fatal(err)
	}
	metric := func(state string) string {
		t.Helper()
		status, b := e.raw(t, "GET", "/metrics", nil)
		if status != 200 {
			t.Fatalf("metrics: %d %s", status, b)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, `den_sandboxes{state="`+state+`"} `); ok {
				return v
			}
		}
		t.Fatalf("metrics count no %s sandboxes:\n%s", state, b)
		return ""
	}
	// The read-only calls.
	calls := []struct {
		name string
		call func() error
	}{
		{"inspect", func() error { _, err := e.c.Get(ctx, sb.ID); return err }},
		{"ls", func() error { _, err := e.c.List(ctx, nil); return err }},
		{"port ls", func() error { _, err := e.c.Ports(ctx, sb.ID); return err }},
		{"stats", func() error { _, err := e.c.Stats(ctx, sb.ID); return err }},
		{"ps", func() error { _, err := e.c.Processes(ctx, sb.ID); return err }},
		{"ps PROC", func() error { _, err := e.c.Process(ctx, sb.ID, p.ID); return err }},
		{"logs", func() error {
			_, err := e.c.Logs(ctx, sb.ID, p.ID, client.LogsOptions{}, io.Discard, io.Discard)
			return err
		}},
		{"sessions", func() error { _, err := e.c.Sessions(ctx, sb.ID); return err }},
	}
	// Control: on the running sandbox every call answers.
	for _, c := range calls {
		if err := c.call(); err != nil {
			t.Fatalf("%s of a running sandbox: %v", c.name, err)
		}
	}
	if got := metric(api.StateRunning); got != "1" {
		t.Fatalf("running sandboxes: %s", got)
	}
	for _, sleep := range []struct {
		state string
		do    func(context.Context, string) (*api.Sandbox, error)
		// the calls that need the sandbox's processes, and so are a
		// conflict while it sleeps
		conflicts string
	}{
		{api.StatePaused, e.c.Pause, "logs,sessions"},
		{api.StateHibernated, e.c.Hibernate, "stats,logs,sessions"},
	} {
		// ps answers the list the sandbox had when it went to sleep, its
		// running processes in the sandbox's state; a sandbox hibernated
		// without its memory has none: ps is a conflict.
		asleepPs := sleep.state == api.StatePaused || resumed == api.ResumedRestored
		if !asleepPs {
			sleep.conflicts += ",ps,ps PROC"
		}
		if s, err := sleep.do(ctx, sb.ID); err != nil || s.State != sleep.state {
			t.Fatalf("%s: %+v %v", sleep.state, s, err)
		}
		for _, c := range calls {
			err := c.call()
			if strings.Contains(","+sleep.conflicts+",", ","+c.name+",") {
				if ae := wantKind(t, err, api.KindConflict); !strings.Contains(ae.Message, "den resume "+sb.ID[:12]) {
					t.Errorf("%s of a %s sandbox: %q does not say how to wake it", c.name, sleep.state, ae.Message)
				}
			} else if err != nil {
				t.Errorf("%s of a %s sandbox: %v", c.name, sleep.state, err)
			}
			if now, err := e.c.Get(ctx, sb.ID); err != nil || now.State != sleep.state {
				t.Fatalf("%s woke a %s sandbox: now %s (%v)", c.name, sleep.state, now.State, err)
			}
		}
		if asleepPs {
			list, err := e.c.Processes(ctx, sb.ID)
			one, err1 := e.c.Process(ctx, sb.ID, p.ID)
			if err != nil || err1 != nil || one.State != sleep.state || one.Name != "talker" {
				t.Fatalf("ps of a %s sandbox: %v; %+v %v", sleep.state, err, one, err1)
			}
			found := false
			for _, q := range list {
				found = found || (q.ID == p.ID && q.State == sleep.state)
				if q.State == api.ProcRunning {
					t.Errorf("ps of a %s sandbox lists %s as running", sleep.state, q.ID)
				}
			}
			if !found {
				t.Fatalf("ps of a %s sandbox lacks %s: %d processes", sleep.state, p.ID, len(list))
			}
			_, err = e.c.Process(ctx, sb.ID, "p999")
			wantKind(t, err, api.KindNotFound)
		}
		if got := metric(sleep.state); got != "1" {
			t.Fatalf("%s sandboxes: %s", sleep.state, got)
		}
		if got := metric(api.StateRunning); got != "0" {
			t.Fatalf("running sandboxes while it is %s: %s", sleep.state, got)
		}
		// Traffic to a preview wakes it (whether or not anything answers
		// on the port yet).
		if status, b := e.raw(t, "GET", "/preview/"+sb.ID+"/8000/", nil); status == 0 {
			t.Fatalf("preview of a %s sandbox: %d %s", sleep.state, status, b)
		}
		if now, _ := e.c.Get(ctx, sb.ID); now.State != api.StateRunning {
			t.Fatalf("preview traffic left a %s sandbox %s", sleep.state, now.State)
		}
		if s, err := sleep.do(ctx, sb.ID); err != nil || s.State != sleep.state {
			t.Fatalf("%s again: %+v %v", sleep.state, s, err)
		}
		// An exec wakes it.
		if got := string(e.sh(t, sb.ID, "echo awake").Stdout); got != "awake\n" {
			t.Fatalf("exec on a %s sandbox: %q", sleep.state, got)
		}
		if now, _ := e.c.Get(ctx, sb.ID); now.State != api.StateRunning {
			t.Fatalf("exec left a %s sandbox %s", sleep.state, now.State)
		}
	}
	if now, _ := e.c.Get(ctx, sb.ID); now.Resumed != resumed {
		t.Fatalf("resumed %q after hibernation, want %q", now.Resumed, resumed)
	}
}

// The same on gvisor, whose hibernation saves processes and memory.
func TestReadOnlyCallsLeaveGvisorSandboxAsleep(t *testing.T) {
	e := newTierEnv(t)
	e.need(t, "gvisor")
	testSleepers(t, e, api.CreateRequest{Runtime: "gvisor"}, api.ResumedRestored)
}
