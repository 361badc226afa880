package build

import (
	"regexp"
	"strings"
	"testing"
)

func TestCacheKey(t *testing.T) {
	base := func() *Instruction {
		return &Instruction{Line: 3, Cmd: "COPY", Args: []string{"a", "/b"}, Flags: map[string]string{"chown": "1:1", "chmod": "0644"}, Raw: "COPY a /b"}
	}
	const parent, inputs = "sha256:parent", "inputs"
	key := CacheKey(parent, base(), inputs)
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(key) {
		t.Fatalf("key %q is not sha256 hex", key)
	}
	same := []func(*Instruction){
		func(i *Instruction) { i.Line = 99 },
		func(i *Instruction) { i.Raw = "copy   a  /b" },
		func(i *Instruction) { i.Flags = map[string]string{"chmod": "0644", "chown": "1:1"} },
	}
	for n, f := range same {
		i := base()
		f(i)
		if CacheKey(parent, i, inputs) != key {
			t.Errorf("same[%d] changed the key", n)
		}
	}
	differ := map[string]func(*Instruction){
		"cmd":          func(i *Instruction) { i.Cmd = "ADD" },
		"args":         func(i *Instruction) { i.Args = []string{"a", "/c"} },
		"args split":   func(i *Instruction) { i.Args = []string{"a/", "b"} },
		"args joined":  func(i *Instruction) { i.Args = []string{"a/b"} },
		"flag value":   func(i *Instruction) { i.Flags["chown"] = "2:2" },
		"flag removed": func(i *Instruction) { delete(i.Flags, "chmod") },
		"shell":        func(i *Instruction) { i.Shell = true },
		"kv":           func(i *Instruction) { i.KV = [][2]string{{"a", "/b"}} },
		"build args":   func(i *Instruction) { i.BuildArgs = []string{"V=1"} },
	}
	seen := map[string]string{key: "base"}
	for name, f := range differ {
		i := base()
		f(i)
		k := CacheKey(parent, i, inputs)
		if other, dup := seen[k]; dup {
			t.Errorf("%s gives the same key as %s", name, other)
		}
		seen[k] = name
	}
	if CacheKey("sha256:other", base(), inputs) == key || CacheKey(parent, base(), "other") == key {
		t.Error("parent or inputs do not take part in the key")
	}
	// KV pairs are not confusable with one another.
	a := &Instruction{Cmd: "ENV", KV: [][2]string{{"A", "1 B=2"}}}
	b := &Instruction{Cmd: "ENV", KV: [][2]string{{"A", "1"}, {"B", "2"}}}
	if CacheKey(parent, a, "") == CacheKey(parent, b, "") {
		t.Error("ENV A=\"1 B=2\" and ENV A=1 B=2 share a key")
	}
}

func TestCacheKeyBuildArgs(t *testing.T) {
	src := "FROM alpine\nARG VERSION=1\nRUN make\n"
	key := func(args map[string]string) string {
		df := mustParse(t, src, args)
		return CacheKey("sha256:p", df.Instructions[2], "")
	}
	k := key(nil)
	if key(map[string]string{"VERSION": "2"}) == k {
		t.Error("changing an ARG in effect kept the RUN's key")
	}
	if key(map[string]string{"VERSION": "1"}) != k {
		t.Error("overriding an ARG with its default changed the key")
	}
	if key(map[string]string{"HTTP_PROXY": "http://p:3128", "no_proxy": "x"}) != k {
		t.Error("proxy arguments changed the key")
	}
	df := mustParse(t, src, map[string]string{"HTTP_PROXY": "http://p:3128"})
	if got := strings.Join(df.Instructions[2].BuildArgs, " "); got != "HTTP_PROXY=http://p:3128 VERSION=1" {
		t.Errorf("RUN BuildArgs = %q", got)
	}
	if CacheKey("p", nil, "") == "" {
		t.Error("nil instruction")
	}
}
