package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Object is a stored document of one kind (a snapshot, a volume): looked
// up by id, unique name or id prefix, listed by kind or owner.
type Object struct {
	Kind  string
	ID    string
	Name  string // unique within Kind when non-empty
	Owner string // what the object belongs to, or ""
	// CreatedAt orders listings; PutObject sets it when zero.
	CreatedAt time.Time
	Doc       json.RawMessage
}

const objectCols = `kind, id, name, owner, created_at, doc`

// PutObject inserts o, or replaces the object of the same kind and id. A
// name used by another object of the kind fails with ErrExists.
func (db *DB) PutObject(ctx context.Context, o *Object) error {
	if o == nil || o.Kind == "" || o.ID == "" {
		return errors.New("store: object without kind or id")
	}
	if o.CreatedAt.IsZero() {
		o.CreatedAt = time.Now()
	}
	_, err := db.w.ExecContext(ctx, `INSERT INTO objects (`+objectCols+`) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (kind, id) DO UPDATE SET name = excluded.name, owner = excluded.owner,
			created_at = excluded.created_at, doc = excluded.doc`,
		o.Kind, o.ID, nullString(o.Name), o.Owner, toNanos(o.CreatedAt), string(o.Doc))
	if isUnique(err) {
		return fmt.Errorf("%s name %q is already in use: %w", o.Kind, o.Name, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("store: put %s %s: %w", o.Kind, o.ID, err)
	}
	return nil
}

// GetObject returns the object of kind whose id is idOrName, else whose
// name is idOrName, else whose id starts with idOrName (at least MinPrefix
// characters, exactly one match). ErrNotFound or ErrConflict otherwise.
func (db *DB) GetObject(ctx context.Context, kind, idOrName string) (*Object, error) {
	if idOrName == "" {
		return nil, fmt.Errorf("%s %q: %w", kind, idOrName, ErrNotFound)
	}
	list, err := db.queryObjects(ctx, `WHERE kind = ?1 AND (id = ?2 OR name = ?2) ORDER BY id = ?2 DESC LIMIT 1`, kind, idOrName)
	if err != nil {
		return nil, err
	}
	if len(list) == 1 {
		return list[0], nil
	}
	if len(idOrName) >= MinPrefix {
		list, err = db.queryObjects(ctx, `WHERE kind = ?1 AND id >= ?2 AND substr(id, 1, length(?2)) = ?2 ORDER BY id LIMIT 6`, kind, idOrName)
		if err != nil {
			return nil, err
		}
		switch len(list) {
		case 1:
			return list[0], nil
		case 0:
		default:
			var ids []string
			for _, o := range list {
				ids = append(ids, o.ID)
			}
			return nil, fmt.Errorf("%s id prefix %q is ambiguous (matches %s): %w", kind, idOrName, strings.Join(ids, ", "), ErrConflict)
		}
	}
	return nil, fmt.Errorf("%s %q: %w", kind, idOrName, ErrNotFound)
}

// ListObjects returns the objects of kind, oldest first; with owner != ""
// only that owner's.
func (db *DB) ListObjects(ctx context.Context, kind, owner string) ([]*Object, error) {
	if owner != "" {
		return db.queryObjects(ctx, `WHERE kind = ? AND owner = ? ORDER BY created_at, id`, kind, owner)
	}
	return db.queryObjects(ctx, `WHERE kind = ? ORDER BY created_at, id`, kind)
}

// DeleteObject removes an object. Idempotent.
func (db *DB) DeleteObject(ctx context.Context, kind, id string) error {
	if _, err := db.w.ExecContext(ctx, `DELETE FROM objects WHERE kind = ? AND id = ?`, kind, id); err != nil {
		return fmt.Errorf("store: delete %s %s: %w", kind, id, err)
	}
	return nil
}

func (db *DB) queryObjects(ctx context.Context, where string, args ...any) ([]*Object, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT `+objectCols+` FROM objects `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("store: objects: %w", err)
	}
	defer rows.Close()
	var out []*Object
	for rows.Next() {
		var o Object
		var name sql.NullString
		var created int64
		var doc string
		if err := rows.Scan(&o.Kind, &o.ID, &name, &o.Owner, &created, &doc); err != nil {
			return nil, fmt.Errorf("store: objects: %w", err)
		}
		o.Name, o.CreatedAt, o.Doc = name.String, fromNanos(created), json.RawMessage(doc)
		out = append(out, &o)
	}
	return out, rows.Err()
}
