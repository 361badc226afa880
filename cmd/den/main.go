// Command den is the den sandbox platform in one binary: the daemon
// (den serve) and a docker-like command line that talks to it through the
// Go SDK (package client).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/confine"
	"github.com/den-dev/den/internal/reexec"
)

func main() {
	// Before anything else (the daemon, a sandbox's init and every CLI
	// verb alike): descriptors this process inherited without
	// close-on-exec reach no program it starts, so none of them can cross
	// into a sandbox.
	if err := confine.InheritNothing(); err != nil {
		fmt.Fprintf(os.Stderr, "den: %v\n", err)
		os.Exit(1)
	}
	reexec.Run(os.Args[1:]) // a sandbox's init, a tier's agent, the userns holder
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// cli is one invocation of den: its standard streams and global flags.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	host           string // a --host given before the verb
}

// verb is one den command.
type verb struct {
	name     string // "run", or "image ls" for a sub-command
	summary  string // one line
	synopsis string // what follows "den NAME" in the usage line
	details  string // optional paragraph
	example  string // one command a line
	run      func(c *cli, v *verb, args []string) error
	group    bool // a group of sub-commands ("image")
	external bool // implemented outside this package (serve)
}

var verbs []*verb

func init() {
	verbs = []*verb{
		verbRun, verbCreate, verbExec, verbShell, verbLs, verbInspect, verbStats, verbStop, verbStart, verbPause, verbResume, verbHibernate, verbEscalate, verbRm, verbCp,
		verbPs, verbLogs, verbAttach, verbKill, verbWait, verbSessions, verbSessionsRm,
		verbCommit, verbDiff, verbExport,
		verbSnapshot, verbSnapshotCreate, verbSnapshotLs, verbSnapshotInspect, verbSnapshotRm, verbSnapshotSave, verbSnapshotLoad, verbRestore, verbFork,
		verbVolume, verbVolumeCreate, verbVolumeLs, verbVolumeInspect, verbVolumeRm,
		verbNet, verbNetSet, verbNetShow, verbNetLog,
		verbSecret, verbSecretSet, verbSecretLs, verbSecretRm,
		verbToken, verbTokenCreate, verbTokenLs, verbTokenRm,
		verbPort, verbPortLs, verbPortRm, verbForward,
		verbSSH, verbSSHKey, verbSSHKeyAdd, verbSSHKeyLs, verbSSHKeyRm,
		verbImage, verbImageLs, verbImagePull, verbImageBuild, verbImageImport, verbImageSave, verbImageRm, verbImageInspect, verbImagePrune,
		verbEvents, verbInfo, verbSystem, verbSystemReset, verbVersion, verbBench, verbMCP, verbServe, verbHelp,
	}
}

var verbServe = &verb{
	name:     "serve",
	summary:  "run the den daemon",
	synopsis: "[flags]",
	example:  "den serve",
	external: true,
}

func findVerb(name string) *verb {
	for _, v := range verbs {
		if v.name == name {
			return v
		}
	}
	return nil
}

// run runs den with args (without the program name) and returns the exit
// code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	// Global flags before the verb.
	for len(args) > 0 {
		a := args[0]
		if a == "--host" || a == "-H" || a == "-host" {
			if len(args) < 2 {
				return c.exit(nil, &usageError{msg: "flag --host needs a value (HOST)"})
			}
			c.host, args = args[1], args[2:]
			continue
		}
		if v, ok := strings.CutPrefix(a, "--host="); ok {
			c.host, args = v, args[1:]
			continue
		}
		switch a {
		case "-h", "--help", "-help":
			args = []string{"help"}
		case "-v", "--version":
			args = []string{"version"}
		}
		break
	}
	if len(args) == 0 {
		printVerbs(stdout)
		return 0
	}
	if args[0] == "serve" {
		err := cmdServe(args[1:])
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return c.exit(verbServe, err)
	}
	v := findVerb(args[0])
	if v == nil || strings.Contains(args[0], " ") {
		return c.exit(nil, &usageError{msg: fmt.Sprintf("unknown command %q", args[0])})
	}
	return c.exit(v, v.run(c, v, args[1:]))
}

// exit reports err and returns the exit code for it.
func (c *cli) exit(v *verb, err error) int {
	var ue *usageError
	var ee exitError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ee):
		return int(ee)
	case errors.As(err, &ue):
		fmt.Fprintf(c.stderr, "den: %s\n", ue.msg)
		if ue.verb != "" {
			fmt.Fprintf(c.stderr, "Run 'den %s -h' for usage.\n", ue.verb)
		} else {
			fmt.Fprintf(c.stderr, "Run 'den help' for usage.\n")
		}
		return 2
	}
	c.report(v, err)
	return 1
}

// report prints an error, and a hint when one helps.
func (c *cli) report(v *verb, err error) {
	fmt.Fprintf(c.stderr, "den: %s\n", err)
	if h := hint(v, err); h != "" {
		fmt.Fprintf(c.stderr, "hint: %s\n", h)
	}
}

func hint(v *verb, err error) string {
	var e *api.Error
	if !errors.As(err, &e) {
		return ""
	}
	h := kindHint(v, e)
	// No hint when the daemon's message already names the command.
	if _, rest, ok := strings.Cut(h, "`"); ok {
		cmd, _, _ := strings.Cut(rest, "`")
		if strings.Contains(e.Message, strings.TrimSuffix(cmd, " ID")) {
			return ""
		}
	}
	return h
}

// procVerbs are the verbs that name a background process.
var procVerbs = map[string]bool{"logs": true, "attach": true, "kill": true, "wait": true}

func kindHint(v *verb, e *api.Error) string {
	name := ""
	if v != nil {
		name = v.name
	}
	images := strings.HasPrefix(name, "image")
	switch e.Kind {
	case api.KindNotFound:
		if images {
			return "run `den image ls` to see images"
		}
		if strings.Contains(strings.ToLower(e.Message), "image") {
			return "run `den image ls` to see images, `den image pull` or `den image import` to add one"
		}
		if name == "cp" && !strings.Contains(strings.ToLower(e.Message), "sandbox") {
			return "" // a missing file, most likely
		}
		if procVerbs[name] && strings.Contains(strings.ToLower(e.Message), "process") {
			return "run `den ps ID` to see the sandbox's processes"
		}
		if name == "sessions rm" && strings.Contains(strings.ToLower(e.Message), "session") {
			return "run `den sessions ID` to see the sandbox's sessions"
		}
		if name == "port rm" && strings.Contains(strings.ToLower(e.Message), "not shared") {
			return "run `den port ls ID` to see the shared ports"
		}
		if strings.HasPrefix(name, "secret") {
			return "run `den secret ls` to see the secrets"
		}
		if strings.HasPrefix(name, "token") {
			return "run `den token ls` to see the tokens"
		}
		return "run `den ls` to see sandboxes"
	case api.KindUnauthorized:
		if strings.Contains(e.Message, "admin") {
			return "this needs the admin's credentials: the root-only unix socket, or the daemon's own token"
		}
		return "set DEN_TOKEN to the daemon's token (the file token in its data directory, /var/lib/den/token by default) or to a scoped token from `den token create`"
	case api.KindConflict:
		switch name {
		case "rm":
			return "use `den rm -f` to remove a running sandbox"
		case "image rm":
			return "remove the sandboxes that use the image first"
		case "exec", "cp", "shell", "stats", "sessions", "sessions rm":
			return "a stopped sandbox must be started first: `den start ID`"
		}
	}
	return ""
}

// client returns the SDK client for the host chosen by --host.
func (c *cli) client(f *flagSet) *client.Client {
	host := f.host
	if host == "" {
		host = c.host
	}
	return client.New(host)
}

// printJSON prints v as indented JSON.
func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// printResult prints what a verb made or changed: v as JSON with --json,
// else line.
func (c *cli) printResult(jsonOut bool, v any, line string) error {
	if jsonOut {
		return c.printJSON(v)
	}
	fmt.Fprintln(c.stdout, line)
	return nil
}

// shortID is the 12-character form of an id shown in tables.
func shortID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
