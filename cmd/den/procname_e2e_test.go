package main

import (
	"context"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
)

// A background process started with --name answers to that name in every
// process verb, as it does to its id; a name shaped like an id is refused
// when the process starts, and an unknown name is a clear error.
func TestProcessNamesInEveryVerb(t *testing.T) {
	d := newDaemon(t)
	sb, err := d.c.Create(context.Background(), api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	den := d.must
	id := strings.TrimSpace(den("exec", "-d", "--name", "web", sb.ID, "--", "sh", "-c", "echo serving; exec sleep 1000"))
	if !strings.HasPrefix(id, "p") {
		t.Fatalf("den exec -d printed %q, want a process id", id)
	}
	// The id works (the control), and so does the name.
	for _, ref := range []string{id, "web"} {
		if out := den("logs", sb.ID, ref); out != "serving\n" {
			t.Fatalf("den logs %s: %q", ref, out)
		}
	}
	if out := den("kill", sb.ID, "web"); out != "web\n" {
		t.Fatalf("den kill web: %q", out)
	}
	if out, err := d.cli(0, "wait", sb.ID, "web"); !strings.Contains(out, "KILL") {
		t.Fatalf("den wait web after kill: %q %v", out, err)
	}
	// A new process under the freed name: the name now means it, not the
	// killed one; attach by name feeds it stdin (none here) and follows it.
	id2 := strings.TrimSpace(den("exec", "-d", "--name", "web", sb.ID, "--", "sh", "-c", "echo again; cat"))
	if id2 == id {
		t.Fatalf("second web got the first one's id %s", id)
	}
	if out := den("attach", sb.ID, "web"); out != "again\n" {
		t.Fatalf("den attach web: %q", out)
	}
	if out := den("wait", sb.ID, "web"); out != "0\n" {
		t.Fatalf("den wait web waited for the killed process: %q", out)
	}
	// Unknown names and ids are refused with a clear error.
	for _, ref := range []string{"nosuch", "p999", "a;b"} {
		out, err := d.cli(0, "logs", sb.ID, ref)
		if err == nil || !strings.Contains(out, "no process") || !strings.Contains(out, "--name") {
			t.Fatalf("den logs %s: %q %v, want a no-process error naming --name", ref, out, err)
		}
	}
	// A name that looks like an id could never be reached by name: refused
	// at start, while a name that merely starts with p is fine.
	if out, err := d.cli(0, "exec", "-d", "--name", "p7", sb.ID, "--", "true"); err == nil || !strings.Contains(out, "process id") {
		t.Fatalf("--name p7: %q %v, want refused", out, err)
	}
	den("exec", "-d", "--name", "p7x", sb.ID, "--", "true")
	den("wait", sb.ID, "p7x")
}

// must runs den as root against d, failing the test when it fails.
func (d *daemon) must(args ...string) string {
	d.t.Helper()
	out, err := d.cli(0, args...)
	if err != nil {
		d.t.Fatalf("den %q: %v: %s", args, err, out)
	}
	return out
}
