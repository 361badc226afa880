// Package store keeps the den daemon's durable state — sandboxes, images and
// an append-only event log — in a single SQLite database file, using the
// pure-Go modernc.org/sqlite driver so that den builds without cgo. Records
// are kept as a few indexed columns the daemon filters on plus an opaque JSON
// document holding the whole API record; the store never interprets that
// document. The database runs in WAL mode with synchronous=NORMAL; all writes
// go through one dedicated connection (so writers queue in Go instead of
// failing with SQLITE_BUSY) while reads use a separate read-only pool, which
// makes a *DB safe for concurrent use by many goroutines. Failures that callers
// need to tell apart wrap the sentinel errors ErrNotFound, ErrExists and
// ErrConflict, to be tested with errors.Is.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Sentinel errors. Returned errors wrap them with a message naming the
// sandbox, image or name concerned; test with errors.Is.
var (
	// ErrNotFound reports that the named record does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists reports that a unique name is already taken.
	ErrExists = errors.New("already exists")
	// ErrConflict reports a request that cannot be resolved to one record,
	// such as an ID prefix matching several sandboxes.
	ErrConflict = errors.New("conflict")
)

// busyTimeoutMS is how long a connection waits for a lock held by another
// connection (or another process) before failing with SQLITE_BUSY.
const busyTimeoutMS = 10000

// DB is an open state database. It is safe for concurrent use.
type DB struct {
	path string
	w    *sql.DB // exactly one connection: all writes
	r    *sql.DB // read-only pool: all queries

	putSandbox *sql.Stmt
	addEvent   *sql.Stmt
}

// Open opens the database at path, creating the file (mode 0600) and its
// parent directory (mode 0700) if they are missing, and brings the schema up
// to date.
func Open(path string) (*DB, error) {
	if path == "" {
		return nil, errors.New("store: empty database path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	// Create the file ourselves so it gets 0600 whatever the umask; SQLite
	// gives the -wal and -shm files the permissions of the main file.
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	f.Close()

	// A file: URI with an escaped path, so that '?' or '#' in the path
	// cannot be mistaken for DSN parameters.
	uri := (&url.URL{Scheme: "file", Path: abs}).String()
	common := url.Values{}
	common.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeoutMS))
	common.Add("_pragma", "foreign_keys(1)")
	common.Add("_pragma", "synchronous(NORMAL)")

	wq := url.Values{}
	for k, v := range common {
		wq[k] = append([]string(nil), v...)
	}
	wq.Add("_pragma", "journal_mode(WAL)")
	wq.Set("_txlock", "immediate")
	w, err := sql.Open("sqlite", uri+"?"+wq.Encode())
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)

	db := &DB{path: abs, w: w}
	if err := db.migrate(context.Background()); err != nil {
		w.Close()
		return nil, fmt.Errorf("store: %s: %w", abs, err)
	}

	rq := common
	rq.Add("_pragma", "query_only(1)")
	r, err := sql.Open("sqlite", uri+"?"+rq.Encode())
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	r.SetMaxOpenConns(n)
	r.SetMaxIdleConns(n)
	r.SetConnMaxLifetime(0)
	r.SetConnMaxIdleTime(0)
	db.r = r
	if err := r.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}

	if db.putSandbox, err = w.Prepare(putSandboxSQL); err == nil {
		db.addEvent, err = w.Prepare(addEventSQL)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: prepare: %w", err)
	}
	return db, nil
}

// Path returns the absolute path of the database file.
func (db *DB) Path() string { return db.path }

// Close closes the database. Calls in progress may fail.
func (db *DB) Close() error {
	var errs []error
	for _, s := range []*sql.Stmt{db.putSandbox, db.addEvent} {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	if db.r != nil {
		errs = append(errs, db.r.Close())
	}
	if db.w != nil {
		errs = append(errs, db.w.Close())
	}
	return errors.Join(errs...)
}

// migrations is the schema history. Entry i brings the schema from version i
// to version i+1. Append new entries; never edit or reorder existing ones.
var migrations = []string{
	// 1: sandboxes, images, events.
	`
CREATE TABLE sandboxes (
	id         TEXT PRIMARY KEY NOT NULL,
	name       TEXT UNIQUE,             -- NULL when unnamed
	image      TEXT NOT NULL,
	state      TEXT NOT NULL,
	runtime    TEXT NOT NULL,
	labels     TEXT NOT NULL,           -- JSON object of string values
	created_at INTEGER NOT NULL,        -- Unix nanoseconds
	expires_at INTEGER,                 -- Unix nanoseconds; NULL = never
	doc        TEXT                     -- the full API record, JSON
);
CREATE INDEX sandboxes_created ON sandboxes(created_at, id);
CREATE INDEX sandboxes_image ON sandboxes(image);
CREATE INDEX sandboxes_expires ON sandboxes(expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE images (
	name       TEXT PRIMARY KEY NOT NULL,
	id         TEXT NOT NULL,           -- digest
	layers     TEXT NOT NULL,           -- JSON array of layer digests, bottom first
	created_at INTEGER NOT NULL,        -- Unix nanoseconds
	size       INTEGER NOT NULL,
	doc        TEXT
);

CREATE TABLE events (
	seq     INTEGER PRIMARY KEY AUTOINCREMENT,
	time    INTEGER NOT NULL,           -- Unix nanoseconds
	sandbox TEXT NOT NULL,
	type    TEXT NOT NULL,
	data    TEXT
);
CREATE INDEX events_sandbox ON events(sandbox, seq);
CREATE INDEX events_time ON events(time);
`,
	// 2: den's secret store: values the egress proxy adds to requests and
	// that never enter a sandbox.
	`
CREATE TABLE secrets (
	name       TEXT PRIMARY KEY,
	value      BLOB NOT NULL,
	updated_at INTEGER NOT NULL
);
`,
	// 3: small named objects of several kinds (snapshots, volumes), each a
	// JSON document with an id and an optional unique name per kind.
	`
CREATE TABLE objects (
	kind       TEXT NOT NULL,
	id         TEXT NOT NULL,
	name       TEXT,                    -- NULL when unnamed; unique per kind
	owner      TEXT NOT NULL,           -- what it belongs to (a sandbox id, a token), or ''
	created_at INTEGER NOT NULL,        -- Unix nanoseconds
	doc        TEXT NOT NULL,
	PRIMARY KEY (kind, id),
	UNIQUE (kind, name)
);
CREATE INDEX objects_owner ON objects(kind, owner);
`,
}

// migrate creates the schema_version table if needed and applies every
// migration newer than the recorded version, all in one transaction.
func (db *DB) migrate(ctx context.Context) error {
	tx, err := db.w.BeginTx(ctx, nil) // BEGIN IMMEDIATE: see _txlock
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	var version int
	err = tx.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&version)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version (version) VALUES (0)`); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	case err != nil:
		return fmt.Errorf("migrate: %w", err)
	}
	if version > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this program supports (%d)", version, len(migrations))
	}
	if version == len(migrations) {
		return nil
	}
	for i := version; i < len(migrations); i++ {
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE schema_version SET version = ?`, len(migrations)); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return tx.Commit()
}

// isUnique reports whether err is a UNIQUE constraint violation.
func isUnique(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE
}

// Times are stored as Unix nanoseconds and read back in UTC.

func toNanos(t time.Time) int64 { return t.UnixNano() }

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// nullNanos stores the zero time as NULL.
func nullNanos(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixNano()
}

func fromNullNanos(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return fromNanos(n.Int64)
}

// nullText stores an empty JSON document as NULL and anything else as TEXT,
// so SQLite's JSON functions can read it.
func nullText(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

// nullString stores the empty string as NULL.
func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}
