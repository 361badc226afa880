package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/den-dev/den/api"
)

// ExecSpec is the agent's exec request: the API request plus the sandbox's
// own environment and working directory, merged by the daemon.
type ExecSpec struct {
	Argv      []string      `json:"argv"`
	Env       []string      `json:"env,omitempty"`
	Dir       string        `json:"dir,omitempty"`
	User      string        `json:"user,omitempty"`
	Stdin     []byte        `json:"stdin,omitempty"`
	StdinOpen bool          `json:"stdin_open,omitempty"`
	Timeout   time.Duration `json:"timeout,omitempty"`
	// Session names a shell whose state (cwd, variables, functions)
	// persists from one exec to the next.
	Session string `json:"session,omitempty"`
	// Shell is a session command given as a shell line (the request's
	// shell), run by the session's shell as it is; without it the
	// session runs Argv, each argument quoted.
	Shell string `json:"shell,omitempty"`
	// Restart makes a background process a service: "always" or
	// "on-failure" start it again (with backoff) when it ends.
	Restart string `json:"restart,omitempty"`
	// Name names a background process; unique among running ones.
	Name string `json:"name,omitempty"`
	// TTY runs the process on a terminal of Rows x Cols.
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// Image names the sandbox's image, for error messages only.
	Image string `json:"image,omitempty"`
}

type resolved struct {
	path      string
	argv      []string
	env       []string
	dir       string
	uid, gid  uint32
	groups    []uint32
	stdin     []byte
	stdinOpen bool
	timeout   time.Duration
	// A service's runs share one pair of output rings, left open between runs.
	stdoutRing, stderrRing *ring
	keepRings              bool
	name                   string
	id                     string // a service's process id, kept across its runs
	tty                    bool
	rows, cols             uint16
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// resolve turns a spec into what fork/exec needs, failing with an error that
// says what is wrong (unknown user, missing directory, command not found).
func (a *Agent) resolve(s *ExecSpec) (*resolved, error) {
	if len(s.Argv) == 0 || s.Argv[0] == "" {
		return nil, api.FieldError("cmd", "empty command")
	}
	u, err := lookupUser(s.User, s.Image)
	if err != nil {
		return nil, err
	}
	env := mergeEnv([]string{
		"PATH=" + defaultPath,
		"HOME=" + u.home,
		"USER=" + u.name,
		"LOGNAME=" + u.name,
		"HOSTNAME=" + a.hostname(),
	}, s.Env)
	dir := s.Dir
	if dir == "" {
		dir = u.home
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			dir = "/"
		}
	}
	dir = path.Clean("/" + dir)
	if st, err := os.Stat(dir); err != nil {
		return nil, api.FieldError("workdir", "%s: no such directory", dir)
	} else if !st.IsDir() {
		return nil, api.FieldError("workdir", "%s: not a directory", dir)
	}
	p, err := lookPath(s.Argv[0], getenv(env, "PATH"), dir)
	if err != nil {
		return nil, err
	}
	return &resolved{
		path: p, argv: s.Argv, env: env, dir: dir,
		uid: u.uid, gid: u.gid, groups: u.groups,
		stdin: s.Stdin, stdinOpen: s.StdinOpen, timeout: s.Timeout,
		tty: s.TTY, rows: s.Rows, cols: s.Cols,
	}, nil
}

// errNotFound and errNoPerm are exec failures reported as exit codes 127/126.
type startError struct {
	code int
	msg  string
}

func (e *startError) Error() string { return e.msg }

func lookPath(file, pathEnv, dir string) (string, error) {
	check := func(p string) error {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return fs.ErrPermission
		}
		return nil
	}
	if strings.Contains(file, "/") {
		p := file
		if !path.IsAbs(p) {
			p = path.Join(dir, p)
		}
		if err := check(p); err != nil {
			if errors.Is(err, fs.ErrPermission) {
				return "", &startError{126, fmt.Sprintf("exec %q: permission denied", file)}
			}
			return "", &startError{127, fmt.Sprintf("exec %q: no such file", file)}
		}
		return p, nil
	}
	denied := false
	for _, d := range strings.Split(pathEnv, ":") {
		if d == "" {
			d = "."
		}
		p := path.Join(d, file)
		if !path.IsAbs(p) {
			p = path.Join(dir, p)
		}
		err := check(p)
		if err == nil {
			return p, nil
		}
		if errors.Is(err, fs.ErrPermission) {
			denied = true
		}
	}
	if denied {
		return "", &startError{126, fmt.Sprintf("exec %q: permission denied", file)}
	}
	return "", &startError{127, fmt.Sprintf("exec %q: executable file not found in $PATH", file)}
}

func getenv(env []string, k string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], k+"="); ok {
			return v
		}
	}
	return ""
}

// mergeEnv returns base with over applied: later keys replace earlier ones.
func mergeEnv(base, over []string) []string {
	idx := map[string]int{}
	out := make([]string, 0, len(base)+len(over))
	for _, kv := range append(base, over...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

type user struct {
	name     string
	uid, gid uint32
	home     string
	groups   []uint32
}

// lookupUser resolves "", "name", "uid", "name:group" or "uid:gid" with the
// sandbox's own /etc/passwd and /etc/group. As in Docker, none of it needs
// those files: the default user (and "root") is uid 0, and numeric ids
// stand for themselves. Only a user or group name that is not there is an
// error; image names the sandbox's image in it.
func lookupUser(spec, image string) (*user, error) {
	if spec == "" {
		spec = "root"
	}
	uspec, gspec, hasGroup := strings.Cut(spec, ":")
	u := &user{name: uspec, home: "/"}
	found := false
	num, numErr := strconv.ParseUint(uspec, 10, 32)
	forEachLine("/etc/passwd", func(f []string) bool {
		if len(f) < 7 {
			return true
		}
		uid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			return true
		}
		if f[0] == uspec || (numErr == nil && uid == num) {
			gid, _ := strconv.ParseUint(f[3], 10, 32)
			u.name, u.uid, u.gid, u.home = f[0], uint32(uid), uint32(gid), f[5]
			found = true
			return false
		}
		return true
	})
	if !found {
		switch {
		case uspec == "root":
			u.home = "/root"
		case numErr != nil:
			return nil, api.FieldError("user", "unknown user %q: not in /etc/passwd%s; use a numeric uid[:gid] or add the user to the image", uspec, inImage(image, "/etc/passwd"))
		default:
			u.uid, u.gid = uint32(num), uint32(num)
		}
	}
	if hasGroup {
		g, err := strconv.ParseUint(gspec, 10, 32)
		if err != nil {
			ok := false
			forEachLine("/etc/group", func(f []string) bool {
				if len(f) >= 3 && f[0] == gspec {
					if v, err := strconv.ParseUint(f[2], 10, 32); err == nil {
						g, ok = v, true
						return false
					}
				}
				return true
			})
			if !ok {
				return nil, api.FieldError("user", "unknown group %q: not in /etc/group%s; use a numeric gid", gspec, inImage(image, "/etc/group"))
			}
		}
		u.gid = uint32(g)
	}
	if u.uid > 65535 || u.gid > 65535 {
		return nil, api.FieldError("user", "%q: ids above 65535 are not mapped in the sandbox", spec)
	}
	u.groups = []uint32{u.gid}
	if found {
		forEachLine("/etc/group", func(f []string) bool {
			if len(f) >= 4 {
				for _, m := range strings.Split(f[3], ",") {
					if m == u.name {
						if v, err := strconv.ParseUint(f[2], 10, 32); err == nil && v <= 65535 {
							u.groups = append(u.groups, uint32(v))
						}
					}
				}
			}
			return true
		})
	}
	return u, nil
}

// inImage says where a lookup file was searched: " of image NAME", and that
// the image has no such file when that is so.
func inImage(image, file string) string {
	where := " of the sandbox"
	if image != "" {
		where = fmt.Sprintf(" of image %q", image)
	}
	if _, err := os.Stat(file); errors.Is(err, fs.ErrNotExist) {
		where += " (it has no " + file + ")"
	}
	return where
}

func forEachLine(file string, fn func([]string) bool) {
	f, err := os.Open(file)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if !fn(strings.Split(line, ":")) {
			return
		}
	}
}
