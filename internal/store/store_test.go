package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func openTest(t testing.TB) *DB {
	t.Helper()
	db, err := Open(filepath.Join(t.TempDir(), "state", "den.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return db
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

func sb(id, name string, created time.Time, labels map[string]string) *Sandbox {
	return &Sandbox{
		ID: id, Name: name, Image: "debian:bookworm", State: "running", Runtime: "runc",
		Labels: labels, CreatedAt: created,
		Doc: json.RawMessage(fmt.Sprintf(`{"id":%q}`, id)),
	}
}

func ids(list []*Sandbox) []string {
	var out []string
	for _, s := range list {
		out = append(out, s.ID)
	}
	return out
}

func TestOpenCreatesPrivateFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	path := filepath.Join(dir, "den.db")
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if m := fi.Mode().Perm(); m != 0o600 {
		t.Errorf("db file mode = %v, want 0600", m)
	}
	di, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m := di.Mode().Perm(); m != 0o700 {
		t.Errorf("dir mode = %v, want 0700", m)
	}
	var mode string
	if err := db.r.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", mode, err)
	}
	var fk, sync int
	if err := db.w.QueryRow(`PRAGMA foreign_keys`).Scan(&fk); err != nil || fk != 1 {
		t.Errorf("foreign_keys = %d, %v; want 1", fk, err)
	}
	if err := db.w.QueryRow(`PRAGMA synchronous`).Scan(&sync); err != nil || sync != 1 {
		t.Errorf("synchronous = %d, %v; want 1 (NORMAL)", sync, err)
	}
	var version int
	if err := db.r.QueryRow(`SELECT version FROM schema_version`).Scan(&version); err != nil || version != len(migrations) {
		t.Errorf("schema version = %d, %v; want %d", version, err, len(migrations))
	}
	// Write something so the WAL files exist, then check their modes too.
	if err := db.PutSandbox(context.Background(), sb("abcd1234", "", t0, nil)); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		if fi, err := os.Stat(path + suffix); err == nil && fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s mode = %v, want no group/other access", suffix, fi.Mode().Perm())
		}
	}
}

func TestOpenOddPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "we?ird #dir%20", "den.db")
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.PutSandbox(context.Background(), sb("abcd1234", "", t0, nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database not at %s: %v", path, err)
	}
}

func TestOpenNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "den.db")
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.w.Exec(`UPDATE schema_version SET version = 999`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if db, err := Open(path); err == nil {
		db.Close()
		t.Fatal("Open of a newer schema succeeded")
	} else if !strings.Contains(err.Error(), "999") {
		t.Errorf("error %q does not name the version", err)
	}
}

func TestSandboxRoundTrip(t *testing.T) {
	ctx := context.Background()
	db := openTest(t)
	want := sb("0123456789abcdef", "web", t0, map[string]string{"team": "a", "env": "dev"})
	want.ExpiresAt = t0.Add(time.Hour)
	if err := db.PutSandbox(ctx, want); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"0123456789abcdef", "web", "0123", "0123456789ab"} {
		got, err := db.GetSandbox(ctx, key)
		if err != nil {
			t.Fatalf("GetSandbox(%q): %v", key, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("GetSandbox(%q) = %+v, want %+v", key, got, want)
		}
	}

	// Replace by ID: fields change, name may change and the old name frees up.
	upd := *want
	upd.Name, upd.State, upd.Labels, upd.ExpiresAt, upd.Doc = "api", "stopped", nil, time.Time{}, nil
	if err := db.PutSandbox(ctx, &upd); err != nil {
		t.Fatal(err)
	}
	got, err := db.GetSandbox(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, &upd) {
		t.Errorf("after update got %+v, want %+v", got, &upd)
	}
	if _, err := db.GetSandbox(ctx, "web"); !errors.Is(err, ErrNotFound) {
		t.Errorf("old name still resolves: %v", err)
	}
	if err := db.PutSandbox(ctx, sb("fedcba9876543210", "web", t0, nil)); err != nil {
		t.Errorf("reusing a freed name: %v", err)
	}
}

func TestPutSandboxDefaultsAndValidation(t *testing.T) {
	ctx := context.Background()
	db := openTest(t)
	s := &Sandbox{ID: "aaaa0001"}
	before := time.Now()
	if err := db.PutSandbox(ctx, s); err != nil {
		t.Fatal(err)
	}
	if s.CreatedAt.Before(before) || s.CreatedAt.After(time.Now()) {
		t.Errorf("CreatedAt not defaulted to now: %v", s.CreatedAt)
	}
	got, err := db.GetSandbox(ctx, "aaaa0001")
	if err != nil {
		t.Fatal(err)
	}
	if !got.CreatedAt.Equal(s.CreatedAt) || got.Labels != nil || got.Doc != nil || !got.ExpiresAt.IsZero() || got.Name != "" {
		t.Errorf("got %+v", got)
	}
	if err := db.PutSandbox(ctx, &Sandbox{}); err == nil {
		t.Error("PutSandbox without ID succeeded")
	}
	if err := db.PutSandbox(ctx, nil); err == nil {
		t.Error("PutSandbox(nil) succeeded")
	}
}

func TestSandboxNameUnique(t *testing.T) {
	ctx := context.Background()
	db := openTest(t)
	if err := db.PutSandbox(ctx, sb("aaaa0001", "web", t0, nil)); err != nil {
		t.Fatal(err)
	}
	err := db.PutSandbox(ctx, sb("bbbb0002", "web", t0, nil))
	if !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate name: err = %v, want ErrExists", err)
	}
	if !strings.Contains(err.Error(), `"web"`) {
		t.Errorf("error %q does not name the name", err)
	}
	// The first sandbox is untouched and the second was not stored.
	if got, err := db.GetSandbox(ctx, "web"); err != nil || got.ID != "aaaa0001" {
		t.Errorf("GetSandbox(web) = %v, %v", got, err)
	}
	if _, err := db.GetSandbox(ctx, "bbbb0002"); !errors.Is(err, ErrNotFound) {
		t.Errorf("rejected sandbox was stored: %v", err)
	}
	// Many unnamed sandboxes are fine.
	for i := range 3 {
		if err := db.PutSandbox(ctx, sb(fmt.Sprintf("cccc000%d", i), "", t0, nil)); err != nil {
			t.Fatalf("unnamed sandbox %d: %v", i, err)
		}
	}
	// Re-putting the same sandbox with its own name is not a conflict.
	if err := db.PutSandbox(ctx, sb("aaaa0001", "web", t0, nil)); err != nil {
		t.Errorf("re-put: %v", err)
	}
}

func TestGetSandboxLookup(t *testing.T) {
	ctx := context.Background()
	db := openTest(t)
	for _, s := range []*Sandbox{
		sb("abcd1111", "one", t0, nil),
		sb("abcd2222", "two", t0, nil),
		sb("abce3333", "abcd1111x", t0, nil),
		sb("ffff0000", "abcd2222", t0, nil), // a name equal to another's ID
		sb("9999", "abcd", t0, nil),         // a name that is also a prefix
	} {
		if err := db.PutSandbox(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		key, want string
		err       error
	}{
		{"abcd1111", "abcd1111", nil},
		{"abcd2222", "abcd2222", nil}, // ID wins over name
		{"two", "abcd2222", nil},
		{"abcd1111x", "abce3333", nil},
		{"abcd", "9999", nil}, // name wins over prefix
		{"abcd1", "abcd1111", nil},
		{"abce", "abce3333", nil},
		{"abc", "", ErrNotFound}, // too short to be a prefix
		{"ab", "", ErrNotFound},
		{"ffff", "ffff0000", nil},
		{"ffff00001", "", ErrNotFound},
		{"zzzz", "", ErrNotFound},
		{"", "", ErrNotFound},
		{"ABCD1111", "", ErrNotFound}, // case-sensitive
	}
	for _, tt := range tests {
		got, err := db.GetSandbox(ctx, tt.key)
		if tt.err != nil {
			if !errors.Is(err, tt.err) {
				t.Errorf("GetSandbox(%q) err = %v, want %v", tt.key, err, tt.err)
			} else if !strings.Contains(err.Error(), fmt.Sprintf("%q", tt.key)) {
				t.Errorf("GetSandbox(%q) error %q does not name the key", tt.key, err)
			}
			continue
		}
		if err != nil || got.ID != tt.want {
			t.Errorf("GetSandbox(%q) = %v, %v; want %s", tt.key, got, err, tt.want)
		}
	}

	// Ambiguous prefix.
	if err := db.DeleteSandbox(ctx, "9999"); err != nil {
		t.Fatal(err)
	}
	_, err := db.GetSandbox(ctx, "abcd")
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("ambiguous prefix: err = %v, want ErrConflict", err)
	}
	for _, s := range []string{`"abcd"`, "abcd1111", "abcd2222"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("ambiguity error %q does not mention %s", err, s)
		}
	}
	if errors.Is(err, ErrNotFound) {
		t.Error("ambiguity error also matches ErrNotFound")
	}
}

func TestGetSandboxManyMatches(t *testing.T) {
	ctx := context.Background()
	db := openTest(t)
	for i := range 20 {
		if err := db.PutSandbox(ctx, sb(fmt.Sprintf("beef%04d", i), "", t0, nil)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := db.GetSandbox(ctx, "beef")
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "...") {
		t.Errorf("err = %v", err)
	}
	if s, err := db.GetSandbox(ctx, "beef0013"); err != nil || s.ID != "beef0013" {
		t.Errorf("exact: %v %v", s, err)
	}
}

func TestListSandboxesLabels(t *testing.T) {
	ctx := context.Background()
	db := openTest(t)
	put := []*Sandbox{
		sb("s3", "", t0.Add(3*time.Second), map[string]string{"team": "a", "env": "prod"}),
		sb("s1", "", t0.Add(1*time.Second), map[string]string{"team": "a", "env": "dev"}),
		sb("s2", "", t0.Add(2*time.Second), map[string]string{"team": "b"}),
		sb("s4", "", t0.Add(4*time.Second), nil),
		sb("s0", "", t0.Add(4*time.Second), map[string]string{"odd key \"'$.": "v a l", "empty": ""}),
	}
	for _, s := range put {
		if err := db.PutSandbox(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		labels map[string]string
		want   []string
	}{
		{nil, []string{"s1", "s2", "s3", "s0", "s4"}},
		{map[string]string{}, []string{"s1", "s2", "s3", "s0", "s4"}},
		{map[string]string{"team": "a"}, []string{"s1", "s3"}},
		{map[string]string{"team": "a", "env": "prod"}, []string{"s3"}},
		{map[string]string{"team": "b", "env": "prod"}, nil},
		{map[string]string{"team": "c"}, nil},
		{map[string]string{"nope": ""}, nil},
		{map[string]string{"empty": ""}, []string{"s0"}},
		{map[string]string{"odd key \"'$.": "v a l"}, []string{"s0"}},
	}
	for _, tt := range tests {
		got, err := db.ListSandboxes(ctx, tt.labels)
		if err != nil {
			t.Fatal(err)
		}
		if g := ids(got); !reflect.DeepEqual(g, tt.want) {
			t.Errorf("ListSandboxes(%v) = %v, want %v", tt.labels, g, tt.want)
		}
	}
	got, _ := db.ListSandboxes(ctx, map[string]string{"team": "a", "env": "dev"})
	if len(got) != 1 || !reflect.DeepEqual(got[0], put[1]) {
		t.Errorf("full record mismatch: %+v", got)
	}
}

func TestDeleteSandbox(t *testing.T) {
	ctx := context.Background()
	db := openTest(t)
	if err := db.PutSandbox(ctx, sb("aaaa0001", "web", t0, nil)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := db.DeleteSandbox(ctx, "aaaa0001"); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.DeleteSandbox(ctx, "never-existed"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.GetSandbox(ctx, "aaaa0001"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after delete: %v", err)
	}
	if list, err := db.ListSandboxes(ctx, nil); err != nil || len(list) != 0 {
		t.Errorf("list after delete = %v, %v", list, err)
	}
}

func TestExpiredSandboxes(t *testing.T) {
	ctx := context.Background()
	db := openTest(t)
	mk := func(id string, exp time.Time) {
		s := sb(id, "", t0, nil)
		s.ExpiresAt = exp
		if err := db.PutSandbox(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	now := t0.Add(time.Hour)
	mk("never", time.Time{})
	mk("late", now.Add(-time.Minute))
	mk("early", now.Add(-time.Hour))
	mk("exactly", now)
	mk("future", now.Add(time.Nanosecond))
	got, err := db.ExpiredSandboxes(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if g, want := ids(got), []string{"early", "late", "exactly"}; !reflect.DeepEqual(g, want) {
		t.Errorf("expired = %v, want %v", g, want)
	}
	if !got[0].ExpiresAt.Equal(now.Add(-time.Hour)) {
		t.Errorf("ExpiresAt = %v", got[0].ExpiresAt)
	}
	got, err = db.ExpiredSandboxes(ctx, t0.Add(-time.Nanosecond))
	if err != nil || len(got) != 0 {
		t.Errorf("nothing expired yet: %v, %v", ids(got), err)
	}
}

func TestImages(t *testing.T) {
	ctx := context.Background()
	db := openTest(t)
	if _, err := db.GetImage(ctx, "debian:bookworm"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "debian:bookworm") {
		t.Errorf("missing image: %v", err)
	}
	deb := &Image{Name: "debian:bookworm", ID: "sha256:d1", Layers: []string{"sha256:l1", "sha256:l2"},
		CreatedAt: t0, Size: 1 << 30, Doc: json.RawMessage(`{"os":"linux"}`)}
	alp := &Image{Name: "alpine:3", ID: "sha256:a1", Layers: []string{"sha256:l3"}, CreatedAt: t0}
	dev := &Image{Name: "dev:latest", ID: "sha256:x1", Layers: []string{"sha256:l1", "sha256:l2", "sha256:l4", "sha256:l4"}, CreatedAt: t0}
	empty := &Image{Name: "scratch", ID: "sha256:e"}
	for _, img := range []*Image{deb, alp, dev, empty} {
		if err := db.PutImage(ctx, img); err != nil {
			t.Fatal(err)
		}
	}
	if empty.CreatedAt.IsZero() {
		t.Error("PutImage did not default CreatedAt")
	}
	got, err := db.GetImage(ctx, "debian:bookworm")
	if err != nil || !reflect.DeepEqual(got, deb) {
		t.Errorf("GetImage = %+v, %v; want %+v", got, err, deb)
	}
	got, err = db.GetImage(ctx, "scratch")
	if err != nil || got.Layers != nil || got.Doc != nil || !got.CreatedAt.Equal(empty.CreatedAt) {
		t.Errorf("GetImage(scratch) = %+v, %v", got, err)
	}
	list, err := db.ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, img := range list {
		names = append(names, img.Name)
	}
	if want := []string{"alpine:3", "debian:bookworm", "dev:latest", "scratch"}; !reflect.DeepEqual(names, want) {
		t.Errorf("ListImages = %v, want %v", names, want)
	}

	refs, err := db.LayerRefs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"sha256:l1": 2, "sha256:l2": 2, "sha256:l3": 1, "sha256:l4": 1}; !reflect.DeepEqual(refs, want) {
		t.Errorf("LayerRefs = %v, want %v", refs, want)
	}

	// Replace by name.
	dev2 := &Image{Name: "dev:latest", ID: "sha256:x2", Layers: []string{"sha256:l5"}, CreatedAt: t0, Size: 7}
	if err := db.PutImage(ctx, dev2); err != nil {
		t.Fatal(err)
	}
	if got, err := db.GetImage(ctx, "dev:latest"); err != nil || !reflect.DeepEqual(got, dev2) {
		t.Errorf("after replace = %+v, %v", got, err)
	}
	refs, _ = db.LayerRefs(ctx)
	if want := map[string]int{"sha256:l1": 1, "sha256:l2": 1, "sha256:l3": 1, "sha256:l5": 1}; !reflect.DeepEqual(refs, want) {
		t.Errorf("LayerRefs after replace = %v, want %v", refs, want)
	}

	// In use.
	inUse, err := db.ImageInUse(ctx, "alpine:3")
	if err != nil || len(inUse) != 0 {
		t.Errorf("ImageInUse(unused) = %v, %v", inUse, err)
	}
	for i, id := range []string{"u2", "u1"} {
		s := sb(id, "", t0.Add(time.Duration(-i)*time.Second), nil)
		s.Image = "alpine:3"
		if err := db.PutSandbox(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.PutSandbox(ctx, sb("other", "", t0, nil)); err != nil {
		t.Fatal(err)
	}
	inUse, err = db.ImageInUse(ctx, "alpine:3")
	if err != nil || !reflect.DeepEqual(inUse, []string{"u1", "u2"}) {
		t.Errorf("ImageInUse = %v, %v", inUse, err)
	}

	// Delete is idempotent and updates refs.
	for range 2 {
		if err := db.DeleteImage(ctx, "debian:bookworm"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.GetImage(ctx, "debian:bookworm"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after delete: %v", err)
	}
	refs, _ = db.LayerRefs(ctx)
	if want := map[string]int{"sha256:l3": 1, "sha256:l5": 1}; !reflect.DeepEqual(refs, want) {
		t.Errorf("LayerRefs after delete = %v, want %v", refs, want)
	}
	if err := db.PutImage(ctx, &Image{}); err == nil {
		t.Error("PutImage without name succeeded")
	}
}

func TestLayerRefsEmpty(t *testing.T) {
	refs, err := openTest(t).LayerRefs(context.Background())
	if err != nil || refs == nil || len(refs) != 0 {
		t.Errorf("LayerRefs = %v, %v; want empty non-nil map", refs, err)
	}
}

func TestEvents(t *testing.T) {
	ctx := context.Background()
	db := openTest(t)
	if list, err := db.Events(ctx, EventFilter{}); err != nil || len(list) != 0 {
		t.Fatalf("empty log: %v, %v", list, err)
	}
	add := []*Event{
		{Time: t0, Sandbox: "s1", Type: "sandbox.create", Data: json.RawMessage(`{"image":"debian"}`)},
		{Time: t0.Add(1 * time.Second), Sandbox: "s1", Type: "exec.start"},
		{Time: t0.Add(2 * time.Second), Sandbox: "s2", Type: "sandbox.create"},
		{Time: t0.Add(3 * time.Second), Sandbox: "s1", Type: "exec.end", Data: json.RawMessage(`{"exit":0}`)},
		{Time: t0.Add(4 * time.Second), Sandbox: "", Type: "daemon.start"},
		{Time: t0.Add(5 * time.Second), Sandbox: "s1", Type: "sandbox.delete"},
		{Time: t0.Add(6 * time.Second), Sandbox: "s2", Type: "execute"},
	}
	var last int64
	for _, e := range add {
		if err := db.AddEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
		if e.Seq <= last {
			t.Errorf("Seq %d not after %d", e.Seq, last)
		}
		last = e.Seq
	}
	seqs := func(list []*Event) []int64 {
		var out []int64
		for _, e := range list {
			out = append(out, e.Seq)
		}
		return out
	}
	s := func(i ...int) []int64 {
		var out []int64
		for _, i := range i {
			out = append(out, add[i].Seq)
		}
		return out
	}
	tests := []struct {
		name string
		f    EventFilter
		want []int64
	}{
		{"all", EventFilter{}, s(0, 1, 2, 3, 4, 5, 6)},
		{"sandbox", EventFilter{Sandbox: "s1"}, s(0, 1, 3, 5)},
		{"type prefix", EventFilter{Type: "sandbox."}, s(0, 2, 5)},
		{"type prefix no dot", EventFilter{Type: "exec"}, s(1, 3, 6)},
		{"type prefix dot", EventFilter{Type: "exec."}, s(1, 3)},
		{"type exact", EventFilter{Type: "exec.end"}, s(3)},
		{"type none", EventFilter{Type: "exec.end.x"}, nil},
		{"since", EventFilter{Since: t0.Add(3 * time.Second)}, s(3, 4, 5, 6)},
		{"after seq", EventFilter{AfterSeq: add[4].Seq}, s(5, 6)},
		{"limit", EventFilter{Limit: 2}, s(0, 1)},
		{"combined", EventFilter{Sandbox: "s1", Type: "exec", Since: t0.Add(time.Second), AfterSeq: add[0].Seq, Limit: 1}, s(1)},
		{"combined 2", EventFilter{Sandbox: "s1", Type: "sandbox.", AfterSeq: add[1].Seq}, s(5)},
		{"no such sandbox", EventFilter{Sandbox: "s9"}, nil},
	}
	for _, tt := range tests {
		got, err := db.Events(ctx, tt.f)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if g := seqs(got); !reflect.DeepEqual(g, tt.want) {
			t.Errorf("%s: Events(%+v) = %v, want %v", tt.name, tt.f, g, tt.want)
		}
	}
	got, _ := db.Events(ctx, EventFilter{Type: "exec.end"})
	if len(got) != 1 || !reflect.DeepEqual(got[0], add[3]) {
		t.Errorf("full event = %+v, want %+v", got, add[3])
	}
	got, _ = db.Events(ctx, EventFilter{Type: "exec.start"})
	if len(got) != 1 || got[0].Data != nil {
		t.Errorf("event without data = %+v", got)
	}

	// AddEvent fills in a zero Time.
	e := &Event{Type: "daemon.stop"}
	before := time.Now()
	if err := db.AddEvent(ctx, e); err != nil {
		t.Fatal(err)
	}
	if e.Time.Before(before) || e.Time.After(time.Now()) || e.Seq <= last {
		t.Errorf("AddEvent defaults: %+v", e)
	}
	if err := db.AddEvent(ctx, &Event{}); err == nil {
		t.Error("AddEvent without type succeeded")
	}
}

func TestEventTypePrefixUnicode(t *testing.T) {
	ctx := context.Background()
	db := openTest(t)
	for _, typ := range []string{"ünï.côde", "ünï.x", "ü"} {
		if err := db.AddEvent(ctx, &Event{Type: typ}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := db.Events(ctx, EventFilter{Type: "ünï."})
	if err != nil || len(got) != 2 {
		t.Errorf("Events(ünï.) = %d events, %v", len(got), err)
	}
}

func TestReopenPersists(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "den.db")
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sb("abcd1234", "keep", t0, map[string]string{"k": "v"})
	img := &Image{Name: "alpine:3", ID: "sha256:a", Layers: []string{"sha256:l"}, CreatedAt: t0, Size: 42}
	ev := &Event{Time: t0, Sandbox: s.ID, Type: "sandbox.create"}
	if err := db.PutSandbox(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := db.PutImage(ctx, img); err != nil {
		t.Fatal(err)
	}
	if err := db.AddEvent(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got, err := db.GetSandbox(ctx, "keep"); err != nil || !reflect.DeepEqual(got, s) {
		t.Errorf("sandbox after reopen = %+v, %v", got, err)
	}
	if got, err := db.GetImage(ctx, "alpine:3"); err != nil || !reflect.DeepEqual(got, img) {
		t.Errorf("image after reopen = %+v, %v", got, err)
	}
	if got, err := db.Events(ctx, EventFilter{}); err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], ev) {
		t.Errorf("events after reopen = %+v, %v", got, err)
	}
	// Sequence numbers keep increasing across reopen.
	ev2 := &Event{Type: "daemon.start"}
	if err := db.AddEvent(ctx, ev2); err != nil || ev2.Seq <= ev.Seq {
		t.Errorf("seq after reopen = %d (before %d), %v", ev2.Seq, ev.Seq, err)
	}
}

func TestTwoHandlesSameFile(t *testing.T) {
	// Two DB values on one file (as with a daemon and a CLI tool) see each
	// other's writes.
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "den.db")
	a, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := a.PutSandbox(ctx, sb("abcd1234", "x", t0, nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetSandbox(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if err := b.PutSandbox(ctx, sb("abcd5678", "x", t0, nil)); !errors.Is(err, ErrExists) {
		t.Errorf("cross-handle duplicate: %v", err)
	}
}

func TestConcurrent(t *testing.T) {
	ctx := context.Background()
	db := openTest(t)
	const workers, each = 50, 20
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("%04x%04x", w, i)
				s := sb(id, "n-"+id, t0.Add(time.Duration(w*each+i)), map[string]string{"worker": fmt.Sprint(w)})
				if err := db.PutSandbox(ctx, s); err != nil {
					errc <- fmt.Errorf("PutSandbox %s: %w", id, err)
					return
				}
				if err := db.AddEvent(ctx, &Event{Sandbox: id, Type: "sandbox.create"}); err != nil {
					errc <- fmt.Errorf("AddEvent %s: %w", id, err)
					return
				}
				if _, err := db.GetSandbox(ctx, "n-"+id); err != nil {
					errc <- fmt.Errorf("GetSandbox %s: %w", id, err)
					return
				}
				if i%5 == 0 {
					if _, err := db.ListSandboxes(ctx, map[string]string{"worker": fmt.Sprint(w)}); err != nil {
						errc <- fmt.Errorf("ListSandboxes: %w", err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	list, err := db.ListSandboxes(ctx, nil)
	if err != nil || len(list) != workers*each {
		t.Errorf("sandboxes = %d, %v; want %d", len(list), err, workers*each)
	}
	evs, err := db.Events(ctx, EventFilter{})
	if err != nil || len(evs) != workers*each {
		t.Fatalf("events = %d, %v; want %d", len(evs), err, workers*each)
	}
	seen := map[int64]bool{}
	for i, e := range evs {
		if seen[e.Seq] || (i > 0 && e.Seq <= evs[i-1].Seq) {
			t.Fatalf("event seqs not unique and increasing at %d", i)
		}
		seen[e.Seq] = true
	}
	if list, _ := db.ListSandboxes(ctx, map[string]string{"worker": "7"}); len(list) != each {
		t.Errorf("worker 7 sandboxes = %d, want %d", len(list), each)
	}
}

func TestContextCanceled(t *testing.T) {
	db := openTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := db.PutSandbox(ctx, sb("abcd1234", "", t0, nil)); err == nil {
		t.Error("PutSandbox with canceled context succeeded")
	}
	if _, err := db.ListSandboxes(ctx, nil); err == nil {
		t.Error("ListSandboxes with canceled context succeeded")
	}
}

func BenchmarkPutSandbox(b *testing.B) {
	ctx := context.Background()
	db := openTest(b)
	doc := json.RawMessage(`{"id":"x","name":"bench","image":"debian:bookworm","state":"running",` +
		`"env":{"PATH":"/usr/local/bin:/usr/bin:/bin","HOME":"/root"},"limits":{"cpus":2,"memory":1073741824},` +
		`"mounts":[{"source":"/home/u/project","target":"/work","readonly":false}]}`)
	labels := map[string]string{"team": "a", "env": "dev"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s := &Sandbox{
			ID: fmt.Sprintf("%016x", i%1000), Image: "debian:bookworm", State: "running",
			Runtime: "runc", Labels: labels, CreatedAt: t0, Doc: doc,
		}
		if err := db.PutSandbox(ctx, s); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkGetSandbox(b *testing.B) {
	ctx := context.Background()
	db := openTest(b)
	for i := range 1000 {
		if err := db.PutSandbox(ctx, sb(fmt.Sprintf("%016x", i), fmt.Sprintf("n%d", i), t0, nil)); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		if _, err := db.GetSandbox(ctx, fmt.Sprintf("n%d", i%1000)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkAddEvent(b *testing.B) {
	ctx := context.Background()
	db := openTest(b)
	data := json.RawMessage(`{"exit":0,"duration_ms":12}`)
	for b.Loop() {
		if err := db.AddEvent(ctx, &Event{Sandbox: "0123456789abcdef", Type: "exec.end", Data: data}); err != nil {
			b.Fatal(err)
		}
	}
}
