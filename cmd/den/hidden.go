package main

import (
	"os"

	"github.com/den-dev/den/internal/isolate/gvisor"
	"github.com/den-dev/den/internal/isolate/linux"
	"github.com/den-dev/den/internal/isolate/microvm"
)

// runHidden runs the verbs den uses internally: a sandbox's init (the den
// agent as PID 1: in a linux box, in a gVisor sandbox, or a microVM's
// /init) and the helper that holds a user namespace open.
func runHidden(args []string) (handled bool) {
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
	return false
}
