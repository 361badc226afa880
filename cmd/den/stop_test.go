package main

import (
	"testing"
	"time"
)

// den create --stop-signal/--stop-timeout reach the create request (0 is
// kept: it kills at once, unlike an absent timeout), and den stop -t sends
// its timeout as the stop's ?timeout=; without -t the stop sends none.
func TestStopFlags(t *testing.T) {
	f := newFakeDaemon(t)
	if r := den(t, f, "", "create", "--name", "db", "--stop-signal", "INT", "--stop-timeout", "30s"); r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	if got := f.creates[0]; got.StopSignal != "INT" || got.StopTimeout == nil || got.StopTimeout.D() != 30*time.Second {
		t.Fatalf("create request: %q %v", got.StopSignal, got.StopTimeout)
	}
	if r := den(t, f, "", "create", "--name", "now", "--stop-timeout", "0"); r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	if got := f.creates[1].StopTimeout; got == nil || *got != 0 {
		t.Fatalf("--stop-timeout 0: %v", got)
	}
	if r := den(t, f, "", "create", "--name", "dflt"); r.code != 0 || f.creates[2].StopTimeout != nil {
		t.Fatalf("create without --stop-timeout: %+v %v", r, f.creates[2].StopTimeout)
	}
	route := "POST /v1/sandboxes/{id}/stop"
	if r := den(t, f, "", "stop", "db"); r.code != 0 || f.lastQuery[route] != "" {
		t.Fatalf("stop: %+v, query %q", r, f.lastQuery[route])
	}
	if r := den(t, f, "", "start", "db"); r.code != 0 {
		t.Fatalf("start: %+v", r)
	}
	if r := den(t, f, "", "stop", "-t", "90", "db"); r.code != 0 || f.lastQuery[route] != "timeout=1m30s" {
		t.Fatalf("stop -t 90: %+v, query %q", r, f.lastQuery[route])
	}
	if r := den(t, f, "", "stop", "-t", "soon", "db"); r.code == 0 {
		t.Fatalf("stop -t soon: %+v", r)
	}
}
