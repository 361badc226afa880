package client

import (
	"context"
	"errors"
	"testing"

	"github.com/den-dev/den/api"
)

func TestSecrets(t *testing.T) {
	t.Setenv("DEN_TOKEN", "")
	t.Setenv("DEN_DATA", t.TempDir())
	f := newFake(t, true)
	c := New(f.host)
	ctx := context.Background()

	// The value goes as raw bytes, not JSON.
	f.reset(nil)
	if err := c.SetSecret(ctx, "TOKEN", []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	r := f.last()
	if ct := r.Header.Get("Content-Type"); ct != "application/octet-stream" || string(r.Body) != `{"a":1}` {
		t.Errorf("set secret sent Content-Type %q, body %q", ct, r.Body)
	}

	// An empty list is an empty slice.
	f.reset(jsonAnswer(200, []string{}))
	if names, err := c.Secrets(ctx); err != nil || names == nil || len(names) != 0 {
		t.Errorf("Secrets = %#v, %v", names, err)
	}

	f.reset(jsonAnswer(404, api.ErrorDoc{Error: &api.Error{Kind: api.KindNotFound, Message: `no secret "X"`}}))
	var e *api.Error
	if err := c.DeleteSecret(ctx, "X"); !errors.As(err, &e) || e.Kind != api.KindNotFound {
		t.Errorf("DeleteSecret of a missing secret: %v", err)
	}
	f.reset(jsonAnswer(400, api.ErrorDoc{Error: &api.Error{Kind: api.KindInvalid, Field: "value", Message: "a secret is 1 byte to 64 KiB"}}))
	if err := c.SetSecret(ctx, "X", nil); !errors.As(err, &e) || e.Kind != api.KindInvalid {
		t.Errorf("SetSecret of an empty value: %v", err)
	}

	// No name: no request.
	f.reset(nil)
	for _, err := range []error{c.SetSecret(ctx, "", []byte("x")), c.DeleteSecret(ctx, "")} {
		if !errors.As(err, &e) || e.Kind != api.KindInvalid {
			t.Errorf("no name: %v", err)
		}
	}
	f.mu.Lock()
	n := len(f.reqs)
	f.mu.Unlock()
	if n != 0 {
		t.Errorf("%d requests without a secret name", n)
	}
}
