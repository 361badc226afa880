package sandbox

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/store"
)

func credentials(t *testing.T) (*Credentials, *store.DB) {
	db, err := store.Open(filepath.Join(t.TempDir(), "den.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return NewCredentials(db, nil), db
}

func wantKind(t *testing.T, what string, err error, kind string) {
	t.Helper()
	if api.KindOf(err) != kind {
		t.Errorf("%s: %v, want a %s error", what, err, kind)
	}
}

// events are the data of the events of type typ, oldest first.
func events(t *testing.T, db *store.DB, typ string) []map[string]any {
	evs, err := db.Events(context.Background(), store.EventFilter{Type: typ})
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, e := range evs {
		var d map[string]any
		json.Unmarshal(e.Data, &d)
		d["sandbox"] = e.Sandbox
		out = append(out, d)
	}
	return out
}

// A token is kept as the hash of its secret: the secret finds it, a secret
// one character off does not, the store never holds the secret, and
// removing it calls revoke before it records the removal.
func TestCredentialsTokens(t *testing.T) {
	c, db := credentials(t)
	ctx := context.Background()
	tok, err := c.CreateToken(ctx, api.TokenRequest{Name: "agent-1", MaxSandboxes: 2, Memory: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok.Token, TokenPrefix) || len(tok.ID) != 16 || tok.MaxSandboxes != 2 || tok.Memory != 64<<20 || tok.CreatedAt.IsZero() {
		t.Fatalf("created %+v", tok)
	}
	got, err := c.TokenForSecret(ctx, tok.Token)
	if err != nil || got.ID != tok.ID || got.Name != "agent-1" || got.MaxSandboxes != 2 || got.Token != "" {
		t.Fatalf("TokenForSecret of the secret: %+v, %v", got, err)
	}
	last := tok.Token[len(tok.Token)-1]
	wrong := tok.Token[:len(tok.Token)-1] + string(last^1)
	_, err = c.TokenForSecret(ctx, wrong)
	wantKind(t, "a secret one character off", err, api.KindNotFound)
	if got, err := c.Token(ctx, tok.ID); err != nil || got.Name != "agent-1" {
		t.Fatalf("Token by id: %+v, %v", got, err)
	}
	_, err = c.Token(ctx, tok.ID[:8])
	wantKind(t, "Token by an id prefix", err, api.KindNotFound)
	_, err = c.Token(ctx, "agent-1")
	wantKind(t, "Token by name", err, api.KindNotFound)
	_, err = c.CreateToken(ctx, api.TokenRequest{Name: "agent-1"})
	wantKind(t, "a second token of the same name", err, api.KindExists)

	objs, err := db.ListObjects(ctx, tokenKind, "")
	if err != nil || len(objs) != 1 {
		t.Fatalf("stored tokens: %d, %v", len(objs), err)
	}
	if strings.Contains(string(objs[0].Doc), tok.Token) || strings.Contains(string(objs[0].Doc), tok.Token[len(TokenPrefix):]) {
		t.Fatalf("the store holds the secret: %s", objs[0].Doc)
	}
	list, err := c.Tokens(ctx)
	if err != nil || len(list) != 1 || list[0].ID != tok.ID || list[0].Token != "" {
		t.Fatalf("Tokens: %+v, %v", list, err)
	}

	revoked := ""
	err = c.RemoveToken(ctx, "no-such-token", func(id, name string) int { revoked = id; return 0 })
	wantKind(t, "removing an unknown token", err, api.KindNotFound)
	if revoked != "" {
		t.Fatalf("removing an unknown token revoked %s", revoked)
	}
	if err := c.RemoveToken(ctx, "agent-1", func(id, name string) int {
		if _, err := c.Token(ctx, id); err == nil {
			t.Errorf("revoke called while token %s is still stored", id)
		}
		revoked = id + " " + name
		return 3
	}); err != nil {
		t.Fatal(err)
	}
	if revoked != tok.ID+" agent-1" {
		t.Fatalf("revoke called for %q", revoked)
	}
	_, err = c.TokenForSecret(ctx, tok.Token)
	wantKind(t, "the secret of a removed token", err, api.KindNotFound)
	evs := events(t, db, "token.")
	if len(evs) != 2 || evs[0]["id"] != tok.ID || evs[1]["id"] != tok.ID || evs[1]["requests_ended"] != 3.0 {
		t.Fatalf("token events: %v", evs)
	}
}

// SSH keys: added with a new id and time, found by fingerprint, picked by
// id, name or prefix, and each change recorded against the key's sandbox.
func TestCredentialsSSHKeys(t *testing.T) {
	c, db := credentials(t)
	ctx := context.Background()
	a := &api.SSHKey{Name: "laptop", Type: "ssh-ed25519", Fingerprint: "SHA256:aaa", PublicKey: "ssh-ed25519 AAAA", Owner: "tok1", Sandbox: "sb1"}
	b := &api.SSHKey{Name: "laptop", Type: "ssh-ed25519", Fingerprint: "SHA256:bbb", PublicKey: "ssh-ed25519 BBBB"}
	for _, k := range []*api.SSHKey{a, b} {
		if err := c.AddSSHKey(ctx, k, "alice"); err != nil {
			t.Fatal(err)
		}
		if len(k.ID) != 32 || k.CreatedAt.IsZero() {
			t.Fatalf("added %+v", k)
		}
	}
	all, err := c.SSHKeys(ctx)
	if err != nil || len(all) != 2 {
		t.Fatalf("SSHKeys: %v, %v", all, err)
	}
	got, err := c.SSHKeyByFingerprint(ctx, "SHA256:aaa")
	if err != nil || got.ID != a.ID || got.Owner != "tok1" || got.Sandbox != "sb1" || !got.CreatedAt.Equal(a.CreatedAt) {
		t.Fatalf("SSHKeyByFingerprint: %+v, %v", got, err)
	}
	_, err = c.SSHKeyByFingerprint(ctx, "SHA256:ccc")
	wantKind(t, "an unknown fingerprint", err, api.KindNotFound)

	if k, err := FindSSHKey(all, a.ID); err != nil || k.ID != a.ID {
		t.Errorf("FindSSHKey by id: %+v, %v", k, err)
	}
	if k, err := FindSSHKey(all, b.ID[:store.MinPrefix]); err != nil || k.ID != b.ID {
		t.Errorf("FindSSHKey by prefix: %+v, %v", k, err)
	}
	_, err = FindSSHKey(all, b.ID[:store.MinPrefix-1])
	wantKind(t, "FindSSHKey by a prefix too short", err, api.KindNotFound)
	_, err = FindSSHKey(all, "laptop")
	wantKind(t, "FindSSHKey by a name two keys have", err, api.KindConflict)
	if k, err := FindSSHKey(all[:1], "laptop"); err != nil || k.Name != "laptop" {
		t.Errorf("FindSSHKey by a name one key has: %+v, %v", k, err)
	}

	if err := c.RemoveSSHKey(ctx, a, "bob"); err != nil {
		t.Fatal(err)
	}
	if all, err := c.SSHKeys(ctx); err != nil || len(all) != 1 || all[0].ID != b.ID {
		t.Fatalf("after removing one: %v, %v", all, err)
	}
	evs := events(t, db, "sshkey.")
	if len(evs) != 3 || evs[0]["key"] != a.ID || evs[0]["sandbox"] != "sb1" || evs[0]["by"] != "alice" ||
		evs[2]["key"] != a.ID || evs[2]["by"] != "bob" || evs[2]["fingerprint"] != "SHA256:aaa" {
		t.Fatalf("ssh key events: %v", evs)
	}
}
