package store

import (
	"context"
	"errors"
	"testing"
)

func TestObjects(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	put := func(kind, id, name, owner string) error {
		return db.PutObject(ctx, &Object{Kind: kind, ID: id, Name: name, Owner: owner, Doc: []byte(`{"id":"` + id + `"}`)})
	}
	for _, o := range [][4]string{{"snapshot", "abcd1111", "first", "sb1"}, {"snapshot", "abcd2222", "", "sb2"}, {"volume", "abcd1111", "first", ""}} {
		if err := put(o[0], o[1], o[2], o[3]); err != nil {
			t.Fatal(err)
		}
	}
	if err := put("snapshot", "ffff0000", "first", "sb1"); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate name: %v", err)
	}
	for q, want := range map[string]string{"abcd1111": "abcd1111", "first": "abcd1111", "abcd2": "abcd2222"} {
		o, err := db.GetObject(ctx, "snapshot", q)
		if err != nil || o.ID != want || o.Kind != "snapshot" {
			t.Fatalf("get %q: %+v %v", q, o, err)
		}
	}
	if _, err := db.GetObject(ctx, "snapshot", "abcd"); !errors.Is(err, ErrConflict) {
		t.Fatalf("ambiguous prefix: %v", err)
	}
	if _, err := db.GetObject(ctx, "snapshot", "abc"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("short prefix: %v", err)
	}
	if _, err := db.GetObject(ctx, "snapshot", "zzzz"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	all, _ := db.ListObjects(ctx, "snapshot", "")
	mine, _ := db.ListObjects(ctx, "snapshot", "sb1")
	if len(all) != 2 || len(mine) != 1 || mine[0].Name != "first" || string(mine[0].Doc) != `{"id":"abcd1111"}` {
		t.Fatalf("list: %d %v", len(all), mine)
	}
	if err := db.DeleteObject(ctx, "snapshot", "abcd1111"); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteObject(ctx, "snapshot", "abcd1111"); err != nil {
		t.Fatal(err)
	}
	if o, err := db.GetObject(ctx, "volume", "first"); err != nil || o.ID != "abcd1111" {
		t.Fatalf("other kind touched: %v", err)
	}
}
