package main

import (
	"strings"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/storage"
)

func TestDefaultDiskFlag(t *testing.T) {
	st, err := storage.Open(storage.Config{Dir: t.TempDir(), Mode: "dir"})
	if err != nil {
		t.Fatal(err)
	}
	auto := api.Size(min(10<<30, st.Size()/4))
	for v, want := range map[string]api.Size{"auto": auto, "": auto, "0": 0, "none": 0, "5g": 5 << 30, "64m": 64 << 20} {
		if _, _, err := parseDefaultDisk(v); err != nil {
			t.Errorf("--default-disk %q: %v", v, err)
		}
		if got := defaultDisk(v, st); got != want {
			t.Errorf("--default-disk %q: %v, want %v", v, got, want)
		}
	}
	for v, msg := range map[string]string{"12q": "want a size", "-1g": "want a size", "1m": "below the minimum"} {
		if _, _, err := parseDefaultDisk(v); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("--default-disk %q: %v, want an error with %q", v, err, msg)
		}
	}
	r := den(t, nil, "", "serve", "--default-disk", "lots")
	if r.code != 2 || !strings.Contains(r.stderr, "--default-disk") {
		t.Errorf("den serve --default-disk lots: %+v", r)
	}
}
