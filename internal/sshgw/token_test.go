package sshgw_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/den-dev/den/api"
)

// A key added with a scoped token acts for that token: its sandboxes only,
// and nothing once the token is revoked.
func TestTokenKeyScope(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	tok, err := e.h.CreateToken(ctx, api.TokenRequest{Name: "ssh-agent-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.h.RemoveToken(ctx, tok.ID)
	p, err := e.h.PrincipalForToken(ctx, tok.ID)
	if err != nil {
		t.Fatal(err)
	}
	tc := e.ip.Client(p)
	box, err := tc.Create(ctx, api.CreateRequest{Name: "tok-box"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Remove(ctx, box.ID, true)
	key := filepath.Join(e.dir, "token_key")
	if err := keygen(key); err != nil {
		t.Fatal(err)
	}
	k, err := e.addKey(tc, key, "")
	if err != nil {
		t.Fatal(err)
	}
	if k.Owner != tok.ID {
		t.Fatalf("the key's owner is %q, want the token %s", k.Owner, tok.ID)
	}
	// The token sees its own key only, and cannot remove the admin's.
	keys, err := tc.SSHKeys(ctx)
	if err != nil || len(keys) != 1 || keys[0].ID != k.ID {
		t.Fatalf("the token's keys: %+v (%v), want only %s", keys, err, k.ID)
	}
	admin, err := e.c.SSHKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ak := range admin {
		if ak.Owner == "" {
			if err := tc.RemoveSSHKey(ctx, ak.ID); err == nil || err.(*api.Error).Kind != api.KindNotFound {
				t.Errorf("the token removing the admin's key: %v, want not_found", err)
			}
		}
	}
	// The token cannot restrict a key to a sandbox it does not see.
	other := filepath.Join(e.dir, "token_key2")
	if err := keygen(other); err != nil {
		t.Fatal(err)
	}
	if _, err := e.addKey(tc, other, "sshbox"); err == nil || err.(*api.Error).Kind != api.KindInvalid {
		t.Errorf("a token's key for the admin's sandbox: %v, want invalid (no such sandbox)", err)
	}

	if r := e.ssh(t, nil, key, "tok-box", "echo mine"); r.code != 0 || r.stdout != "mine\n" {
		t.Fatalf("the token's key in its own sandbox: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	// Another owner's sandbox is refused, by name and by id.
	r := e.ssh(t, nil, key, "sshbox", "true")
	e.checkRefused(t, r, k.Fingerprint, "user=sshbox")
	r = e.ssh(t, nil, key, e.box.ID, "true")
	e.checkRefused(t, r, k.Fingerprint, "user="+e.box.ID)
	// A revoked token's keys are refused.
	if err := e.h.RemoveToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	r = e.ssh(t, nil, key, "tok-box", "true")
	e.checkRefused(t, r, k.Fingerprint, "its principal is gone")
}
