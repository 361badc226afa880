package agent

import "testing"

func TestResolveProc(t *testing.T) {
	type proc struct {
		id, name string
		running  bool
	}
	list := []proc{
		{"p1", "web", false}, // killed
		{"p2", "", true},
		{"p3", "web", true}, // its successor
		{"p4", "job", false},
		{"p5", "job", false}, // ran again
	}
	at := func(i int) (string, string, bool) { return list[i].id, list[i].name, list[i].running }
	for ref, want := range map[string]int{"p1": 0, "p2": 1, "web": 2, "job": 4, "nosuch": -1, "p9": -1, "": -1} {
		if got := ResolveProc(ref, len(list), at); got != want {
			t.Errorf("ResolveProc(%q) = %d, want %d", ref, got, want)
		}
	}
	for s, want := range map[string]bool{"p12": true, "p": false, "p1x": false, "web": false, "P1": false} {
		if IsProcID(s) != want {
			t.Errorf("IsProcID(%q) = %v", s, !want)
		}
	}
	for s, want := range map[string]bool{"web": true, "p7x": true, "p7": false, "a b": false, "": false} {
		if ValidProcName(s) != want {
			t.Errorf("ValidProcName(%q) = %v", s, !want)
		}
	}
}
