//go:build !(linux && amd64)

package confine

import (
	"errors"
	"testing"
)

func TestUnsupportedPlatform(t *testing.T) {
	if err := Apply(Default()); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Apply = %v, want errors.ErrUnsupported", err)
	}
	if _, err := Filter(); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Filter = %v, want errors.ErrUnsupported", err)
	}
}
