package build

import (
	"reflect"
	"testing"
)

func testLexer(escape rune) *lexer {
	env := map[string]string{
		"HOME": "/root", "EMPTY": "", "NAME": "world", "SPACED": "a  b", "PATH": "/usr/local/bin:/usr/bin:/bin",
		"FILE": "archive.tar.gz", "U": "über",
	}
	return &lexer{escape: escape, lookup: func(n string) (string, bool) { v, ok := env[n]; return v, ok }}
}

func TestSubstitution(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"$HOME", "/root"},
		{"${HOME}", "/root"},
		{"${HOME}_x $HOME_x", "/root_x "},
		{"$UNSET", ""},
		{"a$", "a$"},
		{"$ x", "$ x"},
		{"$1x", "x"},
		{"$$", ""},
		{"${UNSET:-default}", "default"},
		{"${EMPTY:-default}", "default"},
		{"${HOME:-default}", "/root"},
		{"${UNSET-default}", "default"},
		{"${EMPTY-default}", ""},
		{"${HOME:+alt}", "alt"},
		{"${EMPTY:+alt}", ""},
		{"${UNSET:+alt}", ""},
		{"${EMPTY+alt}", "alt"},
		{"${UNSET:-$HOME/x}", "/root/x"},
		{"${UNSET:-${NAME:-y}}", "world"},
		{"${UNSET:-a b}", "a b"},
		{"${UNSET:-a\\}b}", "a}b"},
		{"${HOME:?}", "/root"},
		{`\$HOME`, "$HOME"},
		{`\${HOME}`, "${HOME}"},
		{`\\$HOME`, `\/root`},
		{`a\ b`, "a b"},
		{`trailing\`, "trailing"},
		{`'$HOME' "$HOME"`, "$HOME /root"},
		{`"a \"q\" \$HOME \n"`, `a "q" $HOME \n`},
		{`'a\b'`, `a\b`},
		{"${FILE%.gz}", "archive.tar"},
		{"${FILE%.*}", "archive.tar"},
		{"${FILE%%.*}", "archive"},
		{"${FILE#*.}", "tar.gz"},
		{"${FILE##*.}", "gz"},
		{"${PATH#*:}", "/usr/bin:/bin"},
		{"${PATH%:*}", "/usr/local/bin:/usr/bin"},
		{"${FILE#nomatch}", "archive.tar.gz"},
		{"${U#ü}", "ber"},
		{"${U%?r}", "üb"},
		{"${FILE/tar/zip}", "archive.zip.gz"},
		{"${PATH//bin/sbin}", "/usr/local/sbin:/usr/sbin:/sbin"},
		{"${PATH/\\/usr/X}", "X/local/bin:/usr/bin:/bin"},
		{"${FILE/a*e/X}", "X.tar.gz"},
		{"${FILE//$/x}", "archive.tar.gz"},
	} {
		got, err := testLexer('\\').word(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("word(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestSubstitutionBacktickEscape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"`$HOME", "$HOME"},
		{`C:\dir\$HOME`, `C:\dir\/root`},
		{"\"`\"q`\"\"", `"q"`},
	} {
		got, err := testLexer('`').word(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("word(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestSubstitutionErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"${HOME", "syntax error: missing '}'"},
		{"${HOME:-x", "syntax error: missing '}'"},
		{"${", "syntax error: missing '}'"},
		{"${}", "syntax error: bad substitution"},
		{"${:-x}", "syntax error: bad substitution"},
		{"${HOME:3}", "unsupported modifier (:3) in substitution"},
		{"${HOME^^}", "unsupported modifier (^) in substitution"},
		{"${UNSET?}", "UNSET: is not allowed to be unset"},
		{"${EMPTY:?}", "EMPTY: is not allowed to be empty"},
		{"${UNSET:?set it}", "UNSET: set it"},
		{"${HOME/x}", "syntax error: missing '/' in ${}"},
		{"'open", "unexpected end of statement while looking for matching single-quote"},
		{`"open`, "unexpected end of statement while looking for matching double-quote"},
		{"${HOME#\\x}", `invalid pattern (\x) in substitution: bad escape`},
	} {
		got, err := testLexer('\\').word(tc.in)
		if err == nil || err.Error() != tc.want {
			t.Errorf("word(%q) = %q, %v; want error %q", tc.in, got, err, tc.want)
		}
	}
}

func TestSubstitutionWords(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"a b", []string{"a", "b"}},
		{"$SPACED", []string{"a", "b"}},
		{`"$SPACED"`, []string{"a  b"}},
		{`x\ y z`, []string{"x y", "z"}},
		{`'' $EMPTY`, nil},
		{"${UNSET:-1 2}3", []string{"1", "23"}},
	} {
		got, err := testLexer('\\').words(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("words(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
