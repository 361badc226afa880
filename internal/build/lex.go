package build

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// lexer performs the word processing Docker applies to the arguments of the
// instructions it expands (FROM, ADD, COPY, ENV, EXPOSE, LABEL, USER,
// WORKDIR, ARG): quote removal, escapes and $VAR / ${VAR...} substitution.
type lexer struct {
	escape rune
	lookup func(name string) (string, bool)
	// noQuotes leaves ' and " alone; used for the elements of a JSON array,
	// whose quoting JSON has already dealt with.
	noQuotes bool
}

// word expands s as a single word, keeping its whitespace.
func (lx *lexer) word(s string) (string, error) {
	sc := &scan{lx: lx, src: []rune(s)}
	out, _, err := sc.process(eof, false)
	return out, err
}

// words expands s and splits it into words at unquoted whitespace, including
// whitespace produced by unquoted substitutions.
func (lx *lexer) words(s string) ([]string, error) {
	sc := &scan{lx: lx, src: []rune(s)}
	_, ws, err := sc.process(eof, false)
	return ws, err
}

const eof rune = -1

type scan struct {
	lx  *lexer
	src []rune
	pos int
}

func (s *scan) peek() rune {
	if s.pos >= len(s.src) {
		return eof
	}
	return s.src[s.pos]
}

func (s *scan) next() rune {
	r := s.peek()
	if r != eof {
		s.pos++
	}
	return r
}

// splitter accumulates words; runes added with raw never split a word.
type splitter struct {
	words []string
	cur   strings.Builder
}

func (w *splitter) raw(str string) { w.cur.WriteString(str) }

func (w *splitter) split(str string) {
	for _, r := range str {
		if unicode.IsSpace(r) {
			w.end()
		} else {
			w.cur.WriteRune(r)
		}
	}
}

func (w *splitter) end() {
	if w.cur.Len() > 0 {
		w.words = append(w.words, w.cur.String())
		w.cur.Reset()
	}
}

// process consumes runes up to stop (consumed, not returned) or the end of
// input when stop is eof. rawEscapes keeps escape characters in the result
// (for the patterns of ${VAR#pattern} and friends).
func (s *scan) process(stop rune, rawEscapes bool) (string, []string, error) {
	var out strings.Builder
	var ws splitter
	for {
		ch := s.peek()
		if ch == eof {
			if stop != eof {
				return "", nil, fmt.Errorf("unexpected end of statement while looking for matching %c", stop)
			}
			break
		}
		if stop != eof && ch == stop {
			s.next()
			ws.end()
			return out.String(), ws.words, nil
		}
		switch {
		case ch == '$':
			v, err := s.dollar()
			if err != nil {
				return "", nil, err
			}
			out.WriteString(v)
			ws.split(v)
		case !s.lx.noQuotes && ch == '\'':
			v, err := s.single()
			if err != nil {
				return "", nil, err
			}
			out.WriteString(v)
			ws.raw(v)
		case !s.lx.noQuotes && ch == '"':
			v, err := s.double()
			if err != nil {
				return "", nil, err
			}
			out.WriteString(v)
			ws.raw(v)
		default:
			s.next()
			if ch == s.lx.escape {
				if rawEscapes {
					out.WriteRune(ch)
					ws.raw(string(ch))
				}
				ch = s.next()
				if ch == eof { // an escape at the very end is dropped
					continue
				}
				out.WriteRune(ch)
				ws.raw(string(ch))
				continue
			}
			out.WriteRune(ch)
			ws.split(string(ch))
		}
	}
	ws.end()
	return out.String(), ws.words, nil
}

// single reads a '...' string: everything literal, no escapes.
func (s *scan) single() (string, error) {
	s.next()
	var b strings.Builder
	for {
		switch ch := s.next(); ch {
		case eof:
			return "", errors.New("unexpected end of statement while looking for matching single-quote")
		case '\'':
			return b.String(), nil
		default:
			b.WriteRune(ch)
		}
	}
}

// double reads a "..." string: $ substitutions apply, and the escape
// character escapes only ", $ and itself.
func (s *scan) double() (string, error) {
	s.next()
	var b strings.Builder
	for {
		switch s.peek() {
		case eof:
			return "", errors.New("unexpected end of statement while looking for matching double-quote")
		case '"':
			s.next()
			return b.String(), nil
		case '$':
			v, err := s.dollar()
			if err != nil {
				return "", err
			}
			b.WriteString(v)
		default:
			ch := s.next()
			if ch == s.lx.escape {
				switch s.peek() {
				case eof:
					continue
				case '"', '$', s.lx.escape:
					ch = s.next()
				}
			}
			b.WriteRune(ch)
		}
	}
}

var errMissingBrace = errors.New("syntax error: missing '}'")

func (s *scan) dollar() (string, error) {
	s.next() // $
	if s.peek() != '{' {
		name := s.name()
		if name == "" {
			return "$", nil
		}
		v, _ := s.lx.lookup(name)
		return v, nil
	}
	s.next() // {
	switch s.peek() {
	case eof:
		return "", errMissingBrace
	case '{', '}', ':':
		return "", errors.New("syntax error: bad substitution")
	}
	name := s.name()
	ch := s.next()
	switch ch {
	case '}':
		v, _ := s.lx.lookup(name)
		return v, nil
	case ':', '-', '+', '?', '#', '%':
		mod := string(ch)
		colon := ch == ':'
		if colon {
			ch = s.next()
			if ch != eof {
				mod += string(ch)
			}
		}
		word, _, err := s.process('}', ch == '#' || ch == '%')
		if err != nil {
			if s.peek() == eof {
				return "", errMissingBrace
			}
			return "", err
		}
		value, set := s.lx.lookup(name)
		switch ch {
		case '-':
			if !set || (colon && value == "") {
				return word, nil
			}
			return value, nil
		case '+':
			if !set || (colon && value == "") {
				return "", nil
			}
			return word, nil
		case '?':
			if !set || (colon && value == "") {
				msg := word
				if msg == "" {
					msg = "is not allowed to be unset"
					if set {
						msg = "is not allowed to be empty"
					}
				}
				return "", fmt.Errorf("%s: %s", name, msg)
			}
			return value, nil
		case '#', '%':
			longest := false
			if strings.HasPrefix(word, string(ch)) {
				longest = true
				word = word[1:]
			}
			toks, err := shellPattern(word)
			if err != nil {
				return "", err
			}
			return trimPattern(value, toks, ch == '#', longest), nil
		default:
			return "", fmt.Errorf("unsupported modifier (%s) in substitution", mod)
		}
	case '/':
		all := false
		if s.peek() == '/' {
			s.next()
			all = true
		}
		pattern, _, err := s.process('/', true)
		if err != nil {
			if s.peek() == eof {
				return "", errors.New("syntax error: missing '/' in ${}")
			}
			return "", err
		}
		repl, _, err := s.process('}', false)
		if err != nil {
			if s.peek() == eof {
				return "", errMissingBrace
			}
			return "", err
		}
		value, _ := s.lx.lookup(name)
		if pattern == "" {
			return value, nil
		}
		toks, err := shellPattern(pattern)
		if err != nil {
			return "", err
		}
		re := patternRegexp(toks)
		if all {
			return re.ReplaceAllLiteralString(value, repl), nil
		}
		if loc := re.FindStringIndex(value); loc != nil {
			return value[:loc[0]] + repl + value[loc[1]:], nil
		}
		return value, nil
	case eof:
		return "", errMissingBrace
	default:
		return "", fmt.Errorf("unsupported modifier (%c) in substitution", ch)
	}
}

// name reads a variable name: letters, digits and _, or a run of digits, or
// one of the shell's special parameters (which are never set).
func (s *scan) name() string {
	var b strings.Builder
	ch := s.peek()
	switch {
	case ch != eof && unicode.IsDigit(ch):
		for ch = s.peek(); ch != eof && unicode.IsDigit(ch); ch = s.peek() {
			b.WriteRune(s.next())
		}
		return b.String()
	case strings.ContainsRune("@*#?-$!0", ch):
		return string(s.next())
	}
	for ch = s.peek(); ch != eof && (unicode.IsLetter(ch) || unicode.IsDigit(ch) || ch == '_'); ch = s.peek() {
		b.WriteRune(s.next())
	}
	return b.String()
}

// patTok is one element of a shell pattern: a literal rune, ? (any one
// character) or * (any string).
type patTok struct {
	kind rune // 'l', '?' or '*'
	r    rune
}

// shellPattern parses a shell pattern: * any string, ? any character, \
// quoting the next one; "\}" and "\/" stand for the character alone.
func shellPattern(p string) ([]patTok, error) {
	var toks []patTok
	rs := []rune(p)
	for i := 0; i < len(rs); i++ {
		switch c := rs[i]; c {
		case '*', '?':
			toks = append(toks, patTok{kind: c})
		case '\\':
			if i+1 < len(rs) && (rs[i+1] == '}' || rs[i+1] == '/') {
				continue
			}
			if i+1 >= len(rs) || !strings.ContainsRune(`*?\`, rs[i+1]) {
				return nil, fmt.Errorf("invalid pattern (%s) in substitution: bad escape", p)
			}
			i++
			toks = append(toks, patTok{kind: 'l', r: rs[i]})
		default:
			toks = append(toks, patTok{kind: 'l', r: c})
		}
	}
	return toks, nil
}

// patternRegexp is the (unanchored, greedy) regular expression of toks.
func patternRegexp(toks []patTok) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("(?s)")
	for _, t := range toks {
		switch t.kind {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		default:
			b.WriteString(regexp.QuoteMeta(string(t.r)))
		}
	}
	return regexp.MustCompile(b.String())
}

// prefixMatches reports, for each i, whether toks match v[:i] entirely,
// simulating the pattern's automaton over v in one pass.
func prefixMatches(toks []patTok, v []rune) []bool {
	res := make([]bool, len(v)+1)
	cur := make([]bool, len(toks)+1)
	next := make([]bool, len(toks)+1)
	closure := func(set []bool) {
		for j := 0; j < len(toks); j++ {
			if set[j] && toks[j].kind == '*' {
				set[j+1] = true
			}
		}
	}
	cur[0] = true
	closure(cur)
	res[0] = cur[len(toks)]
	for i, c := range v {
		clear(next)
		alive := false
		for j, t := range toks {
			if !cur[j] {
				continue
			}
			switch {
			case t.kind == '*':
				next[j] = true
			case t.kind == '?' || t.r == c:
				next[j+1] = true
			default:
				continue
			}
			alive = true
		}
		if !alive {
			break
		}
		closure(next)
		cur, next = next, cur
		res[i+1] = cur[len(toks)]
	}
	return res
}

// trimPattern removes from v the shortest (or, if longest, the longest)
// prefix (or, if !prefix, suffix) that the pattern matches entirely.
func trimPattern(v string, toks []patTok, prefix, longest bool) string {
	rs := []rune(v)
	if !prefix {
		// A suffix of v is a prefix of v reversed, matched by the
		// pattern reversed.
		rs = reversed(rs)
		toks = reversed(toks)
	}
	m := prefixMatches(toks, rs)
	cut := -1
	for i, ok := range m {
		if ok {
			cut = i
			if !longest {
				break
			}
		}
	}
	if cut < 0 {
		return v
	}
	if prefix {
		return string(rs[cut:])
	}
	return string(reversed(rs[cut:]))
}

func reversed[T any](s []T) []T {
	out := make([]T, len(s))
	for i, x := range s {
		out[len(s)-1-i] = x
	}
	return out
}
