package mcp

import (
	"fmt"
	"strings"
)

// nearMissMaxLines bounds the file lines nearMiss compares (the first ones).
const nearMissMaxLines = 50000

// nearMiss explains why old does not occur in text: the region of text
// most like it, with line numbers, and how each of its lines differs.
func nearMiss(text, old string) string {
	want := splitLines(old)
	lines := splitLines(text)
	if len(lines) > nearMissMaxLines {
		lines = lines[:nearMissMaxLines]
	}
	if len(lines) == 0 {
		return "The file is empty."
	}
	k := min(len(want), len(lines))
	best, bestScore := 0, -1.0
	for start := 0; start+k <= len(lines); start++ {
		score := 0.0
		for i := 0; i < k; i++ {
			score += lineSimilarity(want[i], lines[start+i])
		}
		if score > bestScore {
			best, bestScore = start, score
		}
	}
	sim := bestScore / float64(len(want))
	if sim < 0.3 {
		return "No region of the file resembles old_string; read the file again (read_file) before editing."
	}
	var b strings.Builder
	fmt.Fprintf(&b, "The closest region is lines %d-%d (%.0f%% alike):\n", best+1, best+k, sim*100)
	for i := 0; i < k; i++ {
		fmt.Fprintf(&b, "%6d\t%s\n", best+1+i, lines[best+i])
	}
	b.WriteString("What differs:\n")
	diffs := 0
	for i := 0; i < k && diffs < 10; i++ {
		if d := lineDiff(want[i], lines[best+i]); d != "" {
			fmt.Fprintf(&b, "  line %d: %s\n", best+1+i, d)
			diffs++
		}
	}
	if len(want) > k {
		fmt.Fprintf(&b, "  old_string has %d lines, the file only %d\n", len(want), len(lines))
	}
	if diffs == 0 && len(want) <= k {
		b.WriteString("  only line endings or a final newline\n")
	}
	return b.String()
}

// splitLines splits text into lines without their newlines; a final
// newline does not start another line.
func splitLines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// lineSimilarity is 1 for equal lines, 0.9 for lines equal but for
// whitespace, else the share of their longer length that a common prefix
// and suffix cover (at most 0.8).
func lineSimilarity(a, b string) float64 {
	if a == b {
		return 1
	}
	if collapse(a) == collapse(b) {
		return 0.9
	}
	ta, tb := strings.TrimSpace(a), strings.TrimSpace(b)
	n := max(len(ta), len(tb))
	if n == 0 {
		return 0.5
	}
	p := commonPrefix(ta, tb)
	sfx := commonPrefix(reverse(ta[p:]), reverse(tb[p:]))
	return 0.8 * float64(p+sfx) / float64(n)
}

// lineDiff says how the file's line got differs from the wanted one, or ""
// when they are equal.
func lineDiff(want, got string) string {
	switch {
	case want == got:
		return ""
	case strings.TrimRight(want, "\r") == strings.TrimRight(got, "\r"):
		return "line endings differ (\\r\\n against \\n)"
	case collapse(want) == collapse(got):
		lw, lg := leading(want), leading(got)
		if lw != lg {
			return fmt.Sprintf("indentation differs: old_string has %s, the file %s", describeSpace(lw), describeSpace(lg))
		}
		return fmt.Sprintf("whitespace differs: old_string has %q, the file %q", want, got)
	}
	p := commonPrefix(want, got)
	return fmt.Sprintf("differs from column %d: old_string has %q, the file %q", p+1, clip(want[p:]), clip(got[p:]))
}

func collapse(s string) string { return strings.Join(strings.Fields(s), " ") }

func leading(s string) string { return s[:len(s)-len(strings.TrimLeft(s, " \t"))] }

func describeSpace(s string) string {
	if s == "" {
		return "no indentation"
	}
	tabs := strings.Count(s, "\t")
	spaces := len(s) - tabs
	switch {
	case tabs == 0:
		return fmt.Sprintf("%d spaces", spaces)
	case spaces == 0:
		return fmt.Sprintf("%d tabs", tabs)
	}
	return fmt.Sprintf("%d tabs and %d spaces", tabs, spaces)
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func reverse(s string) string {
	b := []byte(s)
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
	return string(b)
}

// clip shortens s for a message.
func clip(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}
