package build

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

// render prints an instruction compactly for table comparisons.
func render(ins *Instruction) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s", ins.Line, ins.Cmd)
	if ins.Args != nil {
		fmt.Fprintf(&b, " %q", ins.Args)
	}
	if ins.Shell {
		b.WriteString(" shell")
	}
	if ins.KV != nil {
		var kv []string
		for _, p := range ins.KV {
			kv = append(kv, p[0]+"="+p[1])
		}
		fmt.Fprintf(&b, " kv%q", kv)
	}
	if ins.Flags != nil {
		var fl []string
		for k, v := range ins.Flags {
			fl = append(fl, k+"="+v)
		}
		sort.Strings(fl)
		fmt.Fprintf(&b, " flags%q", fl)
	}
	if len(ins.BuildArgs) > 0 {
		fmt.Fprintf(&b, " args%q", ins.BuildArgs)
	}
	return b.String()
}

func renderAll(l []*Instruction) []string {
	out := []string{}
	for _, ins := range l {
		out = append(out, render(ins))
	}
	return out
}

func mustParse(t *testing.T, src string, args map[string]string) *Dockerfile {
	t.Helper()
	df, err := Parse(strings.NewReader(src), args)
	if err != nil {
		t.Fatalf("Parse(%q): %v", src, err)
	}
	return df
}

func diffLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\n got:\n\t%s\nwant:\n\t%s", what, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}
