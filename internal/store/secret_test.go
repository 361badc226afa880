package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
)

func TestSecrets(t *testing.T) {
	ctx := context.Background()
	db, err := Open(filepath.Join(t.TempDir(), "den.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.GetSecret(ctx, "TOKEN"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing secret: %v", err)
	}
	db.PutSecret(ctx, "TOKEN", []byte("s3cret"))
	db.PutSecret(ctx, "TOKEN", []byte("s3cret2"))
	db.PutSecret(ctx, "A", []byte("x"))
	if v, err := db.GetSecret(ctx, "TOKEN"); err != nil || string(v) != "s3cret2" {
		t.Fatalf("get: %q %v", v, err)
	}
	if names, _ := db.SecretNames(ctx); len(names) != 2 || names[0] != "A" || names[1] != "TOKEN" {
		t.Fatalf("names: %v", names)
	}
	db.DeleteSecret(ctx, "TOKEN")
	db.DeleteSecret(ctx, "TOKEN")
	if _, err := db.GetSecret(ctx, "TOKEN"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}
