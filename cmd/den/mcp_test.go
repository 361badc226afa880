package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestMCPVerb(t *testing.T) {
	r := den(t, nil, "", "mcp", "--list")
	if r.code != 0 || !strings.Contains(r.stdout, "TOOL") {
		t.Fatalf("den mcp --list: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	for _, name := range []string{"sandbox_create", "exec", "edit_file", "grep", "net_policy"} {
		if !strings.Contains(r.stdout, "\n"+name+" ") {
			t.Errorf("den mcp --list lacks %s:\n%s", name, r.stdout)
		}
	}
	r = den(t, nil, "", "mcp", "--list", "--json")
	var tools []struct {
		Name         string         `json:"name"`
		InputSchema  map[string]any `json:"inputSchema"`
		OutputSchema map[string]any `json:"outputSchema"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &tools); err != nil || len(tools) != 24 {
		t.Fatalf("den mcp --list --json: %v, %d tools", err, len(tools))
	}
	for _, tool := range tools {
		if tool.InputSchema["type"] != "object" || tool.OutputSchema["type"] != "object" {
			t.Errorf("tool %s: schemas %v %v", tool.Name, tool.InputSchema, tool.OutputSchema)
		}
	}
	for _, args := range [][]string{{"mcp", "--json"}, {"mcp", "extra"}} {
		if r := den(t, nil, "", args...); r.code != 2 || !strings.Contains(r.stderr, "den mcp -h") {
			t.Errorf("den %q: exit %d %q, want a usage error", args, r.code, r.stderr)
		}
	}
}
