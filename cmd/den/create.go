package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/den-dev/den/api"
)

var verbCreate = &verb{
	name:     "create",
	summary:  "create a sandbox and print its id",
	synopsis: "[flags]",
	details: `A sandbox has no network (loopback only) unless --net, --allow or
--allow-cidr says otherwise; see den net set -h.

` + netFlagsDetails,
	example: `den create --image alpine:3.20 --memory 512m --ttl 1h --label task=42
		den create --name dev --idle-timeout 30m
		den create --allow pypi.org --allow '*.pythonhosted.org' --max-egress 2g --bandwidth 5m
		den create --allow api.example.com --secret-header 'api.example.com=Authorization: Bearer ${TOKEN}'
		den create --name fix --git ~/src/app --branch main   # then den diff fix, den export fix --branch agent/fix
		den exec "$(den create)" -- uname -a`,
	run: cmdCreate,
}

// sandboxOpts are the flags that describe a new sandbox (den create, den run).
type sandboxOpts struct {
	name, image, workdir, user string
	runtime                    string
	env, labels                []string
	cpus                       float64
	memory, shmSize            api.Size
	pids                       int
	ttl, idleTimeout           api.Duration
	idleAction, from           string
	stopSignal                 string
	stopTimeout                *api.Duration
	disk                       api.Size
	volumes, mounts            []string
	net                        netOpts
	git, gitBranch, gitAuthor  string
}

func (o *sandboxOpts) define(f *flagSet) {
	f.Var(stringValue{&o.name}, "name", "", "NAME", "name the sandbox")
	f.Var(stringValue{&o.image}, "image", "", "IMAGE", `image to run (default "host")`)
	f.Var(stringValue{&o.runtime}, "runtime", "", "TIER", "isolation tier: linux (namespaces), gvisor (a second kernel) or microvm (a virtual machine); default the daemon's (den info)")
	f.Var(listValue{&o.env, checkEnv}, "env", "e", "K=V", "set an environment variable (repeatable; -e K passes den's own $K)")
	f.Var(stringValue{&o.workdir}, "workdir", "w", "DIR", "working directory of commands")
	f.Var(stringValue{&o.user}, "user", "u", "USER", "user (name or uid[:gid]) commands run as")
	f.Var(floatValue{&o.cpus}, "cpus", "", "N", "CPU limit in CPUs, like 1.5")
	f.Var(sizeValue{&o.memory}, "memory", "m", "SIZE", "memory limit, like 512m or 2g")
	f.Var(sizeValue{&o.shmSize}, "shm-size", "", "SIZE", "size of /dev/shm, like 256m or 1g (default 64m; at most the memory limit)")
	f.Var(intValue{&o.pids}, "pids", "", "N", "limit on the number of processes")
	f.Var(durationValue{&o.ttl}, "ttl", "", "DURATION", "remove the sandbox after this long, like 1h")
	f.Var(durationValue{&o.idleTimeout}, "idle-timeout", "", "DURATION", "stop the sandbox after this long without exec, file or process activity, like 30m (files are kept; den start resumes it)")
	f.Var(stringValue{&o.idleAction}, "idle-action", "", "ACTION", "what the idle timeout does: stop (default), pause (freeze, memory kept) or hibernate (memory freed, files kept); any use resumes the sandbox")
	f.Var(stringValue{&o.stopSignal}, "stop-signal", "", "SIGNAL", "signal den stop (and the idle timeout) sends every process first, like INT or SIGQUIT (default TERM)")
	f.Var(optDurationValue{&o.stopTimeout}, "stop-timeout", "", "DURATION", "how long den stop waits for the processes after the stop signal before it kills them, like 30s (default 10s; 0 kills at once; at most 5m)")
	f.Var(sizeValue{&o.disk}, "disk", "", "SIZE", "disk quota of the sandbox's own files, like 10g (enforced by the kernel; default: the daemon's --default-disk, see den info)")
	f.Var(stringValue{&o.from}, "from", "", "SNAPSHOT", "start from a snapshot's files (and its image and settings unless flags say otherwise)")
	f.Var(listValue{&o.volumes, checkVolume}, "volume", "v", "NAME:/PATH[:ro]", "attach a volume (den volume create; repeatable)")
	f.Var(listValue{&o.mounts, checkMount}, "mount", "", "type=bind,src=DIR,dst=/PATH[,ro]", "bind a host directory the daemon allows (den serve --allow-mount; repeatable)")
	f.Var(listValue{&o.labels, checkLabel}, "label", "l", "K=V", "set a label (repeatable)")
	f.Var(stringValue{&o.git}, "git", "", "URL|PATH", "clone a repository into /workspace on a new branch den/<id> (a PATH on the daemon's host: admin only; see den diff, den export)")
	f.Var(stringValue{&o.gitBranch}, "branch", "", "BRANCH", "with --git: the branch or tag to start from (default the repository's default branch)")
	f.Var(stringValue{&o.gitAuthor}, "git-author", "", "'NAME <EMAIL>'", "with --git: who git commit inside commits as (default the host repository's user.name and user.email, else den <den@localhost>)")
	o.net.define(f)
}

// request returns the create request the flags describe; v is the verb,
// for errors in the network flags, and stderr takes their warnings.
func (o *sandboxOpts) request(v *verb, stderr io.Writer) (api.CreateRequest, error) {
	network, err := o.net.policy(v, stderr)
	if err != nil {
		return api.CreateRequest{}, err
	}
	var vols []api.VolumeMount
	for _, s := range o.volumes {
		vm, _ := parseVolume(s)
		vols = append(vols, vm)
	}
	var mounts []api.BindMount
	for _, s := range o.mounts {
		bm, _ := parseMount(s)
		mounts = append(mounts, bm)
	}
	var git *api.GitSource
	if o.git != "" {
		git = &api.GitSource{URL: gitSource(o.git), Branch: o.gitBranch, Author: o.gitAuthor}
	} else if o.gitBranch != "" {
		return api.CreateRequest{}, usagef(v, "--branch goes with --git URL|PATH")
	} else if o.gitAuthor != "" {
		return api.CreateRequest{}, usagef(v, "--git-author goes with --git URL|PATH")
	}
	return api.CreateRequest{
		Git:         git,
		Name:        o.name,
		Image:       o.image,
		Runtime:     o.runtime,
		Labels:      labelMap(o.labels),
		Env:         o.env,
		Workdir:     o.workdir,
		User:        o.user,
		Limits:      api.Limits{CPUs: o.cpus, Memory: o.memory, Pids: o.pids, Disk: o.disk},
		ShmSize:     o.shmSize,
		TTL:         o.ttl,
		IdleTimeout: o.idleTimeout,
		IdleAction:  o.idleAction,
		StopSignal:  o.stopSignal,
		StopTimeout: o.stopTimeout,
		Network:     network,
		From:        o.from,
		Volumes:     vols,
		Mounts:      mounts,
	}, nil
}

func cmdCreate(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	var o sandboxOpts
	o.define(f)
	jsonOut := f.jsonFlag("print the sandbox as JSON")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef(v, "create takes no arguments (got %q); to run a command use `den run`", pos[0])
	}
	req, err := o.request(v, c.stderr)
	if err != nil {
		return err
	}
	sb, err := c.client(f).Create(context.Background(), req)
	if err != nil {
		return err
	}
	if *jsonOut {
		return c.printJSON(sb)
	}
	_, err = fmt.Fprintln(c.stdout, sb.ID)
	return err
}

// gitSource makes a local directory given to --git absolute (the daemon
// runs elsewhere); URLs pass unchanged.
func gitSource(s string) string {
	if strings.Contains(s, "://") || strings.HasPrefix(s, "/") {
		return s
	}
	if st, err := os.Stat(s); err == nil && st.IsDir() {
		if abs, err := filepath.Abs(s); err == nil {
			return abs
		}
	}
	return s
}

// parseVolume reads NAME:/PATH[:ro|:rw].
func parseVolume(s string) (api.VolumeMount, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") {
		return api.VolumeMount{}, fmt.Errorf("%q: want NAME:/PATH or NAME:/PATH:ro", s)
	}
	vm := api.VolumeMount{Name: parts[0], Path: parts[1]}
	if len(parts) == 3 {
		switch parts[2] {
		case "ro":
			vm.ReadOnly = true
		case "rw":
		default:
			return api.VolumeMount{}, fmt.Errorf("%q: the third part must be ro or rw", s)
		}
	}
	return vm, nil
}

func checkVolume(s string) (string, error) {
	_, err := parseVolume(s)
	return s, err
}

// parseMount reads Docker's --mount form: type=bind,src=DIR,dst=/PATH[,ro].
func parseMount(s string) (api.BindMount, error) {
	var bm api.BindMount
	for _, kv := range strings.Split(s, ",") {
		k, v, hasV := strings.Cut(kv, "=")
		switch k {
		case "type":
			if v != "bind" {
				return bm, fmt.Errorf("%q: only type=bind is supported (use --volume for volumes)", s)
			}
		case "src", "source":
			bm.Source = v
		case "dst", "destination", "target":
			bm.Target = v
		case "ro", "readonly":
			bm.ReadOnly = !hasV || v == "true" || v == "1"
		default:
			return bm, fmt.Errorf("%q: unknown key %q (want type, src, dst, ro)", s, k)
		}
	}
	if !strings.HasPrefix(bm.Source, "/") || !strings.HasPrefix(bm.Target, "/") {
		return bm, fmt.Errorf("%q: src and dst must be absolute paths", s)
	}
	return bm, nil
}

func checkMount(s string) (string, error) {
	_, err := parseMount(s)
	return s, err
}
