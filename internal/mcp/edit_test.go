package mcp

import (
	"strings"
	"testing"
)

func TestNearMiss(t *testing.T) {
	file := "package main\n\nfunc main() {\n\tfmt.Println(\"hello\")\n\treturn\n}\n"
	for _, tc := range []struct {
		name, old string
		want      []string
	}{
		{"indentation", "func main() {\n    fmt.Println(\"hello\")\n", []string{"lines 3-4", "line 4: indentation differs: old_string has 4 spaces, the file 1 tabs"}},
		{"text", "\tfmt.Println(\"goodbye\")\n", []string{"lines 4-4", "line 4: differs from column 15", `"goodbye\")"`}},
		{"line endings", "func main() {\r\n\tfmt.Println(\"hello\")\r\n", []string{"lines 3-4", "line endings differ"}},
		{"unrelated", "zzzzzz qqqq\nwwww\n", []string{"No region of the file resembles old_string"}},
	} {
		got := nearMiss(file, tc.old)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: report lacks %q:\n%s", tc.name, w, got)
			}
		}
	}
	if got := nearMiss("", "x"); got != "The file is empty." {
		t.Errorf("empty file: %q", got)
	}
}

func TestLineList(t *testing.T) {
	if got := lineList("a\nx\nb\nx\nx\n", "x", 10); got != "2, 4, 5" {
		t.Errorf("lineList = %q", got)
	}
	if got := lineList("x x x", "x", 2); got != "1, 1, ..." {
		t.Errorf("lineList with max = %q", got)
	}
}

func TestBounded(t *testing.T) {
	var b bounded
	b.Write([]byte("short"))
	if b.String() != "short" || b.cut() {
		t.Fatalf("short output: %q", b.String())
	}
	var big bounded
	for i := 0; i < 20000; i++ {
		big.Write([]byte("line " + strings.Repeat("x", 10) + "\n"))
	}
	s := big.String()
	if !big.cut() || !strings.Contains(s, "bytes of output left out") || len(s) > headBytes+tailBytes+100 {
		t.Fatalf("big output: cut %v, %d bytes", big.cut(), len(s))
	}
	if !strings.HasPrefix(s, "line xxxxxxxxxx\n") || !strings.HasSuffix(s, "line xxxxxxxxxx\n") {
		t.Errorf("big output does not keep whole lines at both ends")
	}
}

func TestReadLines(t *testing.T) {
	text := "1\n2\n3\n4\n5"
	for _, tc := range []struct {
		in                 readIn
		content            string
		start, end, totals int
	}{
		{readIn{}, text, 1, 5, 5},
		{readIn{Offset: 2, Limit: 2}, "2\n3\n", 2, 3, 5},
		{readIn{Tail: 2}, "4\n5", 4, 5, 5},
		{readIn{Offset: 9}, "", 0, 0, 5},
	} {
		out, err := readLines(strings.NewReader(text), tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if out.Content != tc.content || out.StartLine != tc.start || out.EndLine != tc.end || out.TotalLines != tc.totals {
			t.Errorf("%+v: got %+v", tc.in, out)
		}
	}
	if _, err := readLines(strings.NewReader("a\x00b"), readIn{}); err == nil || !strings.Contains(err.Error(), "binary") {
		t.Errorf("binary file: %v", err)
	}
}
