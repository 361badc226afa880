package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/den-dev/den/api"
)

func newTestVolumeStore(t *testing.T) *volumeStore {
	db, tr, _, log := testStoreEnv(t)
	return &volumeStore{trees: tr, db: db, log: log}
}

// A volume is a recorded tree: made once per name (over the files of one
// whose record a crash lost), seen by its owner and the daemon only,
// listed with its disk use, and gone with its files when removed. Without
// quotas, one with a size is refused and leaves nothing.
func TestVolumeStore(t *testing.T) {
	ctx := context.Background()
	v := newTestVolumeStore(t)
	// Files of a volume whose record was lost.
	os.MkdirAll(v.dir("data"), 0o700)
	os.WriteFile(filepath.Join(v.dir("data"), "stale"), []byte("x"), 0o600)
	vol, err := v.create(ctx, "data", 0, "tok1")
	if err != nil || vol.Name != "data" || vol.Owner != "tok1" {
		t.Fatalf("create: %+v, %v", vol, err)
	}
	if _, err := os.Stat(filepath.Join(v.dir("data"), "stale")); !os.IsNotExist(err) {
		t.Fatalf("a lost volume's files were kept: %v", err)
	}
	if _, err := v.create(ctx, "data", 0, "tok2"); api.KindOf(err) != api.KindExists {
		t.Fatalf("create a second time: %v", err)
	}
	if _, err := v.get(ctx, &Scope{Owner: "tok1"}, "data"); err != nil {
		t.Fatalf("the owner's view: %v", err)
	}
	if _, err := v.get(ctx, nil, "data"); err != nil {
		t.Fatalf("the daemon's view: %v", err)
	}
	if _, err := v.get(ctx, &Scope{Owner: "tok2"}, "data"); api.KindOf(err) != api.KindNotFound {
		t.Fatalf("another token's view: %v", err)
	}
	os.WriteFile(filepath.Join(v.dir("data"), "f"), make([]byte, 5000), 0o600)
	list, err := v.list(ctx, &Scope{Owner: "tok1"})
	if err != nil || len(list) != 1 || list[0].Used < 5000 {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if list, _ := v.list(ctx, &Scope{Owner: "tok2"}); len(list) != 0 {
		t.Fatalf("another token lists %+v", list)
	}
	if _, err := v.create(ctx, "big", 1<<20, ""); api.KindOf(err) != api.KindUnsupported {
		t.Fatalf("a size without quotas: %v", err)
	}
	if _, err := os.Stat(v.dir("big")); !os.IsNotExist(err) {
		t.Fatalf("a refused volume left its tree: %v", err)
	}
	if err := v.remove(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.get(ctx, nil, "data"); api.KindOf(err) != api.KindNotFound {
		t.Fatalf("removed volume found: %v", err)
	}
	if _, err := os.Stat(v.dir("data")); !os.IsNotExist(err) {
		t.Fatalf("removed volume's files kept: %v", err)
	}
}
