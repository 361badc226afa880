package sandbox

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/den-dev/den/internal/storage"
	"github.com/den-dev/den/internal/store"
)

// testStoreEnv is what the manager's narrow stores are made of, fresh,
// with no daemon: a store, plain-directory storage (no quotas) and a
// quiet log, all under dir.
func testStoreEnv(t *testing.T) (db *store.DB, tr trees, dir string, log *slog.Logger) {
	t.Helper()
	dir = t.TempDir()
	db, err := store.Open(filepath.Join(dir, "den.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st, err := storage.Open(storage.Config{Dir: dir, Mode: "dir"})
	if err != nil {
		t.Fatal(err)
	}
	return db, trees{st}, dir, slog.New(slog.NewTextHandler(io.Discard, nil))
}
