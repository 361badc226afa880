package server_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/den-dev/den/api"
)

// TestRequestRacingStop: a request in flight on a sandbox's agent when the
// sandbox is stopped or removed answers conflict, naming what happened,
// never internal (schemathesis found POST .../files/rename answering 500
// "connection reset by peer" while another worker removed the sandbox).
func TestRequestRacingStop(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, end := range []string{"stopped", "removed"} {
		sb := e.create(t, api.CreateRequest{})
		done := make(chan error, 1)
		go func() {
			_, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "touch /tmp/started; sleep 60"})
			done <- err
		}()
		// The exec is in flight once its first command has run.
		for {
			if _, err := e.c.Stat(ctx, sb.ID, "/tmp/started"); err == nil {
				break
			} else if !errors.Is(err, api.ErrNotFound) {
				t.Fatalf("stat /tmp/started: %v", err)
			}
			select {
			case err := <-done:
				t.Fatalf("exec ended before the %s: %v", end, err)
			case <-time.After(20 * time.Millisecond):
			}
		}
		var err error
		if end == "stopped" {
			_, err = e.c.Stop(ctx, sb.ID)
		} else {
			err = e.c.Remove(ctx, sb.ID, true)
		}
		if err != nil {
			t.Fatalf("%s: %v", end, err)
		}
		err = <-done
		if !errors.Is(err, api.ErrConflict) || err.Error() != "sandbox "+sb.ID[:12]+" "+end+" while the request ran" {
			t.Errorf("exec when the sandbox was %s: %v (kind %s), want conflict: sandbox %s %s while the request ran", end, err, api.KindOf(err), sb.ID[:12], end)
		}
	}
}
