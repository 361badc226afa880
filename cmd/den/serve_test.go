package main

import (
	"net/http"
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

func TestInfoStorage(t *testing.T) {
	info := api.Info{Version: "x", Storage: "btrfs", StorageSize: 200 << 30, StorageReserve: 10 << 30, DefaultDisk: 10 << 30}
	host := miniDaemon(t, func(mux *http.ServeMux) {
		mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) { replyJSON(w, 200, info) })
	})
	r := den(t, nil, "", "--host", host, "info")
	if r.code != 0 || !strings.Contains(r.stdout, "storage btrfs (200.0GiB, reserve 10.0GiB, default disk 10.0GiB)") {
		t.Fatalf("den info: %+v", r)
	}
}

// Host-name previews on localhost need a TCP listener a browser on this
// host reaches through loopback.
func TestLoopbackTCP(t *testing.T) {
	for _, tc := range []struct {
		listens []string
		want    bool
	}{
		{[]string{"unix:///run/den/den.sock"}, false},
		{[]string{"unix:///run/den/den.sock", "tcp://127.0.0.1:7420"}, true},
		{[]string{"tcp://127.0.0.2:7420"}, true},
		{[]string{"tcp://localhost:7420"}, true},
		{[]string{"tcp://[::1]:7420"}, true},
		{[]string{"tcp://0.0.0.0:7420"}, true},
		{[]string{"tcp://[::]:7420"}, true},
		{[]string{"tcp://:7420"}, true},
		{[]string{"tcp://10.0.0.5:7420"}, false},
		{[]string{"tcp://den.example.com:7420"}, false},
	} {
		if got := loopbackTCP(tc.listens); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.listens, got, tc.want)
		}
	}
}
