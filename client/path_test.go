package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/den-dev/den/api"
)

// TestDotSegmentsRefused checks that "." and ".." are refused as the id
// or name in every path the client builds, before any request: escaping
// leaves them as they are, and the server's router would resolve them as
// a path step to another route (GET /v1/sandboxes/.. is GET /v1). An
// ordinary id from the same calls does reach the server.
func TestDotSegmentsRefused(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.EscapedPath())
		w.WriteHeader(404)
	}))
	defer srv.Close()
	c := New(srv.URL)
	ctx := context.Background()
	calls := map[string]func(s string) error{
		"sandbox":  func(s string) error { _, err := c.Get(ctx, s); return err },
		"process":  func(s string) error { _, err := processPath("sb1", s, ""); return err },
		"image":    func(s string) error { _, err := imagePath(s); return err },
		"secret":   func(s string) error { _, err := secretPath(s); return err },
		"snapshot": func(s string) error { _, err := objectPath("/v1/snapshots/", "snapshot", s); return err },
		"session":  func(s string) error { return c.CloseSession(ctx, "sb1", s) },
		"ssh key":  func(s string) error { return c.RemoveSSHKey(ctx, s) },
		"token":    func(s string) error { return c.RemoveToken(ctx, s) },
	}
	for what, call := range calls {
		if err := call("ok1"); api.KindOf(err) == api.KindInvalid {
			t.Errorf("%s ok1 refused: %v", what, err)
		}
		for _, s := range []string{".", ".."} {
			got = nil
			err := call(s)
			if api.KindOf(err) != api.KindInvalid || len(got) != 0 {
				t.Errorf("%s %q: %v, requests %q; want an invalid-request error and no request", what, s, err, got)
			}
		}
	}
}
