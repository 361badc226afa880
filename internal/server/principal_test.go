package server

import (
	"context"
	"net/http"
	"testing"
)

func TestInProcessCarriesPrincipal(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) {
		p := PrincipalFrom(r.Context())
		if p == nil {
			writeJSON(w, 200, map[string]string{"version": "none"})
			return
		}
		writeJSON(w, 200, map[string]string{"version": p.Name})
	})
	ip := NewInProcess(mux)
	defer ip.Close()
	for _, name := range []string{"alice", "bob"} {
		c := ip.Client(&Principal{TokenID: "t-" + name, Name: name})
		v, err := c.Version(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if v.Version != name {
			t.Fatalf("principal %s: handler saw %q", name, v.Version)
		}
	}
	ip.Close()
	if _, err := ip.Client(AdminPrincipal).Version(context.Background()); err == nil {
		t.Fatal("a closed in-process server still answered")
	}
}
