package build

import (
	"errors"
	"strings"
	"testing"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		pythonApp,
		"",
		"FROM a\n",
		"# escape=`\nFROM a\nRUN x `\n y\n",
		"ARG A=1\nFROM b:$A AS s\nENV X=${A:-d} Y=\"q\"\nLABEL a=b\nEXPOSE 1-3/udp\nWORKDIR ../x\nUSER u\nCMD [\"a\"]\n",
		"FROM a\nRUN <<EOF\nx\nEOF\n",
		"FROM a\nCOPY --chown=1 --chmod=755 [\"a b\", \"/c/\"]\n",
		"FROM a\nENV ${X:?}\n",
		"FROM a\nENV A=${B#*.} C=${D//x/y}\n",
		"\\\n\\\nFROM a\\\n",
		"FROM a\nHEALTHCHECK NONE\n",
		"FROM a\nADD http://x /y\n",
		"FROM a\r\nRUN \\\r\n\r\n  # c\r\n  x",
		"\uFEFF# syntax=x\n# syntax=y\n",
	} {
		f.Add(s, "V", "1")
	}
	f.Fuzz(func(t *testing.T, src, argName, argValue string) {
		df, err := Parse(strings.NewReader(src), map[string]string{argName: argValue})
		lines := strings.Count(src, "\n")
		if src != "" && !strings.HasSuffix(src, "\n") {
			lines++
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T) is not an *Error", err, err)
			}
			if e.Line < 1 || e.Line > max(1, lines) {
				t.Fatalf("error %q names line %d of %d", err, e.Line, lines)
			}
			return
		}
		if len(df.Instructions) == 0 || df.Instructions[0].Cmd != "FROM" || df.Base != df.Instructions[0].Args[0] {
			t.Fatalf("parsed without a leading FROM: %v", renderAll(df.Instructions))
		}
		prev := 0
		for _, ins := range append(append([]*Instruction{}, df.MetaArgs...), df.Instructions...) {
			if ins.Line <= prev || ins.Line > lines {
				t.Fatalf("instruction %s: line out of order or range (%d lines)", render(ins), lines)
			}
			prev = ins.Line
			if (ins.Cmd == "RUN" || ins.Cmd == "CMD" || ins.Cmd == "ENTRYPOINT") && ins.Shell && len(ins.Args) != 1 {
				t.Fatalf("shell form %s has %d args", render(ins), len(ins.Args))
			}
			if (ins.Cmd == "COPY" || ins.Cmd == "ADD") && len(ins.Args) < 2 {
				t.Fatalf("%s has fewer than two args", render(ins))
			}
			_ = CacheKey("p", ins, "")
		}
	})
}
