package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/den-dev/den/api"
	"golang.org/x/sys/unix"
)

// Search (glob and grep) walks the sandbox's own tree, as the agent sees it,
// so it works on every tier whatever tools the image has, and every path
// stays inside the sandbox: the walk never follows symlinks, files are
// opened without following a final symlink or a magic link, and patterns
// with ".." are refused. Output is bounded by a match limit and by the
// number of entries walked (api.SearchMaxVisit).

// grepMaxBytes is api.GrepMaxBytes, a variable for tests.
var grepMaxBytes int64 = api.GrepMaxBytes

// searchRoutes adds the search routes to the agent's mux.
func (a *Agent) searchRoutes(mux router) {
	mux.HandleFunc("GET "+PathGlob, a.handleGlob)
	mux.HandleFunc("GET "+PathGrep, a.handleGrep)
}

// skipUnderRoot are pseudo file systems a walk from above them leaves out.
var skipUnderRoot = map[string]bool{"/proc": true, "/sys": true, "/dev": true}

// searchLimit parses ?limit= (default api.SearchDefaultLimit).
func searchLimit(q map[string][]string) (int, error) {
	v := first(q["limit"])
	if v == "" {
		return api.SearchDefaultLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > api.SearchMaxLimit {
		return 0, api.FieldError("limit", "%q is not a number from 1 to %d", v, api.SearchMaxLimit)
	}
	return n, nil
}

// globPattern splits a glob pattern into segments, checking each one.
// "**" as a whole segment matches any number of directories.
func globPattern(field, p string) ([]string, error) {
	if p == "" {
		return nil, api.FieldError(field, "missing: give a pattern like **/*.go")
	}
	if len(p) > 1024 || strings.IndexByte(p, 0) >= 0 {
		return nil, api.FieldError(field, "longer than 1024 bytes or contains a NUL byte")
	}
	var segs []string
	for _, s := range strings.Split(strings.Trim(p, "/"), "/") {
		switch {
		case s == "" || s == ".":
			continue
		case s == "..":
			return nil, api.FieldError(field, "%q: .. is not allowed in a pattern (set path to search elsewhere)", p)
		case s != "**":
			if _, err := path.Match(s, ""); err != nil {
				return nil, api.FieldError(field, "%q: bad pattern segment %q", p, s)
			}
		}
		segs = append(segs, s)
	}
	if len(segs) == 0 {
		return nil, api.FieldError(field, "%q matches nothing: give a pattern like **/*.go", p)
	}
	return segs, nil
}

// globMatch reports whether the path segments match the pattern segments.
func globMatch(pat, segs []string) bool {
	if len(pat) == 0 {
		return len(segs) == 0
	}
	if pat[0] == "**" {
		for i := 0; i <= len(segs); i++ {
			if globMatch(pat[1:], segs[i:]) {
				return true
			}
		}
		return false
	}
	if len(segs) == 0 {
		return false
	}
	ok, _ := path.Match(pat[0], segs[0])
	return ok && globMatch(pat[1:], segs[1:])
}

// globPrefix reports whether a directory at segs can hold matches.
func globPrefix(pat, segs []string) bool {
	for i, s := range segs {
		if i >= len(pat) {
			return false
		}
		if pat[i] == "**" {
			return true
		}
		if ok, _ := path.Match(pat[i], s); !ok {
			return false
		}
	}
	return true
}

// literalPrefix moves the pattern's leading segments without wildcards
// onto the root, so the walk starts as deep as it can.
func literalPrefix(root string, pat []string) (string, []string) {
	for len(pat) > 1 && !strings.ContainsAny(pat[0], `*?[\`) {
		root, pat = path.Join(root, pat[0]), pat[1:]
	}
	return root, pat
}

// walk visits the tree at root without following symlinks, giving fn each
// entry's path and its segments relative to root. fn returns fs.SkipDir to
// prune a directory and fs.SkipAll to stop. It reports whether the walk
// stopped at api.SearchMaxVisit.
func walk(ctx context.Context, root string, fn func(p string, rel []string, d fs.DirEntry) error) (bool, error) {
	if _, err := statFile(root); err != nil {
		return false, err
	}
	visited, full := 0, false
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return fileError(err)
			}
			return nil // unreadable: left out
		}
		if visited++; visited > api.SearchMaxVisit {
			full = true
			return fs.SkipAll
		}
		if visited%256 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if p != root && skipUnderRoot[p] {
			return fs.SkipDir
		}
		var rel []string
		if p != root {
			rel = strings.Split(strings.TrimPrefix(strings.TrimPrefix(p, root), "/"), "/")
		}
		return fn(p, rel, d)
	})
	return full, err
}

func (a *Agent) handleGlob(w http.ResponseWriter, r *http.Request) {
	res, err := glob(r.Context(), r.URL.Query())
	if err != nil {
		WriteError(w, err)
		return
	}
	writeJSON(w, 200, res)
}

// searchRoot reads ?path= (default /).
func searchRoot(q map[string][]string) (string, error) {
	p := "/"
	if v := q["path"]; len(v) > 0 && v[0] != "" {
		p = v[0]
	}
	return cleanPath(p)
}

func glob(ctx context.Context, q map[string][]string) (*api.GlobResult, error) {
	limit, err := searchLimit(q)
	if err != nil {
		return nil, err
	}
	root, err := searchRoot(q)
	if err != nil {
		return nil, err
	}
	pat, err := globPattern("pattern", first(q["pattern"]))
	if err != nil {
		return nil, err
	}
	root, pat = literalPrefix(root, pat)
	res := &api.GlobResult{Matches: []string{}}
	full, err := walk(ctx, root, func(p string, rel []string, d fs.DirEntry) error {
		if rel == nil {
			return nil
		}
		if globMatch(pat, rel) {
			if len(res.Matches) >= limit {
				res.Truncated = true
				return fs.SkipAll
			}
			res.Matches = append(res.Matches, p)
		}
		if d.IsDir() && !globPrefix(pat, rel) {
			return fs.SkipDir
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) || api.KindOf(err) == api.KindNotFound {
		return res, nil // nothing there, nothing matches
	}
	if err != nil {
		return nil, err
	}
	res.Truncated = res.Truncated || full
	return res, nil
}

func (a *Agent) handleGrep(w http.ResponseWriter, r *http.Request) {
	res, err := grep(r.Context(), r.URL.Query())
	if err != nil {
		WriteError(w, err)
		return
	}
	writeJSON(w, 200, res)
}

func grep(ctx context.Context, q map[string][]string) (*api.GrepResult, error) {
	limit, err := searchLimit(q)
	if err != nil {
		return nil, err
	}
	root, err := searchRoot(q)
	if err != nil {
		return nil, err
	}
	expr := first(q["pattern"])
	if expr == "" {
		return nil, api.FieldError("pattern", "missing: give a regular expression (RE2 syntax)")
	}
	if len(expr) > 4096 {
		return nil, api.FieldError("pattern", "longer than 4096 bytes")
	}
	ignoreCase := false
	if v := first(q["ignore_case"]); v != "" {
		if ignoreCase, err = strconv.ParseBool(v); err != nil {
			return nil, api.FieldError("ignore_case", "%q is not true or false", v)
		}
	}
	if ignoreCase {
		expr = "(?i)" + expr
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, api.FieldError("pattern", "%v", err)
	}
	var filter []string
	if g := first(q["glob"]); g != "" {
		if filter, err = globPattern("glob", g); err != nil {
			return nil, err
		}
	}
	res := &api.GrepResult{Matches: []api.GrepMatch{}}
	budget := grepMaxBytes
	full, err := walk(ctx, root, func(p string, rel []string, d fs.DirEntry) error {
		if !d.Type().IsRegular() {
			return nil
		}
		if filter != nil && rel != nil {
			// A one-segment filter matches the file's name anywhere.
			name := rel
			if len(filter) == 1 {
				name = rel[len(rel)-1:]
			}
			if !globMatch(filter, name) {
				return nil
			}
		}
		more, skipped := grepFile(p, re, res, limit, &budget)
		switch {
		case skipped && !more: // past the byte budget: not read
		case skipped:
			res.Skipped++
		default:
			res.Files++
		}
		if !more {
			res.Truncated = true
			return fs.SkipAll
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.Truncated = res.Truncated || full
	return res, nil
}

// grepFile adds the matching lines of the regular file p to res; it
// reports false once res holds limit matches or p would take more than
// the bytes left in budget (then p is not read), and whether p was skipped
// (unreadable, binary, too large, or no longer a regular file).
func grepFile(p string, re *regexp.Regexp, res *api.GrepResult, limit int, budget *int64) (more, skipped bool) {
	f, err := openFile(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return true, true
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() > api.GrepMaxFileSize {
		return true, true
	}
	if st.Size() > *budget {
		return false, true
	}
	*budget -= st.Size()
	b, err := io.ReadAll(io.LimitReader(f, api.GrepMaxFileSize+1))
	if err != nil || len(b) > api.GrepMaxFileSize || bytes.IndexByte(b[:min(len(b), 8000)], 0) >= 0 {
		return true, true
	}
	for n := 1; len(b) > 0; n++ {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if !re.Match(line) {
			continue
		}
		if len(res.Matches) >= limit {
			return false, false
		}
		res.Matches = append(res.Matches, api.GrepMatch{Path: p, Line: n, Text: cutLine(line)})
	}
	return true, false
}

// cutLine returns the line as text, cut to api.GrepMaxLineBytes at a rune
// boundary.
func cutLine(b []byte) string {
	b = bytes.TrimSuffix(b, []byte("\r"))
	if len(b) > api.GrepMaxLineBytes {
		b = b[:api.GrepMaxLineBytes]
		for len(b) > 0 && !utf8.Valid(b) {
			b = b[:len(b)-1]
		}
	}
	return string(b)
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
