package build

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Source is what one source of a COPY or ADD matched in the build context.
type Source struct {
	Arg  string // the source as written in the instruction (after substitution)
	Path string // the match, relative to the context, symlinks resolved; "." is the context itself
	Dir  bool   // Path is a directory, whose contents are copied
	// Entries are the paths, relative to the context, to send: Path, then
	// for a directory everything beneath it that .dockerignore leaves,
	// parents before children, names in byte order. Entries are regular
	// files, directories and symlinks (sent as symlinks, never followed);
	// other kinds of file are left out. Beneath Path, a directory that
	// .dockerignore excludes but whose contents it partly re-includes
	// (!pattern) is left out while those contents are listed; the receiver
	// creates such parents as needed.
	Entries []string
}

// Resolve matches the sources of a COPY or ADD against the build context
// dir: a source is a path relative to the context (a leading / names the
// context's root) or a path.Match-style glob; symlinks on the way to a match
// are followed as long as they stay inside the context (one that leads out
// is an error), and .dockerignore
// in dir applies. A source that names a missing or excluded file is an
// error, a glob that matches nothing is not, unless no source matches
// anything. Errors about the instruction are *Error naming its line.
func Resolve(dir string, ins *Instruction) ([]Source, error) {
	c, err := openContext(dir, ins)
	if err != nil {
		return nil, err
	}
	defer c.root.Close()
	return c.resolveAll()
}

// Sources resolves a COPY's or ADD's sources to the paths to send, relative
// to dir, in order and each once: the Entries of Resolve, concatenated.
func Sources(dir string, ins *Instruction) ([]string, error) {
	srcs, err := Resolve(dir, ins)
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, s := range srcs {
		for _, e := range s.Entries {
			if !seen[e] {
				seen[e] = true
				out = append(out, e)
			}
		}
	}
	return out, nil
}

// ContextDigest hashes what a COPY or ADD takes from the context dir (see
// Resolve): the matches, and for every entry its name, type and mode, and
// the size and contents of a file or the target of a symlink. Times and
// owners do not take part. The result is a sha256 in hex.
func ContextDigest(dir string, ins *Instruction) (string, error) {
	c, err := openContext(dir, ins)
	if err != nil {
		return "", err
	}
	defer c.root.Close()
	srcs, err := c.resolveAll()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	put(h, "den build context v1")
	for _, s := range srcs {
		put(h, "source")
		put(h, s.Path)
		put(h, strconv.FormatBool(s.Dir))
		for _, e := range s.Entries {
			fi, err := c.root.Lstat(e)
			if err != nil {
				return "", err
			}
			put(h, e)
			put(h, strconv.FormatUint(uint64(fi.Mode()), 8))
			switch {
			case fi.Mode().IsRegular():
				put(h, strconv.FormatInt(fi.Size(), 10))
				sum, err := c.fileSum(e)
				if err != nil {
					return "", err
				}
				put(h, sum)
			case fi.Mode()&fs.ModeSymlink != 0:
				target, err := c.root.Readlink(e)
				if err != nil {
					return "", err
				}
				put(h, target)
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

type buildContext struct {
	ins    *Instruction
	root   *os.Root
	dirs   []string // the context's absolute path, and with symlinks resolved
	ignore *ignorer
}

// maxHops bounds the symlinks followed to resolve one path.
const maxHops = 40

func openContext(dir string, ins *Instruction) (*buildContext, error) {
	if ins == nil {
		return nil, errors.New("no instruction")
	}
	if ins.Cmd != "COPY" && ins.Cmd != "ADD" {
		return nil, errorf(ins.Line, "%s takes nothing from the build context", ins.Cmd)
	}
	if len(ins.Args) < 2 {
		return nil, errorf(ins.Line, "%s requires at least two arguments: source(s) and destination", ins.Cmd)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	c := &buildContext{ins: ins, dirs: []string{abs}}
	if real, err := filepath.EvalSymlinks(abs); err == nil && real != abs {
		c.dirs = append(c.dirs, real)
	}
	if c.root, err = os.OpenRoot(abs); err != nil {
		return nil, fmt.Errorf("build context: %w", err)
	}
	if c.ignore, err = readIgnore(c.root); err != nil {
		c.root.Close()
		return nil, err
	}
	return c, nil
}

func (c *buildContext) errorf(format string, a ...any) error {
	return errorf(c.ins.Line, "%s %s", c.ins.Cmd, fmt.Sprintf(format, a...))
}

func (c *buildContext) resolveAll() ([]Source, error) {
	var out []Source
	for _, arg := range c.ins.Args[:len(c.ins.Args)-1] {
		if isURL(arg) {
			return nil, c.errorf("source %s is a URL, which is not supported", arg)
		}
		rel, err := c.clean(arg)
		if err != nil {
			return nil, err
		}
		glob := hasMeta(rel)
		matches, err := c.glob(arg, rel)
		if err != nil {
			return nil, err
		}
		n := 0
		for _, m := range matches {
			s := Source{Arg: arg, Path: m.path, Dir: m.info.IsDir()}
			excluded := c.ignore.excluded(m.path)
			switch {
			case s.Dir:
				if !excluded {
					s.Entries = append(s.Entries, m.path)
				}
				if err := c.walk(m.path, &s.Entries); err != nil {
					return nil, err
				}
				if excluded && len(s.Entries) == 0 {
					continue
				}
				if excluded {
					s.Entries = append([]string{m.path}, s.Entries...)
				}
			case excluded || !sendable(m.info.Mode()):
				continue
			default:
				s.Entries = []string{m.path}
			}
			out = append(out, s)
			n++
		}
		if n == 0 && !glob {
			return nil, c.errorf("source %q: not found in the build context (or excluded by .dockerignore)", arg)
		}
	}
	if len(out) == 0 {
		return nil, c.errorf("sources match no files in the build context (or all are excluded by .dockerignore)")
	}
	return out, nil
}

func sendable(m fs.FileMode) bool {
	return m.IsRegular() || m.IsDir() || m&fs.ModeSymlink != 0
}

// clean makes a source relative to the context, refusing one that leaves it.
func (c *buildContext) clean(src string) (string, error) {
	if strings.HasPrefix(src, "/") {
		if rel := strings.TrimPrefix(path.Clean(src), "/"); rel != "" {
			return rel, nil
		}
		return ".", nil
	}
	rel := path.Clean(src)
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", c.errorf("source %q is outside the build context", src)
	}
	return rel, nil
}

func hasMeta(p string) bool { return strings.ContainsAny(p, `*?[\`) }

type match struct {
	path string
	info fs.FileInfo
}

// glob expands rel segment by segment over the real directory tree.
func (c *buildContext) glob(arg, rel string) ([]match, error) {
	cur := []match{{path: "."}}
	var segs []string
	if rel != "." {
		segs = strings.Split(rel, "/")
	}
	for i, seg := range segs {
		if _, err := path.Match(seg, ""); err != nil {
			return nil, c.errorf("source %q: bad pattern", arg)
		}
		var next []match
		seen := map[string]bool{}
		add := func(p string) error {
			real, fi, err := c.resolve(arg, p)
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			if i < len(segs)-1 && !fi.IsDir() {
				return nil
			}
			if !seen[real] {
				seen[real] = true
				next = append(next, match{real, fi})
			}
			return nil
		}
		for _, base := range cur {
			if !hasMeta(seg) {
				if err := add(path.Join(base.path, seg)); err != nil {
					return nil, err
				}
				continue
			}
			names, err := c.readDir(base.path)
			if err != nil {
				return nil, err
			}
			for _, e := range names {
				if ok, _ := path.Match(seg, e.Name()); ok {
					if err := add(path.Join(base.path, e.Name())); err != nil {
						return nil, err
					}
				}
			}
		}
		cur = next
	}
	if len(segs) == 0 {
		fi, err := c.root.Lstat(".")
		if err != nil {
			return nil, err
		}
		cur[0].info = fi
	}
	return cur, nil
}

// resolve follows the symlinks of rel, staying inside the context, and
// returns the real path (relative) and what it is. Errors name the source
// arg.
func (c *buildContext) resolve(arg, rel string) (string, fs.FileInfo, error) {
	todo := strings.Split(rel, "/")
	var done []string
	hops := 0
	for len(todo) > 0 {
		seg := todo[0]
		todo = todo[1:]
		switch seg {
		case "", ".":
			continue
		case "..":
			if len(done) == 0 {
				return "", nil, c.errorf("source %q leads outside the build context", arg)
			}
			done = done[:len(done)-1]
			continue
		}
		p := strings.Join(append(done, seg), "/")
		fi, err := c.root.Lstat(p)
		if err != nil {
			return "", nil, fs.ErrNotExist
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			done = append(done, seg)
			continue
		}
		if hops++; hops > maxHops {
			return "", nil, c.errorf("source %q: too many levels of symbolic links", arg)
		}
		target, err := c.root.Readlink(p)
		if err != nil {
			return "", nil, err
		}
		if path.IsAbs(target) {
			inside := false
			for _, d := range c.dirs {
				d = filepath.ToSlash(d)
				if r, ok := strings.CutPrefix(path.Clean(target), d); ok && (r == "" || strings.HasPrefix(r, "/")) {
					target, inside = r, true
					break
				}
			}
			if !inside {
				return "", nil, c.errorf("source %q: symlink %s points outside the build context (%s)", arg, p, target)
			}
			done = nil
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	real := strings.Join(done, "/")
	if real == "" {
		real = "."
	}
	fi, err := c.root.Lstat(real)
	if err != nil {
		return "", nil, fs.ErrNotExist
	}
	return real, fi, nil
}

func (c *buildContext) readDir(rel string) ([]fs.DirEntry, error) {
	f, err := c.root.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	return entries, nil
}

// walk appends what dir holds, depth first, that .dockerignore leaves.
func (c *buildContext) walk(dir string, out *[]string) error {
	entries, err := c.readDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := path.Join(dir, e.Name())
		excluded := c.ignore.excluded(p)
		if e.IsDir() {
			if excluded && !c.ignore.mayInclude(p) {
				continue
			}
			if !excluded {
				*out = append(*out, p)
			}
			if err := c.walk(p, out); err != nil {
				return err
			}
			continue
		}
		if !excluded && sendable(e.Type()) {
			*out = append(*out, p)
		}
	}
	return nil
}

func (c *buildContext) fileSum(rel string) (string, error) {
	f, err := c.root.Open(rel)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ignorer holds the patterns of a .dockerignore.
type ignorer struct {
	rules []ignoreRule
}

type ignoreRule struct {
	re      *regexp.Regexp
	negate  bool   // !pattern: re-include
	literal string // the pattern up to its first special character
}

// readIgnore reads .dockerignore at the context's root, if there is one.
func readIgnore(root *os.Root) (*ignorer, error) {
	f, err := root.Open(".dockerignore")
	if errors.Is(err, fs.ErrNotExist) {
		return &ignorer{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseIgnore(f)
}

func parseIgnore(r io.Reader) (*ignorer, error) {
	ig := &ignorer{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if n == 1 {
			line = strings.TrimPrefix(line, "\uFEFF")
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		neg := strings.HasPrefix(line, "!")
		if neg {
			line = strings.TrimSpace(line[1:])
		}
		line = path.Clean(line)
		if len(line) > 1 && line[0] == '/' {
			line = line[1:]
		}
		re, err := compileIgnore(line)
		if err != nil {
			return nil, fmt.Errorf(".dockerignore line %d: bad pattern %q", n, line)
		}
		lit := line
		if i := strings.IndexAny(line, `*?[\`); i >= 0 {
			lit = line[:i]
		}
		ig.rules = append(ig.rules, ignoreRule{re: re, negate: neg, literal: lit})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	return ig, nil
}

// compileIgnore turns a .dockerignore pattern into a regular expression:
// * and ? match within a path segment, ** any number of segments (none
// included), [...] a class, \ quotes the next character.
func compileIgnore(p string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	rs := []rune(p)
	for i := 0; i < len(rs); i++ {
		switch c := rs[i]; c {
		case '*':
			if i+1 < len(rs) && rs[i+1] == '*' {
				i++
				if i+1 < len(rs) && rs[i+1] == '/' {
					i++
				}
				if i+1 == len(rs) {
					b.WriteString(".*")
				} else {
					b.WriteString("(.*/)?")
				}
			} else {
				b.WriteString("[^/]*")
			}
		case '?':
			b.WriteString("[^/]")
		case '\\':
			if i+1 < len(rs) {
				i++
				b.WriteString(regexp.QuoteMeta(string(rs[i])))
			} else {
				b.WriteString(`\\`)
			}
		case '[':
			j := i + 1
			if j < len(rs) && (rs[j] == '^' || rs[j] == '!') {
				j++
			}
			if j < len(rs) && rs[j] == ']' {
				j++
			}
			for j < len(rs) && rs[j] != ']' {
				if rs[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(rs) {
				return nil, errors.New("unterminated [")
			}
			b.WriteByte('[')
			k := i + 1
			if rs[k] == '^' || rs[k] == '!' {
				b.WriteByte('^')
				k++
			}
			for ; k < j; k++ {
				if rs[k] == '\\' {
					k++
				}
				if rs[k] == '/' {
					return nil, errors.New("/ in a character class")
				}
				b.WriteString(regexp.QuoteMeta(string(rs[k])))
			}
			b.WriteByte(']')
			i = j
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// excluded says whether .dockerignore leaves rel out: the last pattern
// that matches rel or one of its parent directories decides.
func (ig *ignorer) excluded(rel string) bool {
	if rel == "." {
		return false
	}
	for i := len(ig.rules) - 1; i >= 0; i-- {
		r := ig.rules[i]
		if r.matches(rel) {
			return !r.negate
		}
	}
	return false
}

func (r ignoreRule) matches(rel string) bool {
	if r.re.MatchString(rel) {
		return true
	}
	for i := 0; i < len(rel); i++ {
		if rel[i] == '/' && r.re.MatchString(rel[:i]) {
			return true
		}
	}
	return false
}

// mayInclude says whether some !pattern could re-include a path beneath the
// excluded directory dir, so that the walk must go into it.
func (ig *ignorer) mayInclude(dir string) bool {
	d := dir + "/"
	for _, r := range ig.rules {
		if r.negate && (strings.HasPrefix(r.literal, d) || strings.HasPrefix(d, r.literal)) {
			return true
		}
	}
	return false
}
