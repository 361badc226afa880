package sandbox

import (
	"reflect"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/egress"
)

// An exec's denials: its own and the unattributable ones in its window,
// grouped; a concurrent command's (attributed to it) and later ones not.
func TestGroupDenials(t *testing.T) {
	t0 := time.Now()
	end := t0.Add(time.Minute)
	ev := func(dt time.Duration, kind, name, addr string, port int, reason, process string) egress.Event {
		return egress.Event{Time: t0.Add(dt), Kind: kind, Name: name, Addr: addr, Port: port, Verdict: egress.VerdictDeny,
			Reason: reason, Rule: egress.Rule(reason), Process: process}
	}
	evs := []egress.Event{
		ev(1, egress.KindConnect, "example.com", "", 443, "name not in allow list", "p7 (curl https://example.com)"),
		ev(2, egress.KindConnect, "", "10.0.0.1", 80, "no name: blocked address 10.0.0.1: private (RFC 1918)", "p7 (sh -c ...)"),
		ev(3, egress.KindConnect, "example.com", "", 443, "name not in allow list", "p7 (curl https://example.com)"),
		ev(4, egress.KindConnect, "other.example", "", 443, "name not in allow list", "p8 (curl https://other.example)"), // another exec
		ev(5, egress.KindDNS, "example.com", "", 0, "name not in allow list", ""),                                        // unattributed
		ev(6, egress.KindDNS, "example.com", "", 0, "name not in allow list", "pid 40 (wget)"),                           // no agent process
		ev(2*time.Minute, egress.KindConnect, "late.example", "", 443, "name not in allow list", "p7 (curl)"),            // after the end
		ev(7, egress.KindConnect, "p71.example", "", 443, "name not in allow list", "p71 (curl)"),                        // p71 is not p7
	}
	got := groupDenials(evs, "p7", end)
	want := []api.DeniedConn{
		{Host: "example.com", Port: 443, Proto: "tcp", Rule: "name not in allow list", Reason: "name not in allow list", Count: 2},
		{Host: "10.0.0.1", Port: 80, Proto: "tcp", Rule: "address not public", Reason: "no name: blocked address 10.0.0.1: private (RFC 1918)", Count: 1},
		{Host: "example.com", Port: 53, Proto: "dns", Rule: "name not in allow list", Reason: "name not in allow list", Count: 2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("groupDenials:\n got %+v\nwant %+v", got, want)
	}
	// A command the agent named no process for (a session's): the window alone.
	if got := groupDenials(evs, "", end); len(got) != 5 {
		t.Errorf("without a process: %+v; want 5 groups", got)
	}
}
