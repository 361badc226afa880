package main

import (
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"testing"
)

// miniDaemon serves a few routes of den's API on a unix socket, for tests
// of verbs the fake daemon does not know; it returns the --host value.
func miniDaemon(t *testing.T, routes func(mux *http.ServeMux)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "den.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	routes(mux)
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "unix://" + sock
}

// replyJSON answers with status and v as JSON.
func replyJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
