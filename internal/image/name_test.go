package image

import (
	"regexp"
	"strings"
	"testing"
)

// refRE is the grammar of Docker's distribution/reference, with den's
// narrowing of digests to sha256: the oracle CheckName is held to.
var refRE = func() *regexp.Regexp {
	alnum := `[a-z0-9]+`
	sep := `(?:[._]|__|-+)`
	comp := alnum + `(?:` + sep + alnum + `)*`
	dcomp := `(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])`
	domain := dcomp + `(?:\.` + dcomp + `)*(?::[0-9]{1,5})?`
	tag := `[\w][\w.-]{0,127}`
	digest := `sha256:[0-9a-f]{64}`
	return regexp.MustCompile(`^(?:` + domain + `/)?` + comp + `(?:/` + comp + `)*(?::` + tag + `)?(?:@` + digest + `)?$`)
}()

var hexDigest = strings.Repeat("ab", 32)

func TestCheckName(t *testing.T) {
	good := []string{"host", "alpine", "alpine:3.20", "library/alpine", "docker.io/library/alpine:3.20",
		"localhost:5000/app", "localhost/app:v1", "registry.example.com:443/a/b/c:T_1.0-x", "a__b", "a---b", "a.b_c",
		"build-cache:0123456789abcdef-0123456789abcdef0123456789abcdef", "app@sha256:" + hexDigest, "app:1@sha256:" + hexDigest}
	bad := []string{"", "a/../../c", "..", "../a", "a/..", "a/./b", "a//b", "/a", "a/", "A", "app:", "app:-x",
		"app:" + strings.Repeat("t", 129), "a b", "a\\b", "a\x00", "-a", "a-", "a..b", "a___b", "app@sha256:xyz",
		"app@md5:" + hexDigest, "[::1]/a", "host:port/a", ".a", "a.", strings.Repeat("a", 256), "a:b:c", "a@b@c"}
	for _, s := range good {
		if err := CheckName(s); err != nil {
			t.Errorf("%q: %v, want accepted", s, err)
		}
	}
	for _, s := range bad {
		if CheckName(s) == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"a/../../c", "docker.io/library/alpine:3.20", "localhost:5000/app", "a__b", "app@sha256:" + hexDigest, "a//b", "A:b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := CheckName(s)
		if want := len(s) <= MaxNameLen && refRE.MatchString(s); (err == nil) != want {
			t.Fatalf("%q: CheckName says %v, the reference grammar says %v", s, err, want)
		}
		if err == nil && (strings.Contains(s, "..") || strings.Contains(s, "//")) {
			t.Fatalf("%q accepted", s)
		}
	})
}
