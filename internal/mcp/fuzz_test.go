package mcp

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// fakeFiles is a den API holding one file, /f.txt in sandbox sb1, and
// counting the writes to it.
type fakeFiles struct {
	mu      sync.Mutex
	content []byte
	writes  int
}

func (d *fakeFiles) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	defer d.mu.Unlock()
	notFound := func() {
		w.WriteHeader(404)
		json.NewEncoder(w).Encode(api.ErrorDoc{Error: api.Errorf(api.KindNotFound, "no such file")})
	}
	if r.PathValue("id") != "sb1" || r.URL.Query().Get("path") != "/f.txt" {
		notFound()
		return
	}
	switch r.Method + " " + r.Pattern[strings.Index(r.Pattern, "}")+1:] {
	case "GET /files/stat":
		json.NewEncoder(w).Encode(api.FileInfo{Path: "/f.txt", Type: "file", Size: int64(len(d.content)), Mode: 0o644})
	case "GET /files":
		w.Write(d.content)
	case "PUT /files":
		d.content, _ = io.ReadAll(r.Body)
		d.writes++
		json.NewEncoder(w).Encode(api.FileInfo{Path: "/f.txt", Type: "file", Size: int64(len(d.content))})
	default:
		notFound()
	}
}

// toolSession connects an MCP client, in memory, to den's MCP server
// acting through a den client of url.
func toolSession(f *testing.F, url string) *sdk.ClientSession {
	srv := newServer("fuzz", func(*sdk.CallToolRequest) (*client.Client, error) { return client.New(url), nil })
	st, ct := sdk.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { ss.Close() })
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "fuzz", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { cs.Close() })
	return cs
}

// FuzzEditFile calls the edit_file tool through the MCP protocol with
// arbitrary arguments on a file with arbitrary content and checks the
// outcome: a successful edit leaves exactly the file with every
// occurrence of old_string replaced, and reports how many and the line of
// the first; a refused edit says why (invalid, not_found, conflict) and
// leaves the file unwritten; and no arguments make a protocol error.
func FuzzEditFile(f *testing.F) {
	d := &fakeFiles{}
	mux := http.NewServeMux()
	for _, p := range []string{"GET /v1/sandboxes/{id}/files/stat", "GET /v1/sandboxes/{id}/files", "PUT /v1/sandboxes/{id}/files"} {
		mux.Handle(p, d)
	}
	ts := httptest.NewServer(mux)
	f.Cleanup(ts.Close)
	cs := toolSession(f, ts.URL)
	// The fake API serves the tool: an edit from the seeds goes through.
	d.content = []byte("a\nb\n")
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "edit_file", Arguments: map[string]any{"sandbox": "sb1", "path": "/f.txt", "old_string": "b", "new_string": "c"}})
	if err != nil || res.IsError || string(d.content) != "a\nc\n" {
		f.Fatalf("edit_file through the fake API: %+v, %v; the file is %q", res, err, d.content)
	}
	for _, s := range []struct {
		content, old, new string
		count             int
	}{
		{"a\nb\nc\n", "b", "B", 0}, {"x x x", "x", "y", 3}, {"x x x", "x", "y", 0}, {"x", "x", "x", 0}, {"abc", "", "z", 0},
		{"abc", "zz", "y", 0}, {"aaa", "aa", "b", 1}, {"ab\r\ncd\r\n", "ab\ncd", "q", 0}, {"é\x00\xff", "\xff", "", 0}, {"a", "a", "b", -1},
	} {
		f.Add(s.content, s.old, s.new, s.count, true)
	}
	f.Add("a", "a", "b", 0, false)
	f.Fuzz(func(t *testing.T, content, old, new string, count int, here bool) {
		// Arguments travel as JSON strings: invalid UTF-8 arrives as U+FFFD.
		old, new = viaJSON(old), viaJSON(new)
		d.mu.Lock()
		d.content, d.writes = []byte(content), 0
		d.mu.Unlock()
		args := map[string]any{"sandbox": "sb1", "path": "/f.txt", "old_string": old, "new_string": new, "expected_count": count}
		if !here {
			args["path"] = "/elsewhere"
		}
		res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "edit_file", Arguments: args})
		if err != nil {
			t.Fatalf("edit_file %v: protocol error: %v", args, err)
		}
		d.mu.Lock()
		got, writes := string(d.content), d.writes
		d.mu.Unlock()
		msg := ""
		for _, c := range res.Content {
			if tc, ok := c.(*sdk.TextContent); ok {
				msg += tc.Text
			}
		}
		n := strings.Count(content, old)
		if res.IsError {
			if writes != 0 || got != content {
				t.Fatalf("edit_file %v refused (%s) but wrote the file: %q", args, msg, got)
			}
			kind, _, _ := strings.Cut(msg, ":")
			if kind != "invalid" && kind != "not_found" && kind != "conflict" && kind != "too_large" {
				t.Fatalf("edit_file %v refused with %q, which names no kind", args, msg)
			}
			return
		}
		want := max(count, 1)
		if !here || old == "" || old == new || count < 0 || n != want {
			t.Fatalf("edit_file %v on %q succeeded (%s); old_string occurs %d times", args, content, msg, n)
		}
		if writes != 1 || got != strings.ReplaceAll(content, old, new) {
			t.Fatalf("edit_file %v on %q: the file is %q after %d writes", args, content, got, writes)
		}
		var out editOut
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, &out); err != nil || out.Replacements != n ||
			out.FirstLine != strings.Count(content[:strings.Index(content, old)], "\n")+1 {
			t.Fatalf("edit_file %v on %q reported %s (%+v, %v)", args, content, b, out, err)
		}
	})
}

// viaJSON is s as it arrives after a trip through a JSON string.
func viaJSON(s string) string {
	b, _ := json.Marshal(s)
	json.Unmarshal(b, &s)
	return s
}

// FuzzReadLines checks read_file's line window over arbitrary file
// content and offset, limit and tail: the lines returned are the file's
// lines StartLine..EndLine, whole (or marked cut), in valid UTF-8, within
// the byte bound, and TotalLines counts the file's lines.
func FuzzReadLines(f *testing.F) {
	for _, s := range []string{"a\nb\nc\n", "", "no newline", "\x00binary", "é\xff\n", strings.Repeat("x", 70000) + "\n", "\n\n\n"} {
		f.Add(s, 0, 0, 0)
		f.Add(s, 2, 1, 0)
		f.Add(s, 0, 0, 2)
	}
	f.Fuzz(func(t *testing.T, content string, offset, limit, tail int) {
		if limit < 0 || tail < 0 || offset < 0 {
			return // the tool refuses these before reading
		}
		out, err := readLines(strings.NewReader(content), readIn{Offset: offset, Limit: limit, Tail: tail})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "invalid: ") {
				t.Fatalf("readLines(%q): %v", content, err)
			}
			return
		}
		lines := strings.SplitAfter(content, "\n")
		if lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		if out.TotalLines != len(lines) {
			t.Fatalf("readLines(%q): %d lines, want %d", content, out.TotalLines, len(lines))
		}
		if !utf8.ValidString(out.Content) || len(out.Content) > readMaxBytes+len(" [line cut]\n")*3 {
			t.Fatalf("readLines(%q): content of %d bytes, valid UTF-8 %v", content, len(out.Content), utf8.ValidString(out.Content))
		}
		if out.StartLine == 0 {
			if out.EndLine != 0 || out.Content != "" {
				t.Fatalf("readLines(%q): no lines, but %+v", content, out)
			}
			return
		}
		if out.StartLine < 1 || out.EndLine < out.StartLine || out.EndLine > len(lines) {
			t.Fatalf("readLines(%q): lines %d-%d of %d", content, out.StartLine, out.EndLine, len(lines))
		}
		if !out.Truncated {
			want := strings.ToValidUTF8(strings.Join(lines[out.StartLine-1:out.EndLine], ""), "\uFFFD")
			if out.Content != want {
				t.Fatalf("readLines(%q, %d, %d, %d): lines %d-%d are %q, want %q", content, offset, limit, tail, out.StartLine, out.EndLine, out.Content, want)
			}
		}
	})
}

// FuzzToolArguments calls every tool through the MCP protocol with
// arbitrary JSON arguments against a den API that knows no sandbox, and
// checks that each call ends in a result (a refusal is a tool error
// naming its kind, never a crash of the session), that every request the
// tools make stays under /v1/ with the sandbox argument as one path
// segment, and that the session still answers afterwards.
func FuzzToolArguments(f *testing.F) {
	var mu sync.Mutex
	var paths []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.EscapedPath())
		mu.Unlock()
		w.WriteHeader(404)
		json.NewEncoder(w).Encode(api.ErrorDoc{Error: api.Errorf(api.KindNotFound, "no sandbox here")})
	}))
	f.Cleanup(ts.Close)
	cs := toolSession(f, ts.URL)
	tools := Tools("fuzz")
	for i := range tools {
		for _, s := range []string{`{}`, `{"sandbox":"sb1"}`, `{"sandbox":"../../v1/secrets","path":"/etc/passwd"}`, `{"sandbox":"..","cmd":["ls"]}`,
			`{"sandbox":"sb1","cmd":"ls","timeout":"-5s","background":true}`, `{"sandbox":"sb1","port":99999}`, `{"sandbox":7}`, `[]`, `null`,
			`{"sandbox":"sb1","signal":"NOPE","process":"p1"}`, `{"image":"x","limits":{"memory":"1e99"}}`, `{"sandbox":"sb1","mode":"allow","allow":["*"]}`} {
			f.Add(uint8(i), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, args []byte) {
		tool := tools[int(which)%len(tools)]
		if !json.Valid(args) {
			return // the transport carries JSON only
		}
		mu.Lock()
		paths = nil
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: tool.Name, Arguments: json.RawMessage(args)})
		if err == nil && res.IsError {
			msg := ""
			for _, c := range res.Content {
				if tc, ok := c.(*sdk.TextContent); ok {
					msg += tc.Text
				}
			}
			if msg == "" {
				t.Fatalf("%s %s: an error without a message", tool.Name, args)
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("%s %s: no answer in 10s", tool.Name, args)
		}
		var a struct {
			Sandbox any `json:"sandbox"`
		}
		json.Unmarshal(args, &a)
		mu.Lock()
		got := paths
		mu.Unlock()
		for _, p := range got {
			if !strings.HasPrefix(p, "/v1/") {
				t.Fatalf("%s %s: the API was asked %s", tool.Name, args, p)
			}
			if id, ok := a.Sandbox.(string); ok && strings.HasPrefix(p, "/v1/sandboxes/") {
				seg, _, _ := strings.Cut(strings.TrimPrefix(p, "/v1/sandboxes/"), "/")
				if dec, err := url.PathUnescape(seg); err != nil || dec != id {
					t.Fatalf("%s %s: sandbox %q reached the API as %s", tool.Name, args, id, p)
				}
			}
		}
		if _, err := cs.ListTools(ctx, nil); err != nil {
			t.Fatalf("%s %s: the session no longer answers: %v", tool.Name, args, err)
		}
	})
}
