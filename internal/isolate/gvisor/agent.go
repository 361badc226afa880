package gvisor

import (
	"fmt"
	"os"

	"github.com/den-dev/den/internal/agent"
	"golang.org/x/sys/unix"
)

// agentArg is the hidden argv[1] that makes the den binary a gVisor box's
// agent.
const agentArg = "__gvisor-agent"

// Where the den binary appears inside a box: a read-only bind mount of a
// root-owned host directory, under /dev (gVisor's own tmpfs), so it never
// touches the box's upper layer and the box cannot change it.
const (
	agentDir  = "/dev/.den"
	agentPath = agentDir + "/den"
)

// hideNetArg, after agentArg, makes the binary a helper on the host
// (not an agent): in the mount namespace its parent unshared for it, it
// hides /proc/sys/net under an empty tmpfs and executes the rest of its
// argv (runsc run or restore of a networked box; see launch).
const hideNetArg = "--exec-hiding-sys-net"

func execHidingSysNet(argv []string) {
	if err := unix.Mount("tmpfs", "/proc/sys/net", "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0"); err != nil {
		fmt.Fprintf(os.Stderr, "den: hide /proc/sys/net: %v\n", err)
		os.Exit(127)
	}
	err := unix.Exec(argv[0], argv, os.Environ())
	fmt.Fprintf(os.Stderr, "den: exec %s: %v\n", argv[0], err)
	os.Exit(127)
}

// IsAgent reports whether argv (os.Args[1:]) is a gVisor box's agent
// invocation.
func IsAgent(args []string) bool { return len(args) > 0 && args[0] == agentArg }

// AgentMain is the body of a gVisor box's PID 1: the den agent, serving
// its link on stdin and stdout (FIFOs the daemon reopens after a restart
// or a restore). It never returns.
func AgentMain() {
	if len(os.Args) > 3 && os.Args[2] == hideNetArg {
		execHidingSysNet(os.Args[3:])
	}
	// No process of the box may ptrace or read the agent's memory and fds.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	pids, err := agentPidsLimit(os.Args[2:])
	if err == nil {
		err = limitProcs(pids)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "den agent: %v\n", err)
		os.Exit(1)
	}
	// runsc set the hostname from the OCI spec; name it in /etc/hosts.
	if h, err := os.Hostname(); err == nil {
		if err := agent.NameInHosts("/", h); err != nil {
			fmt.Fprintf(os.Stderr, "den agent: name the sandbox in /etc/hosts: %v\n", err)
		}
	}
	a, err := agent.New(agent.Options{Confine: confineLauncher, SetPids: limitProcs})
	if err != nil {
		fmt.Fprintf(os.Stderr, "den agent: %v\n", err)
		os.Exit(1)
	}
	err = a.ServeLink(os.Stdin, os.Stdout)
	fmt.Fprintf(os.Stderr, "den agent: %v\n", err)
	os.Exit(1)
}
