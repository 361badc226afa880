package agent

// A background process is named in every process call (ProcPath) by its
// id ("p12") or by the name it was started with (den exec -d --name web).
// Names that look like ids are refused when a process starts, so an id
// and a name never collide; ResolveProc is the one place a reference is
// turned into a process, for the agent's table and for the list a
// sleeping sandbox keeps.

// IsProcID reports whether s is a process id: "p" and 1-19 digits.
func IsProcID(s string) bool {
	if len(s) < 2 || len(s) > 20 || s[0] != 'p' {
		return false
	}
	for _, c := range s[1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// ValidProcName reports whether s can name a process: 1-64 letters,
// digits, '-', '_' or '.', and not shaped like a process id.
func ValidProcName(s string) bool { return validSessionName(s) && !IsProcID(s) }

// ValidProcRef reports whether s can refer to a process, by id or name.
func ValidProcRef(s string) bool { return IsProcID(s) || ValidProcName(s) }

// ResolveProc returns the index of the process ref refers to among n
// processes listed oldest first, or -1: the process whose id is ref; else
// the running process named ref (at most one runs under a name); else the
// newest process named ref (a finished one, for its logs and exit).
func ResolveProc(ref string, n int, at func(i int) (id, name string, running bool)) int {
	newest := -1
	for i := 0; i < n; i++ {
		id, name, running := at(i)
		if id == ref {
			return i
		}
		if name == ref && ValidProcName(ref) && (running || newest == -1 || !runningAt(at, newest)) {
			newest = i
		}
	}
	return newest
}

func runningAt(at func(int) (string, string, bool), i int) bool {
	_, _, running := at(i)
	return running
}
