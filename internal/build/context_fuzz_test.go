package build

import (
	"errors"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzDockerignore checks .dockerignore matching: a parse error names its
// line; a path is excluded whenever a directory above it is excluded and
// no !pattern may re-include anything beneath that directory (the context
// walk skips such a directory without looking in, so that must agree with
// matching each path); and a pattern without special characters excludes
// exactly itself and what is beneath it.
func FuzzDockerignore(f *testing.F) {
	for _, s := range [][2]string{
		{testIgnore, "docs/keep.md"}, {testIgnore, "src/pkg/__pycache__/y/deep.pyc"}, {"docs\n!docs/keep.md\n", "docs/sub/keep.md"},
		{"**\n!a/**/b\n", "a/x/b/c"}, {"a/*\n!a/b*\n", "a/bc/d"}, {"[a-c]?\n", "b1/x"}, {"\\*x\n", "*x/y"}, {"a[\n", "a"},
		{"!x\n*\n", "x"}, {"/abs/../dir\n", "dir/f"}, {"\uFEFFz\n", "z"}, {"# c\n  \n !  y \n", "y"}, {"a/**\n!a/b/c\n", "a/b/c/d"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, ignore, rel string) {
		ig, err := parseIgnore(strings.NewReader(ignore))
		if err != nil {
			if !strings.Contains(err.Error(), ".dockerignore") {
				t.Fatalf("error %q does not say it is about .dockerignore", err)
			}
			return
		}
		rel = path.Clean(strings.TrimLeft(rel, "/"))
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return
		}
		parts := strings.Split(rel, "/")
		for i := 1; i < len(parts); i++ {
			dir := strings.Join(parts[:i], "/")
			if ig.excluded(dir) && !ig.mayInclude(dir) && !ig.excluded(rel) {
				t.Fatalf(".dockerignore %q: %q is excluded and its walk skipped, but %q beneath it is not excluded", ignore, dir, rel)
			}
		}
		if lit, lerr := parseIgnore(strings.NewReader(rel)); lerr == nil && !strings.ContainsAny(rel, "*?[\\!#\n\r\uFEFF") && rel != "." && strings.TrimSpace(rel) == rel {
			if !lit.excluded(rel) || !lit.excluded(rel+"/x") {
				t.Fatalf("the literal pattern %q does not exclude itself or what is beneath it", rel)
			}
			if lit.excluded(rel+"x") || (len(parts) > 1 && lit.excluded(parts[0])) {
				t.Fatalf("the literal pattern %q excludes a sibling or a parent", rel)
			}
		}
	})
}

// FuzzContextSources resolves arbitrary COPY sources against a build
// context (with symlinks inside, out of and looping, and a secret beside
// it) under an arbitrary .dockerignore, and checks what would be sent:
// only clean relative paths that exist inside the context, never what
// .dockerignore excludes, never the file beside the context; and a refusal
// is an *Error naming the instruction's line.
func FuzzContextSources(f *testing.F) {
	dir := makeContext(f)
	for _, s := range [][2]string{
		{".", testIgnore}, {"src/*", testIgnore}, {"linkdir/pkg", ""}, {"outside/secret", ""}, {"abs", ""}, {"loop", ""},
		{"../secret", ""}, {"docs", "docs\n!docs/keep.md\n"}, {"src/link/", "src/pkg\n"}, {"*", "**\n!src/**/*.py\n"}, {"/", "*\n"},
		{"src/[", ""}, {"abs_in", "app.py\n"}, {"sub/../../ctx/app.py", ""},
	} {
		f.Add(s[0], s[1])
	}
	ctxReal, err := filepath.EvalSymlinks(dir)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, src, ignore string) {
		if err := os.WriteFile(filepath.Join(dir, ".dockerignore"), []byte(ignore), 0o644); err != nil {
			t.Fatal(err)
		}
		srcs, err := Resolve(dir, copyIns(src, "/dst/"))
		if err != nil {
			var e *Error
			if !errors.As(err, &e) && !strings.Contains(err.Error(), ".dockerignore") {
				t.Fatalf("Sources(%q): %v (%T) is neither an *Error nor about .dockerignore", src, err, err)
			}
			if e != nil && e.Line != 7 {
				t.Fatalf("Sources(%q): %v names line %d, not 7", src, err, e.Line)
			}
			return
		}
		ig, err := parseIgnore(strings.NewReader(ignore))
		if err != nil {
			t.Fatalf("Sources(%q) succeeded with a .dockerignore it cannot parse: %v", src, err)
		}
		for _, s := range srcs {
			for _, e := range s.Entries {
				checkSent(t, dir, ctxReal, src, ignore, ig, s, e)
			}
		}
	})
}

// checkSent checks one entry e of source s that Resolve would send.
func checkSent(t *testing.T, dir, ctxReal, src, ignore string, ig *ignorer, s Source, e string) {
	if e != path.Clean(e) || path.IsAbs(e) || e == ".." || strings.HasPrefix(e, "../") {
		t.Fatalf("Sources(%q) sends %q: not a clean relative path", src, e)
	}
	// A directory named as the source is sent though excluded
	// when a !pattern re-includes some of its contents.
	if ig.excluded(e) && !(e == s.Path && s.Dir && ig.mayInclude(e)) {
		t.Fatalf("Sources(%q) with .dockerignore %q sends the excluded %q", src, ignore, e)
	}
	p := filepath.Join(dir, e)
	if e == "." {
		return
	}
	if _, err := os.Lstat(p); err != nil {
		t.Fatalf("Sources(%q) sends %q, which is not in the context: %v", src, e, err)
	}
	real, err := filepath.EvalSymlinks(filepath.Dir(p))
	if err != nil || (real != ctxReal && !strings.HasPrefix(real, ctxReal+string(filepath.Separator))) {
		t.Fatalf("Sources(%q) sends %q, whose directory is %q, outside the context %q", src, e, real, ctxReal)
	}
}
