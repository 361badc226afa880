package host

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcStat reads /proc/PID/stat and returns the process's command name and
// the fields after it: fields[0] is its state letter (field 3 in proc(5)),
// fields[k] is field k+3.
func ProcStat(pid int) (comm string, fields []string, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", nil, err
	}
	s := string(b)
	i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if i < 0 || j < i {
		return "", nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	return s[i+1 : j], strings.Fields(s[j+1:]), nil
}
