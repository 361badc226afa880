package gvisor

import (
	"fmt"

	"github.com/den-dev/den/internal/confine"
)

// confineLauncher confines the agent's launcher thread, as the linux tier
// does: commands get den's capability set, no_new_privs and its seccomp
// filter, enforced by gVisor's sentry.
func confineLauncher() error {
	if err := confine.Apply(confine.Default()); err != nil {
		return fmt.Errorf("confine commands: %w", err)
	}
	return nil
}
