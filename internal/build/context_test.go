package build

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const testIgnore = `# build junk
**/__pycache__
*.log
node_modules
docs
!docs/keep.md
/secret.env
`

// makeContext builds a context dir (with a file "secret" beside it) and
// returns its path.
func makeContext(t testing.TB) string {
	t.Helper()
	base := t.TempDir()
	dir := filepath.Join(base, "ctx")
	files := map[string]string{
		".dockerignore":                  testIgnore,
		"app.py":                         "print('hi')\n",
		"requirements.txt":               "flask\n",
		"debug.log":                      "log\n",
		"sub/debug.log":                  "log\n",
		"secret.env":                     "TOKEN=1\n",
		"src/pkg/__init__.py":            "",
		"src/pkg/__pycache__/x.pyc":      "bytecode",
		"src/run.sh":                     "#!/bin/sh\n",
		"node_modules/x/index.js":        "js",
		"docs/keep.md":                   "keep",
		"docs/drop.md":                   "drop",
		"../secret":                      "do not send",
		"src/pkg/__pycache__/y/deep.pyc": "bytecode",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.Chmod(filepath.Join(dir, "src/run.sh"), 0o755))
	must(t, os.Mkdir(filepath.Join(dir, "src/empty"), 0o755))
	for link, target := range map[string]string{
		"src/link": "pkg",
		"linkdir":  "src",
		"outside":  "../..",
		"abs":      "/etc/passwd",
		"abs_in":   filepath.Join(dir, "app.py"),
		"loop":     "loop",
	} {
		must(t, os.Symlink(target, filepath.Join(dir, link)))
	}
	return dir
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func copyIns(args ...string) *Instruction {
	return &Instruction{Line: 7, Cmd: "COPY", Args: args}
}

func TestSources(t *testing.T) {
	dir := makeContext(t)
	all := []string{".", ".dockerignore", "abs", "abs_in", "app.py", "docs/keep.md", "linkdir", "loop", "outside", "requirements.txt",
		"src", "src/empty", "src/link", "src/pkg", "src/pkg/__init__.py", "src/run.sh", "sub", "sub/debug.log"}
	for _, tc := range []struct {
		args    []string
		want    []string
		wantErr string
	}{
		{args: []string{".", "/app"}, want: all},
		{args: []string{"/", "/app"}, want: all},
		{args: []string{"*.py", "requirements.txt", "/app/"}, want: []string{"app.py", "requirements.txt"}},
		{args: []string{"requirements.txt", "optional.tx[t]", "/app/"}, want: []string{"requirements.txt"}},
		{args: []string{"src/pkg", "/x"}, want: []string{"src/pkg", "src/pkg/__init__.py"}},
		{args: []string{"src/*/*.py", "/x/"}, want: []string{"src/pkg/__init__.py"}},
		{args: []string{"src/*", "/x/"}, want: []string{"src/empty", "src/pkg", "src/pkg/__init__.py", "src/run.sh"}},
		{args: []string{"linkdir/pkg", "/x"}, want: []string{"src/pkg", "src/pkg/__init__.py"}},
		{args: []string{"src/link/", "/x"}, want: []string{"src/pkg", "src/pkg/__init__.py"}},
		{args: []string{"/app.py", "./sub/../app.py", "abs_in", "/x/"}, want: []string{"app.py"}},
		{args: []string{"docs", "/x"}, want: []string{"docs", "docs/keep.md"}},
		{args: []string{"sub/*.log", "/x/"}, want: []string{"sub/debug.log"}},
		{args: []string{"*.log", "/x/"}, wantErr: "Dockerfile line 7: COPY sources match no files in the build context (or all are excluded by .dockerignore)"},
		{args: []string{"secret.env", "/x"}, wantErr: `Dockerfile line 7: COPY source "secret.env": not found in the build context (or excluded by .dockerignore)`},
		{args: []string{"node_modules", "/x"}, wantErr: `Dockerfile line 7: COPY source "node_modules": not found in the build context (or excluded by .dockerignore)`},
		{args: []string{"src/pkg/__pycache__/x.pyc", "/x"}, wantErr: `Dockerfile line 7: COPY source "src/pkg/__pycache__/x.pyc": not found in the build context (or excluded by .dockerignore)`},
		{args: []string{"missing.txt", "/x"}, wantErr: `Dockerfile line 7: COPY source "missing.txt": not found in the build context (or excluded by .dockerignore)`},
		{args: []string{"../secret", "/x"}, wantErr: `Dockerfile line 7: COPY source "../secret" is outside the build context`},
		{args: []string{"../ctx/app.py", "/x"}, wantErr: `Dockerfile line 7: COPY source "../ctx/app.py" is outside the build context`},
		{args: []string{"outside/secret", "/x"}, wantErr: `Dockerfile line 7: COPY source "outside/secret" leads outside the build context`},
		{args: []string{"abs", "/x"}, wantErr: `Dockerfile line 7: COPY source "abs": symlink abs points outside the build context (/etc/passwd)`},
		{args: []string{"loop", "/x"}, wantErr: `Dockerfile line 7: COPY source "loop": too many levels of symbolic links`},
		{args: []string{"src/[", "/x"}, wantErr: `Dockerfile line 7: COPY source "src/[": bad pattern`},
		{args: []string{"https://example.com/x", "/x"}, wantErr: "Dockerfile line 7: COPY source https://example.com/x is a URL, which is not supported"},
	} {
		got, err := Sources(dir, copyIns(tc.args...))
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("Sources(%q) = %q, %v; want error %q", tc.args, got, err, tc.wantErr)
			}
			var e *Error
			if err != nil && (!errors.As(err, &e) || e.Line != 7) {
				t.Errorf("Sources(%q) error %v does not name line 7", tc.args, err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Sources(%q) = %q, %v\n want %q", tc.args, got, err, tc.want)
		}
	}
}

func TestSourcesRefusesParentFromParse(t *testing.T) {
	dir := makeContext(t)
	df := mustParse(t, "FROM alpine\n\nCOPY ../secret /x\n", nil)
	ins := df.Instructions[1]
	for name, f := range map[string]func() error{
		"Sources":       func() error { _, err := Sources(dir, ins); return err },
		"ContextDigest": func() error { _, err := ContextDigest(dir, ins); return err },
		"Resolve":       func() error { _, err := Resolve(dir, ins); return err },
	} {
		err := f()
		if err == nil || err.Error() != `Dockerfile line 3: COPY source "../secret" is outside the build context` {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func TestResolve(t *testing.T) {
	dir := makeContext(t)
	got, err := Resolve(dir, &Instruction{Line: 2, Cmd: "ADD", Args: []string{"linkdir/pkg", "app.*", "nomatch*", "/dst/"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []Source{
		{Arg: "linkdir/pkg", Path: "src/pkg", Dir: true, Entries: []string{"src/pkg", "src/pkg/__init__.py"}},
		{Arg: "app.*", Path: "app.py", Entries: []string{"app.py"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Resolve = %+v\nwant %+v", got, want)
	}
	for _, ins := range []*Instruction{{Line: 4, Cmd: "RUN", Args: []string{"x"}}, {Line: 4, Cmd: "COPY", Args: []string{"x"}}} {
		if _, err := Resolve(dir, ins); err == nil || !strings.HasPrefix(err.Error(), "Dockerfile line 4: ") {
			t.Errorf("Resolve(%s) err = %v", render(ins), err)
		}
	}
	if _, err := Resolve(filepath.Join(dir, "nope"), copyIns(".", "/")); err == nil {
		t.Error("Resolve of a missing context succeeded")
	}
}

func TestIgnore(t *testing.T) {
	for _, tc := range []struct {
		patterns string
		path     string
		excluded bool
	}{
		{"*.log", "a.log", true},
		{"*.log", "sub/a.log", false},
		{"**/*.log", "sub/deep/a.log", true},
		{"**/*.log", "a.log", true},
		{"node_modules", "node_modules/x/y.js", true},
		{"node_modules", "src/node_modules", false},
		{"**/node_modules", "src/node_modules/a", true},
		{"/abs/path", "abs/path", true},
		{"./rel/", "rel/file", true},
		{"a/**/b", "a/b", true},
		{"a/**/b", "a/x/y/b", true},
		{"a/**", "a/x/y", true},
		{"a/**", "a", false},
		{"file?.txt", "file1.txt", true},
		{"file?.txt", "file10.txt", false},
		{"[ab].txt", "b.txt", true},
		{"[^ab].txt", "b.txt", false},
		{"[!ab].txt", "c.txt", true},
		{`\*.txt`, "*.txt", true},
		{`\*.txt`, "a.txt", false},
		{"  spaced.txt  ", "spaced.txt", true},
		{"# comment.txt", "# comment.txt", false},
		{"*\n!keep.txt", "keep.txt", false},
		{"*\n!keep.txt", "other.txt", true},
		{"!keep.txt\n*", "keep.txt", true},
		{"docs\n!docs/keep.md", "docs/keep.md", false},
		{"docs\n!docs/keep.md", "docs/drop.md", true},
		{"docs\n!docs/keep.md", "docs", true},
		{"dir/*\n!dir/sub\ndir/sub/x", "dir/sub/x", true},
		{"dir/*\n!dir/sub\ndir/sub/x", "dir/sub/y", false},
		{"*.md\n!README*.md", "README-dev.md", false},
		{"Dockerfile", "Dockerfile", true},
	} {
		ig, err := parseIgnore(strings.NewReader(tc.patterns))
		if err != nil {
			t.Errorf("%q: %v", tc.patterns, err)
			continue
		}
		if got := ig.excluded(tc.path); got != tc.excluded {
			t.Errorf("patterns %q: excluded(%q) = %v, want %v", tc.patterns, tc.path, got, tc.excluded)
		}
	}
	if _, err := parseIgnore(strings.NewReader("ok\n\n[unterminated\n")); err == nil || err.Error() != `.dockerignore line 3: bad pattern "[unterminated"` {
		t.Errorf("err = %v", err)
	}
}

func TestIgnoreMayInclude(t *testing.T) {
	ig, err := parseIgnore(strings.NewReader("node_modules\ndocs\n!docs/keep/**\n"))
	if err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]bool{"node_modules": false, "docs": true, "docs/keep": true, "docs/other": false, "doc": false} {
		if got := ig.mayInclude(dir); got != want {
			t.Errorf("mayInclude(%q) = %v, want %v", dir, got, want)
		}
	}
}

func TestContextDigest(t *testing.T) {
	dir := makeContext(t)
	all := copyIns(".", "/app")
	one := copyIns("app.py", "/app/")
	digest := func(ins *Instruction) string {
		t.Helper()
		d, err := ContextDigest(dir, ins)
		if err != nil {
			t.Fatal(err)
		}
		if len(d) != 64 {
			t.Fatalf("digest %q is not sha256 hex", d)
		}
		return d
	}
	base, baseOne := digest(all), digest(one)
	write := func(name, body string) { must(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644)) }
	p := func(name string) string { return filepath.Join(dir, name) }

	for _, tc := range []struct {
		name    string
		change  func()
		undo    func()
		changed bool // the digest of COPY . differs
		oneToo  bool // the digest of COPY app.py differs
	}{
		{"nothing", func() {}, func() {}, false, false},
		{"content", func() { write("app.py", "print('bye')\n") }, func() { write("app.py", "print('hi')\n") }, true, true},
		{"same size content", func() { write("src/run.sh", "#!/bin/bash") }, func() { write("src/run.sh", "#!/bin/sh\n") }, true, false},
		{"mode", func() { must(t, os.Chmod(p("src/run.sh"), 0o644)) }, func() { must(t, os.Chmod(p("src/run.sh"), 0o755)) }, true, false},
		{"directory mode", func() { must(t, os.Chmod(p("src/empty"), 0o700)) }, func() { must(t, os.Chmod(p("src/empty"), 0o755)) }, true, false},
		{"new file", func() { write("src/new.py", "") }, func() { must(t, os.Remove(p("src/new.py"))) }, true, false},
		{"rename", func() { must(t, os.Rename(p("requirements.txt"), p("reqs.txt"))) }, func() { must(t, os.Rename(p("reqs.txt"), p("requirements.txt"))) }, true, false},
		{"symlink target", func() { must(t, os.Remove(p("src/link"))); must(t, os.Symlink("run.sh", p("src/link"))) },
			func() { must(t, os.Remove(p("src/link"))); must(t, os.Symlink("pkg", p("src/link"))) }, true, false},
		{"ignored file", func() { write("debug.log", "more log") }, func() { write("debug.log", "log\n") }, false, false},
		{"new ignored file", func() { write("node_modules/x/more.js", "js") }, func() { must(t, os.Remove(p("node_modules/x/more.js"))) }, false, false},
		{"ignored directory", func() { write("src/pkg/__pycache__/z.pyc", "") }, func() { must(t, os.Remove(p("src/pkg/__pycache__/z.pyc"))) }, false, false},
		{"mtime", func() { must(t, os.Chtimes(p("app.py"), time.Unix(1, 0), time.Unix(1, 0))) }, func() {}, false, false},
		{"file outside the context", func() { must(t, os.WriteFile(filepath.Join(dir, "../secret"), []byte("x"), 0o644)) }, func() {}, false, false},
		{".dockerignore", func() { write(".dockerignore", testIgnore+"!debug.log\n") }, func() { write(".dockerignore", testIgnore) }, true, false},
	} {
		tc.change()
		if got := digest(all) != base; got != tc.changed {
			t.Errorf("%s: COPY . digest changed = %v, want %v", tc.name, got, tc.changed)
		}
		if got := digest(one) != baseOne; got != tc.oneToo {
			t.Errorf("%s: COPY app.py digest changed = %v, want %v", tc.name, got, tc.oneToo)
		}
		tc.undo()
		if digest(all) != base || digest(one) != baseOne {
			t.Errorf("%s: digest did not come back after undoing", tc.name)
		}
	}
	if digest(copyIns("app.py", "requirements.txt", "/app/")) == digest(copyIns("requirements.txt", "/app/")) {
		t.Error("different sources, same digest")
	}
	if digest(copyIns("app.py", "/a")) != digest(copyIns("./app.py", "/b")) {
		t.Error("the destination is the cache key's business, not the context digest's")
	}
}
