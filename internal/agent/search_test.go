package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
)

func searchTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for name, body := range map[string]string{
		"a.go":          "package a\nfunc A() {}\n",
		"src/b.go":      "package b\n// TODO: b\nfunc B() {}\n",
		"src/x/c.go":    "package c\nfunc C() { todo() }\n",
		"src/x/c.txt":   "TODO in text\n",
		"bin/blob":      "TODO\x00binary",
		".hidden/d.go":  "package d // TODO\n",
		"deep/1/2/3.go": "package deep\n",
	} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A symlink to a directory outside the tree: never followed.
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret.go"), []byte("package secret // TODO\n"), 0o644)
	if err := os.Symlink(outside, filepath.Join(root, "src", "link")); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestGlob(t *testing.T) {
	root := searchTree(t)
	rel := func(res *api.GlobResult) []string {
		var out []string
		for _, m := range res.Matches {
			out = append(out, strings.TrimPrefix(m, root+"/"))
		}
		return out
	}
	for _, tc := range []struct {
		pattern string
		want    []string
	}{
		{"**/*.go", []string{".hidden/d.go", "a.go", "deep/1/2/3.go", "src/b.go", "src/x/c.go"}},
		{"*.go", []string{"a.go"}},
		{"src/*/c.*", []string{"src/x/c.go", "src/x/c.txt"}},
		{"src/**", []string{"src/b.go", "src/link", "src/x", "src/x/c.go", "src/x/c.txt"}},
		{"deep/**/3.go", []string{"deep/1/2/3.go"}},
		{"nosuch/**/*.go", nil},
	} {
		res, err := glob(context.Background(), map[string][]string{"pattern": {tc.pattern}, "path": {root}})
		if err != nil {
			t.Fatalf("%s: %v", tc.pattern, err)
		}
		if got := rel(res); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("glob %s = %v, want %v", tc.pattern, got, tc.want)
		}
	}
	res, err := glob(context.Background(), map[string][]string{"pattern": {"**/*.go"}, "path": {root}, "limit": {"2"}})
	if err != nil || len(res.Matches) != 2 || !res.Truncated {
		t.Errorf("limit 2: %+v %v", res, err)
	}
}

func TestGlobBadInput(t *testing.T) {
	root := searchTree(t)
	for _, q := range []map[string][]string{
		{"path": {root}},
		{"pattern": {"../*"}, "path": {root}},
		{"pattern": {"src/../../*"}, "path": {root}},
		{"pattern": {"[a-"}, "path": {root}},
		{"pattern": {"/"}, "path": {root}},
		{"pattern": {"*"}, "path": {root}, "limit": {"0"}},
		{"pattern": {"*"}, "path": {root}, "limit": {"x"}},
		{"pattern": {"*"}, "path": {"a\x00b"}},
	} {
		if _, err := glob(context.Background(), q); api.KindOf(err) != api.KindInvalid {
			t.Errorf("glob %q: want invalid, got %v", q, err)
		}
	}
}

func TestGrep(t *testing.T) {
	root := searchTree(t)
	res, err := grep(context.Background(), map[string][]string{"pattern": {"TODO"}, "path": {root}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range res.Matches {
		got = append(got, strings.TrimPrefix(m.Path, root+"/")+":"+m.Text)
	}
	want := []string{".hidden/d.go:package d // TODO", "src/b.go:// TODO: b", "src/x/c.txt:TODO in text"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("grep TODO = %v, want %v", got, want)
	}
	if res.Skipped != 1 || res.Matches[1].Line != 2 {
		t.Errorf("skipped %d (want the binary file), line %d", res.Skipped, res.Matches[1].Line)
	}
	res, err = grep(context.Background(), map[string][]string{"pattern": {"todo"}, "path": {root}, "glob": {"*.go"}, "ignore_case": {"true"}})
	if err != nil || len(res.Matches) != 3 {
		t.Errorf("grep -i todo *.go: %+v %v", res, err)
	}
	res, err = grep(context.Background(), map[string][]string{"pattern": {"func"}, "path": {filepath.Join(root, "src/b.go")}})
	if err != nil || len(res.Matches) != 1 || res.Matches[0].Line != 3 {
		t.Errorf("grep one file: %+v %v", res, err)
	}
	for _, q := range []map[string][]string{
		{"path": {root}},
		{"pattern": {"("}, "path": {root}},
		{"pattern": {"x"}, "path": {root}, "ignore_case": {"maybe"}},
		{"pattern": {"x"}, "path": {root}, "glob": {"../*"}},
	} {
		if _, err := grep(context.Background(), q); api.KindOf(err) != api.KindInvalid {
			t.Errorf("grep %q: want invalid, got %v", q, err)
		}
	}
	if _, err := grep(context.Background(), map[string][]string{"pattern": {"x"}, "path": {filepath.Join(root, "nosuch")}}); api.KindOf(err) != api.KindNotFound {
		t.Errorf("grep in a missing directory: want not_found, got %v", err)
	}
}

// TestGrepByteBudget: a grep stops, truncated, before the file that would
// take it past grepMaxBytes, however many files are left to walk.
func TestGrepByteBudget(t *testing.T) {
	root := t.TempDir()
	line := strings.Repeat("x", 99) + "\n"
	for i := 0; i < 10; i++ {
		if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("f%d", i)), []byte(strings.Repeat(line, 10)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	q := map[string][]string{"pattern": {"^x"}, "path": {root}}
	// The control: with room for all, every file is read.
	res, err := grep(context.Background(), q)
	if err != nil || res.Files != 10 || res.Truncated || len(res.Matches) != 100 {
		t.Fatalf("grep within the budget: %d files, truncated %v, %d matches, %v; want 10, false, 100", res.Files, res.Truncated, len(res.Matches), err)
	}
	defer func(n int64) { grepMaxBytes = n }(grepMaxBytes)
	grepMaxBytes = 3500 // three files of 1000 bytes and a half
	res, err = grep(context.Background(), q)
	if err != nil || res.Files != 3 || res.Skipped != 0 || !res.Truncated || len(res.Matches) != 30 {
		t.Errorf("grep past the budget: %d files, %d skipped, truncated %v, %d matches, %v; want 3, 0, true, 30", res.Files, res.Skipped, res.Truncated, len(res.Matches), err)
	}
}
