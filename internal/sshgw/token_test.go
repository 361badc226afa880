package sshgw_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// Revoking a token ends its open SSH sessions, with the revocation as the
// reason on stderr, not only its next logins.
func TestRevokeEndsSSHSession(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	tok, err := e.h.CreateToken(ctx, api.TokenRequest{Name: "ssh-revoked"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.h.PrincipalForToken(ctx, tok.ID)
	if err != nil {
		t.Fatal(err)
	}
	tc := e.ip.Client(p)
	box, err := tc.Create(ctx, api.CreateRequest{Name: "revoked-box"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Remove(ctx, box.ID, true)
	key := filepath.Join(e.dir, "revoked_key")
	if err := keygen(key); err != nil {
		t.Fatal(err)
	}
	if _, err := e.addKey(tc, key, ""); err != nil {
		t.Fatal(err)
	}
	// A session that would run for ten minutes, bounded at one by the test.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, "ssh", append(append(e.sshArgs(key, "-p"), "revoked-box@127.0.0.1"), "echo started; sleep 600")...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "started\n" {
		t.Fatalf("the session did not start: %q %v; stderr %q", line, err, stderr.String())
	}
	if err := e.h.RemoveToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if cctx.Err() != nil {
		t.Fatalf("the session of a revoked token was still open after a minute (stderr %q)", stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 255 || !strings.Contains(stderr.String(), "revoked") {
		t.Fatalf("the session ended with %v, stderr %q; want status 255 and the revocation named", err, stderr.String())
	}
}
