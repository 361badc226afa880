// Package gitws keeps git workspaces: a repository cloned into a sandbox's
// /workspace on a branch of its own, and the way its changes come back out
// (a patch, or commits on a branch of the host repository).
//
// The sandbox's /workspace/.git is hostile input: its config, hooks and
// attributes could make any git that reads them run commands (core.fsmonitor,
// filters, diff drivers, sshCommand, hooks). So the daemon never runs git
// over it. For every workspace the daemon keeps a bare repository of its own
// in its data directory, with a configuration it controls (no system or
// global config, hooks pointed at /dev/null). Files come out of the sandbox
// as a tar stream read through the agent; their bytes, modes and symlink
// targets become a tree through git fast-import, so nothing from the sandbox
// is ever written to the host's filesystem as a file git could act on.
// Commits made inside come out as a git bundle (a pack and a list of refs,
// which git parses as data, checked with transfer.fsckObjects).
package gitws

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// baseEnv is the environment of every git the daemon runs: no system or
// global configuration, no prompts, the C locale, and none of the caller's
// GIT_* variables (GIT_DIR and friends would redirect it).
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_") && !strings.HasPrefix(kv, "LC_") && !strings.HasPrefix(kv, "LANG") {
			env = append(env, kv)
		}
	}
	return append(env,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=/bin/false",
		"SSH_ASKPASS=/bin/false",
		"GIT_OPTIONAL_LOCKS=0",
		"LC_ALL=C",
		"GIT_AUTHOR_NAME=den", "GIT_AUTHOR_EMAIL=den@localhost",
		"GIT_COMMITTER_NAME=den", "GIT_COMMITTER_EMAIL=den@localhost",
	)
}

// safeArgs are command-line settings (which outrank any repository's own
// config) that turn off every way a repository's configuration could run a
// program: hooks, the file system monitor, automatic maintenance.
var safeArgs = []string{
	"-c", "core.hooksPath=/dev/null",
	"-c", "core.fsmonitor=false",
	"-c", "core.sshCommand=ssh",
	"-c", "core.excludesFile=/dev/null",
	"-c", "core.attributesFile=/dev/null",
	"-c", "gc.auto=0",
	"-c", "maintenance.auto=false",
	"-c", "safe.directory=*",
	"-c", "protocol.ext.allow=never",
	"-c", "init.defaultBranch=main",
}

// gitCmd prepares git with the safe settings, in dir (a repository or "").
func gitCmd(ctx context.Context, dir string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "git", append(append([]string{}, safeArgs...), args...)...)
	cmd.Dir = dir
	cmd.Env = baseEnv()
	return cmd
}

// gitError is a failed git command with what it said.
type gitError struct {
	args   []string
	err    error
	stderr string
}

func (e *gitError) Error() string {
	msg := strings.TrimSpace(e.stderr)
	if msg == "" {
		msg = e.err.Error()
	}
	return fmt.Sprintf("git %s: %s", e.args[0], msg)
}

// run runs git in dir and returns its standard output.
func run(ctx context.Context, dir string, stdin []byte, args ...string) ([]byte, error) {
	cmd := gitCmd(ctx, dir, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return out.Bytes(), &gitError{args: args, err: err, stderr: errb.String()}
	}
	return out.Bytes(), nil
}

// runS is run with the output as a trimmed string.
func runS(ctx context.Context, dir string, args ...string) (string, error) {
	b, err := run(ctx, dir, nil, args...)
	return strings.TrimSpace(string(b)), err
}

// stderrOf returns what a failed git command said, for error messages.
func stderrOf(err error) string {
	var ge *gitError
	if errors.As(err, &ge) {
		if s := strings.TrimSpace(ge.stderr); s != "" {
			return s
		}
	}
	return err.Error()
}

// Available reports whether the host has git.
func Available() error {
	if _, err := exec.LookPath("git"); err != nil {
		return fmt.Errorf("git is not installed on the host (apt-get install git)")
	}
	return nil
}
