package sandbox

import (
	"strings"
	"testing"

	"github.com/den-dev/den/api"
)

func TestCheckShmSize(t *testing.T) {
	for _, tc := range []struct {
		size, mem api.Size
		want      string // "" for accepted
	}{
		{0, 0, ""},
		{1 << 20, 512 << 20, ""},
		{512 << 20, 512 << 20, ""},
		{64 << 30, 0, ""},
		{1 << 10, 0, "less than 1m"},
		{1<<20 - 1, 0, "less than 1m"},
		{513 << 20, 512 << 20, "memory limit 512m"},
		{64<<30 + 1<<20, 0, "more than 64g"},
	} {
		err := checkShmSize(tc.size, tc.mem)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("checkShmSize(%d, %d) = %v, want %q", tc.size, tc.mem, err, tc.want)
		}
	}
}
