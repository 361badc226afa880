package main

import (
	"os"

	"github.com/den-dev/den/internal/isolate/linux"
)

// runHidden runs the verbs den uses internally: a sandbox's init (the den
// agent as PID 1) and the helper that holds a user namespace open.
func runHidden(args []string) (handled bool) {
	switch {
	case linux.IsInit(args):
		linux.Init()
	case len(args) > 0 && args[0] == "__userns-hold":
		linux.HoldUserns()
		os.Exit(0)
	}
	return false
}
