package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/store"
)

// newTestImageStore is an imageStore on a fresh store and layer store,
// with no daemon.
func newTestImageStore(t *testing.T) *imageStore {
	t.Helper()
	db, _, dir, log := testStoreEnv(t)
	layers, err := image.NewStore(filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	return &imageStore{db: db, layers: layers, dataDir: dir, log: log}
}

// addLayer stores a layer holding one file and returns its id.
func addLayer(t *testing.T, s *imageStore, content string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	id, _, err := s.layers.AddLayerFromDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// An image put is found by name and listed after the built-in one (the
// build cache is not listed); its root filesystem is its layers in the
// layer store; one a sandbox uses is neither replaced nor removed;
// removing one drops the layers no other image uses; prune drops unused
// build cache.
func TestImageStore(t *testing.T) {
	ctx := context.Background()
	s := newTestImageStore(t)
	l1, l2 := addLayer(t, s, "one"), addLayer(t, s, "two")
	app := &api.Image{Name: "app", ID: "sha256:app", Layers: []string{l1, l2}, CreatedAt: time.Now().UTC()}
	if err := s.put(ctx, app); err != nil {
		t.Fatal(err)
	}
	cache := &api.Image{Name: cachePrefix + "x", ID: "sha256:c", Layers: []string{l1}}
	if err := s.put(ctx, cache); err != nil {
		t.Fatal(err)
	}
	got, err := s.get(ctx, "app")
	if err != nil || got.ID != app.ID || !slices.Equal(got.Layers, app.Layers) {
		t.Fatalf("get: %+v, %v", got, err)
	}
	if _, err := s.get(ctx, "nope"); api.KindOf(err) != api.KindNotFound {
		t.Fatalf("get a missing image: %v", err)
	}
	list, err := s.list(ctx)
	if err != nil || len(list) != 2 || list[0].Name != HostImage || list[1].Name != "app" {
		t.Fatalf("list: %v, %v", list, err)
	}
	fs, err := s.rootfs(got)
	if err != nil || len(fs) != 1 || fs[0].Target != "/" || !slices.Equal(fs[0].Lowers, []string{s.layers.LayerPath(l1), s.layers.LayerPath(l2)}) {
		t.Fatalf("rootfs: %+v, %v", fs, err)
	}
	if fs, err := s.rootfs(&api.Image{Name: "empty"}); err != nil || len(fs) != 1 || fs[0].Lowers[0] != filepath.Join(s.dataDir, "images", "empty") {
		t.Fatalf("rootfs of an image without layers: %+v, %v", fs, err)
	}

	// A sandbox runs app: it stays.
	sb := newID()
	if err := s.db.PutSandbox(ctx, &store.Sandbox{ID: sb, Image: "app", State: api.StateRunning, Doc: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := s.put(ctx, &api.Image{Name: "app", ID: "sha256:other"}); api.KindOf(err) != api.KindConflict {
		t.Fatalf("replace an image in use: %v", err)
	}
	if err := s.remove(ctx, "app"); api.KindOf(err) != api.KindConflict {
		t.Fatalf("remove an image in use: %v", err)
	}
	if err := s.db.DeleteSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.remove(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.get(ctx, "app"); api.KindOf(err) != api.KindNotFound {
		t.Fatalf("removed image still found: %v", err)
	}
	present, _ := s.layers.Layers()
	if !slices.Equal(present, []string{l1}) {
		t.Fatalf("layers after remove: %v, want only %s (the cache's)", present, l1)
	}
	res, err := s.prune(ctx)
	if err != nil || !slices.Equal(res.Images, []string{cache.Name}) || res.Layers != 1 {
		t.Fatalf("prune: %+v, %v", res, err)
	}
	if present, _ := s.layers.Layers(); len(present) != 0 {
		t.Fatalf("layers after prune: %v", present)
	}
}

// Images are shared: a scoped token adds new ones but does not replace
// another's, and does not see whose an image is.
func TestImageStoreScoped(t *testing.T) {
	s := newTestImageStore(t)
	admin := context.Background()
	if err := s.put(admin, &api.Image{Name: "base", ID: "sha256:b", Owner: "tok1"}); err != nil {
		t.Fatal(err)
	}
	tok2 := WithScope(admin, &Scope{Owner: "tok2"})
	if err := s.put(tok2, &api.Image{Name: "base", ID: "sha256:mine"}); api.KindOf(err) != api.KindConflict {
		t.Fatalf("a token replaced another's image: %v", err)
	}
	if err := s.put(tok2, &api.Image{Name: "mine", ID: "sha256:mine"}); err != nil {
		t.Fatalf("a token adding its own image: %v", err)
	}
	if img, err := s.get(tok2, "base"); err != nil || img.Owner != "" {
		t.Fatalf("another's image as tok2 sees it: %+v, %v", img, err)
	}
	if img, err := s.get(WithScope(admin, &Scope{Owner: "tok1"}), "base"); err != nil || img.Owner != "tok1" {
		t.Fatalf("its own image as tok1 sees it: %+v, %v", img, err)
	}
}
