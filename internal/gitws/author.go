package gitws

import (
	"context"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"github.com/den-dev/den/api"
)

// DefaultAuthor is the identity of commits in a workspace whose author
// was neither given nor found in the host repository.
const DefaultAuthor = "den <den@localhost>"

// authorRE is git's "Name <email>": a name without angle brackets, and an
// email without spaces or angle brackets.
var authorRE = regexp.MustCompile(`^([^<>]*[^<>\s])\s*<([^<>\s]+)>$`)

// ParseAuthor checks an identity "Name <email>" (the git.author field) and
// returns its name and email.
func ParseAuthor(s string) (name, email string, err error) {
	if strings.ContainsAny(s, "\x00\n\r") {
		return "", "", api.FieldError("git.author", "control characters in %q", s)
	}
	m := authorRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return "", "", api.FieldError("git.author", "%q is not Name <email>, like 'Ada Lovelace <ada@example.com>'", s)
	}
	return strings.TrimSpace(m[1]), m[2], nil
}

// Author picks the identity of a workspace's commits: given (checked with
// ParseAuthor) when set, else the host repository's user.name and
// user.email when the source is one (its own config, then its owner's
// global config, as git run there by its owner would see them), else
// DefaultAuthor. It returns "Name <email>".
func Author(ctx context.Context, src Source, given string) (string, error) {
	if given != "" {
		name, email, err := ParseAuthor(given)
		if err != nil {
			return "", err
		}
		return name + " <" + email + ">", nil
	}
	if src.HostPath != "" {
		name, email := hostIdentity(ctx, src.HostPath)
		if id := name + " <" + email + ">"; name != "" && email != "" {
			if _, _, err := ParseAuthor(id); err == nil {
				return id, nil
			}
		}
	}
	return DefaultAuthor, nil
}

// hostIdentity reads user.name and user.email with git in the host
// repository dir, with the global config of the repository's owner (not
// the daemon's). Reading config runs no program.
func hostIdentity(ctx context.Context, dir string) (name, email string) {
	var env []string
	for _, kv := range baseEnv() {
		if !strings.HasPrefix(kv, "GIT_CONFIG_GLOBAL=") && !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
			env = append(env, kv)
		}
	}
	home := ""
	if st, err := os.Stat(dir); err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			if u, err := user.LookupId(strconv.Itoa(int(sys.Uid))); err == nil {
				home = u.HomeDir
			}
		}
	}
	if home == "" {
		env = append(env, "GIT_CONFIG_GLOBAL=/dev/null")
	} else {
		env = append(env, "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"))
	}
	get := func(key string) string {
		cmd := gitCmd(ctx, dir, "config", "--get", key)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(out))
	}
	return get("user.name"), get("user.email")
}
