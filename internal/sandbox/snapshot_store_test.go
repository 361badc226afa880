package sandbox

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/storage"
)

func newTestSnapshotStore(t *testing.T) *snapshotStore {
	db, tr, dir, log := testStoreEnv(t)
	return &snapshotStore{trees: tr, db: db, dataDir: dir, log: log}
}

// Snapshot records are found by id, id prefix or name as the scope
// allows, listed per sandbox; a snapshot is verified against its manifest
// (none yet, a changed file: conflicts); removing one removes its record,
// manifest, saved memory and tree.
func TestSnapshotStore(t *testing.T) {
	ctx := context.Background()
	ss := newTestSnapshotStore(t)
	sb1, sb2 := newID(), newID()
	a := &api.Snapshot{ID: newID(), Name: "a", Sandbox: sb1, Owner: "tok1", Image: HostImage, CreatedAt: time.Now().UTC()}
	b := &api.Snapshot{ID: newID(), Name: "b", Sandbox: sb2, Owner: "tok2", Image: HostImage, CreatedAt: time.Now().UTC()}
	for _, s := range []*api.Snapshot{a, b} {
		if err := ss.put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := ss.put(ctx, &api.Snapshot{ID: newID(), Name: "a", Sandbox: sb1}); api.KindOf(err) != api.KindExists {
		t.Fatalf("a second snapshot named a: %v", err)
	}
	for _, key := range []string{a.ID, a.ID[:10], "a"} {
		if got, err := ss.get(ctx, key); err != nil || got.ID != a.ID {
			t.Fatalf("get %q: %+v, %v", key, got, err)
		}
	}
	if _, err := ss.get(ctx, ""); api.KindOf(err) != api.KindInvalid {
		t.Fatalf("get no id: %v", err)
	}
	tok1 := WithScope(ctx, &Scope{Owner: "tok1"})
	if _, err := ss.get(tok1, "b"); api.KindOf(err) != api.KindNotFound {
		t.Fatalf("tok1 gets tok2's snapshot: %v", err)
	}
	if l, err := ss.list(ctx, ""); err != nil || len(l) != 2 {
		t.Fatalf("list all: %v, %v", l, err)
	}
	if l, err := ss.list(ctx, sb2); err != nil || len(l) != 1 || l[0].ID != b.ID {
		t.Fatalf("list of sb2: %v, %v", l, err)
	}
	if l, err := ss.list(tok1, ""); err != nil || len(l) != 1 || l[0].ID != a.ID {
		t.Fatalf("list as tok1: %v, %v", l, err)
	}

	// Files, a manifest of them, saved memory.
	upper := filepath.Join(ss.dir(a.ID), "upper")
	os.MkdirAll(upper, 0o700)
	os.WriteFile(filepath.Join(upper, "f"), []byte("kept"), 0o600)
	if err := ss.verified(ctx, a); api.KindOf(err) != api.KindConflict {
		t.Fatalf("verify without a manifest: %v", err)
	}
	if ss.manifestRoot(a.ID) != upper {
		t.Fatalf("manifestRoot: %s, want %s", ss.manifestRoot(a.ID), upper)
	}
	man, err := storage.BuildManifest(ctx, ss.manifestRoot(a.ID))
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := json.Marshal(man)
	os.MkdirAll(ss.manifestsDir(), 0o700)
	os.WriteFile(ss.manifestPath(a.ID), doc, 0o600)
	if err := ss.verified(ctx, a); err != nil {
		t.Fatalf("verify: %v", err)
	}
	os.WriteFile(filepath.Join(upper, "f"), []byte("changed"), 0o600)
	if err := ss.verified(ctx, a); api.KindOf(err) != api.KindConflict {
		t.Fatalf("verify a changed file: %v", err)
	}
	os.MkdirAll(ss.memoryDir(a.ID), 0o700)

	if err := ss.remove(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := ss.get(ctx, a.ID); api.KindOf(err) != api.KindNotFound {
		t.Fatalf("removed snapshot found: %v", err)
	}
	for _, p := range []string{ss.dir(a.ID), ss.manifestPath(a.ID), ss.memoryDir(a.ID)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("removed snapshot left %s: %v", p, err)
		}
	}
	if _, err := ss.get(ctx, b.ID); err != nil {
		t.Fatalf("removing a removed b: %v", err)
	}
}
