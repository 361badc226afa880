//go:build !(linux && amd64)

package confine

import (
	"errors"
	"fmt"
	"runtime"
)

var errPlatform = fmt.Errorf("confine: %s/%s: %w", runtime.GOOS, runtime.GOARCH, errors.ErrUnsupported)

// Apply confines the calling thread; it is implemented for linux/amd64 only
// and returns an error wrapping errors.ErrUnsupported elsewhere.
func Apply(p Policy) error {
	if _, err := CapMask(p.Caps); err != nil {
		return fmt.Errorf("check policy: %w", err)
	}
	return errPlatform
}

// AllowedSyscalls returns nil: the allowlist is defined for linux/amd64 only.
func AllowedSyscalls() []int { return nil }

// Filter returns an error wrapping errors.ErrUnsupported: the seccomp filter
// is defined for linux/amd64 only.
func Filter() ([]SockFilter, error) { return nil, errPlatform }
