// Package reexec runs what den re-executes its own binary as: a sandbox's
// init (the den agent as PID 1 of a linux-tier box, the agent of a gVisor
// sandbox, a microVM's /init) and the helper that holds a user namespace
// open. den's main calls Run first; so do the TestMains of test binaries
// that run sandboxes in process (the runtimes then re-execute the test
// binary).
package reexec

import (
	"os"

	"github.com/den-dev/den/internal/isolate/gvisor"
	"github.com/den-dev/den/internal/isolate/linux"
	"github.com/den-dev/den/internal/isolate/microvm"
)

// Run runs, and does not return from, the part this process was started
// as, if args (os.Args[1:]) or the process say it is one; otherwise it
// returns.
func Run(args []string) {
	switch {
	case linux.IsInit(args):
		linux.Init()
	case gvisor.IsAgent(args):
		gvisor.AgentMain()
	case microvm.IsGuest():
		microvm.GuestMain()
	case len(args) > 0 && args[0] == "__userns-hold":
		linux.HoldUserns()
		os.Exit(0)
	}
}
