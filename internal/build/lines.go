package build

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// logical is one instruction's text: continuation lines joined (without
// the escape characters), comment and empty lines inside it dropped.
type logical struct {
	line int // first physical line, 1-based
	text string
}

type directives struct {
	escape rune
	syntax string
}

var directiveRE = regexp.MustCompile(`^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$`)

// splitLogical splits src into logical lines after reading the parser
// directives at its top. It also returns the number of physical lines.
func splitLogical(src string) ([]logical, directives, int, error) {
	src = strings.TrimPrefix(src, "\uFEFF")
	phys := strings.Split(src, "\n")
	if strings.HasSuffix(src, "\n") {
		phys = phys[:len(phys)-1]
	}
	for i, l := range phys {
		phys[i] = strings.TrimSuffix(l, "\r")
	}
	d := directives{escape: '\\'}

	// Parser directives: "# name=value" lines at the very top. The first
	// line that is not one (a blank line, another comment, an instruction,
	// an unknown directive) ends them.
	seen := map[string]bool{}
	for i, l := range phys {
		m := directiveRE.FindStringSubmatch(strings.TrimLeftFunc(l, unicode.IsSpace))
		if m == nil {
			break
		}
		name := strings.ToLower(m[1])
		if name != "escape" && name != "syntax" && name != "check" {
			break
		}
		if seen[name] {
			return nil, d, 0, errorf(i+1, "only one %s parser directive can be used", name)
		}
		seen[name] = true
		switch name {
		case "escape":
			switch m[2] {
			case "\\":
				d.escape = '\\'
			case "`":
				d.escape = '`'
			default:
				return nil, d, 0, errorf(i+1, "invalid escape parser directive %q: must be ` or \\", m[2])
			}
		case "syntax":
			d.syntax = m[2]
		}
	}

	var out []logical
	for i := 0; i < len(phys); {
		start := i + 1
		first := strings.TrimLeftFunc(phys[i], unicode.IsSpace)
		i++
		if strings.HasPrefix(first, "#") {
			continue
		}
		piece, more := trimContinuation(first, d.escape)
		if !more && strings.TrimSpace(piece) == "" {
			continue
		}
		var b strings.Builder
		b.WriteString(piece)
		for more && i < len(phys) {
			l := phys[i]
			i++
			trimmed := strings.TrimLeftFunc(l, unicode.IsSpace)
			if strings.HasPrefix(trimmed, "#") || trimmed == "" {
				continue // comment or empty line inside a continuation
			}
			piece, more = trimContinuation(l, d.escape)
			b.WriteString(piece)
		}
		text := strings.TrimSpace(b.String())
		if text == "" {
			continue
		}
		out = append(out, logical{line: start, text: text})
	}
	return out, d, len(phys), nil
}

// trimContinuation removes a trailing escape character (followed by spaces
// or tabs only) and says whether there was one.
func trimContinuation(l string, escape rune) (string, bool) {
	t := strings.TrimRight(l, " \t")
	if strings.HasSuffix(t, string(escape)) {
		return t[:len(t)-1], true
	}
	return l, false
}

func isASCIISpace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\v' || r == '\f' || r == '\r'
}

func isUnicodeSpace(r rune) bool { return unicode.IsSpace(r) }

// cutSpace splits s at its first run of whitespace.
func cutSpace(s string) (string, string) {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, unicode.IsSpace)
	if i < 0 {
		return s, ""
	}
	return s[:i], strings.TrimSpace(s[i:])
}

// fieldsASCII splits s at runs of ASCII whitespace, as Docker does for the
// shell form of COPY, ADD, FROM and EXPOSE (quotes do not group words).
func fieldsASCII(s string) []string { return strings.FieldsFunc(s, isASCIISpace) }

type flag struct {
	name, value string
	hasValue    bool
}

// splitFlags takes the leading --name[=value] words off rest. Quotes and
// backslashes in a flag word are processed; a lone "--" ends the flags.
func splitFlags(rest string) ([]flag, string, error) {
	var flags []flag
	for {
		rest = strings.TrimLeftFunc(rest, unicode.IsSpace)
		if !strings.HasPrefix(rest, "--") {
			return flags, rest, nil
		}
		var b strings.Builder
		quote := rune(0)
		end := len(rest)
		for i := 0; i < len(rest); i++ {
			c := rune(rest[i])
			if quote == 0 && (isASCIISpace(c) || c == '\n') {
				end = i
				break
			}
			switch {
			case c == '\\' && i+1 < len(rest):
				i++
				b.WriteByte(rest[i])
			case quote == 0 && (c == '"' || c == '\''):
				quote = c
			case quote != 0 && c == quote:
				quote = 0
			default:
				b.WriteByte(rest[i])
			}
		}
		w := b.String()
		rest = rest[end:]
		if w == "--" {
			return flags, strings.TrimLeftFunc(rest, unicode.IsSpace), nil
		}
		name, value, hasValue := strings.Cut(w[2:], "=")
		if name == "" {
			return nil, "", fmt.Errorf("invalid flag %q", w)
		}
		flags = append(flags, flag{name: strings.ToLower(name), value: value, hasValue: hasValue})
	}
}

// rawWords splits s at unquoted whitespace, keeping quotes and escapes for
// the lexer (the words of ENV, LABEL and ARG).
func rawWords(s string, escape rune) []string {
	var words []string
	var b strings.Builder
	in := false
	quote := rune(0)
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		if quote == 0 && unicode.IsSpace(c) {
			if in {
				words = append(words, b.String())
				b.Reset()
				in = false
			}
			continue
		}
		in = true
		switch {
		case c == escape && quote != '\'':
			if i+1 == len(rs) {
				continue // a trailing escape is dropped
			}
			b.WriteRune(c)
			i++
			b.WriteRune(rs[i])
			continue
		case quote == 0 && (c == '\'' || c == '"'):
			quote = c
		case c == quote:
			quote = 0
		}
		b.WriteRune(c)
	}
	if in {
		words = append(words, b.String())
	}
	return words
}

// parseJSONArray reports whether s is a JSON array of strings (the exec
// form). Text that is not JSON is the shell form; a JSON array holding
// anything but strings is an error.
func parseJSONArray(s string) ([]string, bool, error) {
	if !strings.HasPrefix(s, "[") {
		return nil, false, nil
	}
	var raw []any
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, false, nil
	}
	out := make([]string, 0, len(raw))
	for _, v := range raw {
		str, ok := v.(string)
		if !ok {
			return nil, false, fmt.Errorf("when using the JSON array form, its elements must all be strings")
		}
		out = append(out, str)
	}
	return out, true, nil
}

var heredocRE = regexp.MustCompile(`^[0-9]*<<-?["']?[A-Za-z_]`)

// findHeredoc finds a heredoc (<<EOF, <<-"EOF", ...) starting an unquoted
// word of a shell-form command.
func findHeredoc(s string, escape rune) (string, bool) {
	quote := rune(0)
	atWord := true
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		if quote == 0 && atWord && (c == '<' || c >= '0' && c <= '9') {
			j := i
			for j < len(rs) && !unicode.IsSpace(rs[j]) {
				j++
			}
			if w := string(rs[i:j]); heredocRE.MatchString(w) {
				return w, true
			}
		}
		atWord = false
		switch {
		case quote == 0 && unicode.IsSpace(c):
			atWord = true
		case c == escape && quote != '\'':
			i++
		case quote == 0 && (c == '\'' || c == '"'):
			quote = c
		case c == quote:
			quote = 0
		}
	}
	return "", false
}
