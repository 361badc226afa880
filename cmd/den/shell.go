package main

import (
	"github.com/den-dev/den/api"
)

var verbShell = &verb{
	name:     "shell",
	summary:  "open an interactive login shell in a sandbox",
	synopsis: "[flags] ID",
	details: `Runs a login shell (bash -l when the sandbox has bash, else sh -l) on a
terminal the size of den's own, like den exec -it ID -- bash -l. Typing
exit (or Ctrl-D) ends it; den exits with the shell's exit code.`,
	example: `den shell web
		den shell -u nobody -w /work web`,
	run: cmdShell,
}

// loginShell starts bash -l if there is a bash, else sh -l. (A failed exec
// would end a POSIX sh, so exec bash || exec sh does not do.)
var loginShell = []string{"/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"}

func cmdShell(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	var env []string
	var workdir, user string
	f.Var(listValue{&env, checkEnv}, "env", "e", "K=V", "set an environment variable (repeatable; -e K passes den's own $K)")
	f.Var(stringValue{&workdir}, "workdir", "w", "DIR", "working directory of the shell")
	f.Var(stringValue{&user}, "user", "u", "USER", "user (name or uid[:gid]) to run the shell as")
	pos, err := c.exactly(f, v, args, 1, "shell needs one sandbox ID, like: den shell web")
	if err != nil {
		return err
	}
	req := api.ExecRequest{Cmd: loginShell, Env: env, Workdir: workdir, User: user}
	return c.ttyExit(c.runTTY(c.client(f), pos[0], req, true))
}
