package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/gitws/gitwstest"
)

// nullTypes lists where a JSON schema allows "null" as a type.
func nullTypes(where string, v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		if ts, ok := x["type"].([]any); ok {
			for _, t := range ts {
				if t == "null" {
					out = append(out, fmt.Sprintf("%s: type %v", where, ts))
				}
			}
		}
		for k, c := range x {
			out = append(out, nullTypes(where+"."+k, c)...)
		}
	case []any:
		for i, c := range x {
			out = append(out, nullTypes(fmt.Sprintf("%s[%d]", where, i), c)...)
		}
	}
	return out
}

// Every argument has one JSON type, so clients that convert arguments by
// the schema's type can pass lists, maps and objects.
func TestMCPInputSchemasHaveOneType(t *testing.T) {
	d := newDaemon(t)
	s := d.http(t)
	tools, err := s.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]string{}
	for _, tool := range tools.Tools {
		b, _ := json.Marshal(tool.InputSchema)
		var schema map[string]any
		if err := json.Unmarshal(b, &schema); err != nil {
			t.Fatal(err)
		}
		for _, bad := range nullTypes(tool.Name, schema) {
			t.Errorf("input schema %s", bad)
		}
		props, _ := schema["properties"].(map[string]any)
		for name, p := range props {
			ty, _ := p.(map[string]any)["type"].(string)
			types[tool.Name+"."+name] = ty
		}
	}
	for arg, want := range map[string]string{"exec.cmd": "array", "exec.env": "array", "sandbox_create.labels": "object",
		"sandbox_create.allow_cidr": "array", "sandbox_create.git": "object", "net_policy.allow": "array", "fork.labels": "object"} {
		if types[arg] != want {
			t.Errorf("%s has type %q, want %q", arg, types[arg], want)
		}
	}
	// A list left out is still fine, and one given is used.
	var ex execResult
	s.ok(t, "exec", map[string]any{"sandbox": create(t, s, "types"), "cmd": []string{"echo", "a b"}, "env": []string{"X=1"}}, &ex)
	if ex.Stdout != "a b\n" {
		t.Errorf("exec with typed lists: %+v", ex)
	}
}

func create(t *testing.T, s *session, name string, args ...any) string {
	t.Helper()
	in := map[string]any{"name": name}
	for i := 0; i+1 < len(args); i += 2 {
		in[args[i].(string)] = args[i+1]
	}
	var created struct{ Sandbox api.Sandbox }
	s.ok(t, "sandbox_create", in, &created)
	return created.Sandbox.ID
}

// sandbox_create's arguments reach the daemon; pause, resume, hibernate,
// restore, commit and diff work on a real daemon.
func TestMCPLifecycleTools(t *testing.T) {
	d := newDaemon(t)
	s := d.http(t)
	repo := gitwstest.Repo(t, map[string]string{"README": "one\n"})
	var created struct{ Sandbox api.Sandbox }
	s.ok(t, "sandbox_create", map[string]any{"name": "life", "image": "host", "runtime": "linux", "memory": "256m", "pids": 99,
		"network": "none", "allow_cidr": []string{"10.0.0.0/8"}, "git": map[string]any{"url": repo}}, &created)
	sb := created.Sandbox
	if sb.Limits.Pids != 99 || sb.Limits.Memory != 256<<20 || sb.Runtime != "linux" ||
		strings.Join(sb.Network.AllowCIDR, ",") != "10.0.0.0/8" {
		t.Fatalf("sandbox_create = %+v (network %+v)", sb, sb.Network)
	}
	s.fail(t, "sandbox_create", map[string]any{"name": "badcidr", "network": "allow", "allow_cidr": []string{"not-a-cidr"}}, "invalid", "allow_cidr", "not-a-cidr")
	id := sb.ID

	// diff: the workspace's changes.
	s.ok(t, "exec", map[string]any{"sandbox": id, "shell": "cd /workspace && echo two > README && echo new > added"}, nil)
	var diff struct {
		Base, Head, Patch string
		Files             []api.DiffFile
	}
	s.ok(t, "diff", map[string]any{"sandbox": id}, &diff)
	if len(diff.Files) != 2 || diff.Files[0].Path != "README" || diff.Files[0].Status != "M" || diff.Files[1].Path != "added" ||
		!strings.Contains(diff.Patch, "-one\n+two\n") || diff.Base == "" || diff.Base == diff.Head {
		t.Errorf("diff = %+v", diff)
	}

	// pause / resume / hibernate.
	var bg execResult
	s.ok(t, "exec", map[string]any{"sandbox": id, "shell": "sleep 1000", "background": true}, &bg)
	if bg.Process == nil || bg.Process.ID == "" {
		t.Fatalf("background exec = %+v", bg)
	}
	var out struct{ Sandbox api.Sandbox }
	s.ok(t, "pause", map[string]any{"sandbox": id}, &out)
	if out.Sandbox.State != api.StatePaused {
		t.Fatalf("pause = %+v", out.Sandbox)
	}
	// Reading a paused sandbox leaves it paused.
	var procs struct{ Processes []api.ProcessInfo }
	s.ok(t, "process_list", map[string]any{"sandbox": id}, &procs)
	if n := len(procs.Processes); n == 0 || procs.Processes[n-1].ID != bg.Process.ID || procs.Processes[n-1].State != api.StatePaused {
		t.Errorf("process_list of a paused sandbox = %+v", procs.Processes)
	}
	s.fail(t, "process_logs", map[string]any{"sandbox": id, "process": bg.Process.ID}, "conflict", "paused", "den resume")
	s.ok(t, "resume", map[string]any{"sandbox": id}, &out)
	if out.Sandbox.State != api.StateRunning || out.Sandbox.Resumed != api.ResumedThawed {
		t.Fatalf("resume after pause = %+v", out.Sandbox)
	}
	s.ok(t, "hibernate", map[string]any{"sandbox": id}, &out)
	if out.Sandbox.State != api.StateHibernated {
		t.Fatalf("hibernate = %+v", out.Sandbox)
	}
	s.ok(t, "resume", map[string]any{"sandbox": id}, &out)
	if out.Sandbox.State != api.StateRunning || out.Sandbox.Resumed != api.ResumedRestarted {
		t.Fatalf("resume after hibernate = %+v", out.Sandbox)
	}

	// snapshot, change, restore.
	s.ok(t, "exec", map[string]any{"sandbox": id, "shell": "echo kept > /root/f"}, nil)
	s.ok(t, "snapshot", map[string]any{"sandbox": id, "name": "before"}, nil)
	s.ok(t, "exec", map[string]any{"sandbox": id, "shell": "echo changed > /root/f"}, nil)
	s.ok(t, "restore", map[string]any{"sandbox": id, "snapshot": "before"}, &out)
	var ex execResult
	s.ok(t, "exec", map[string]any{"sandbox": id, "shell": "cat /root/f"}, &ex)
	if ex.Stdout != "kept\n" {
		t.Errorf("after restore: %q", ex.Stdout)
	}
	s.fail(t, "restore", map[string]any{"sandbox": id, "snapshot": "nosuch"}, "not_found", "nosuch")

	// commit, and a sandbox of the image.
	var img struct{ Image api.Image }
	s.ok(t, "commit", map[string]any{"sandbox": id, "name": "life-img"}, &img)
	if img.Image.Name != "life-img" {
		t.Fatalf("commit = %+v", img.Image)
	}
	child := create(t, s, "child", "image", "life-img")
	s.ok(t, "exec", map[string]any{"sandbox": child, "shell": "cat /root/f"}, &ex)
	if ex.Stdout != "kept\n" {
		t.Errorf("sandbox of the committed image: %q %q", ex.Stdout, ex.Stderr)
	}
}
