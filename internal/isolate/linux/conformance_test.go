package linux

import (
	"testing"

	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/isolate/isolatetest"
)

func TestConformance(t *testing.T) {
	rt := newRuntime(t)
	isolatetest.Run(t, isolatetest.Harness{
		Runtime: rt,
		Spec:    func(t *testing.T, id string) *isolate.Spec { return testSpec(t, rt, id) },
	})
}
