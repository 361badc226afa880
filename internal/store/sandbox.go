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

// Sandbox is the stored form of a sandbox: the columns the daemon looks
// sandboxes up by, plus the whole API record as an opaque JSON document.
type Sandbox struct {
	ID      string
	Name    string // unique when non-empty
	Image   string
	State   string
	Runtime string
	Labels  map[string]string // nil when there are none
	// CreatedAt orders listings. PutSandbox sets it to the current time
	// when it is zero.
	CreatedAt time.Time
	ExpiresAt time.Time       // zero = never
	Doc       json.RawMessage // the full API record, opaque to the store
}

// MinPrefix is the shortest ID prefix GetSandbox resolves.
const MinPrefix = 4

const sandboxCols = `id, name, image, state, runtime, labels, created_at, expires_at, doc`

const putSandboxSQL = `INSERT INTO sandboxes (` + sandboxCols + `)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET
	name = excluded.name, image = excluded.image, state = excluded.state,
	runtime = excluded.runtime, labels = excluded.labels,
	created_at = excluded.created_at, expires_at = excluded.expires_at,
	doc = excluded.doc`

// PutSandbox inserts s, or replaces the sandbox with the same ID. A non-empty
// Name already used by another sandbox fails with an error wrapping ErrExists.
func (db *DB) PutSandbox(ctx context.Context, s *Sandbox) error {
	if s == nil || s.ID == "" {
		return errors.New("store: sandbox without ID")
	}
	labels := "{}"
	if len(s.Labels) > 0 {
		b, err := json.Marshal(s.Labels)
		if err != nil {
			return fmt.Errorf("store: sandbox %s labels: %w", s.ID, err)
		}
		labels = string(b)
	}
	if s.CreatedAt.IsZero() {
		s.CreatedAt = time.Now()
	}
	_, err := db.putSandbox.ExecContext(ctx,
		s.ID, nullString(s.Name), s.Image, s.State, s.Runtime, labels,
		toNanos(s.CreatedAt), nullNanos(s.ExpiresAt), nullText(s.Doc))
	if isUnique(err) {
		return fmt.Errorf("sandbox name %q is already in use: %w", s.Name, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("store: put sandbox %s: %w", s.ID, err)
	}
	return nil
}

// GetSandbox returns the sandbox whose ID is idOrName, else the one whose
// name is idOrName, else the one whose ID starts with idOrName if that is at
// least MinPrefix characters long and matches exactly one sandbox. It fails
// with ErrNotFound if nothing matches and with ErrConflict if the prefix
// matches several sandboxes.
func (db *DB) GetSandbox(ctx context.Context, idOrName string) (*Sandbox, error) {
	if idOrName == "" {
		return nil, fmt.Errorf("sandbox %q: %w", idOrName, ErrNotFound)
	}
	rows, err := db.r.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes
		WHERE id = ?1 OR name = ?1 ORDER BY id = ?1 DESC LIMIT 1`, idOrName)
	if err != nil {
		return nil, fmt.Errorf("store: get sandbox %q: %w", idOrName, err)
	}
	list, err := scanSandboxes(rows)
	if err != nil {
		return nil, fmt.Errorf("store: get sandbox %q: %w", idOrName, err)
	}
	if len(list) == 1 {
		return list[0], nil
	}
	if len(idOrName) < MinPrefix {
		return nil, fmt.Errorf("sandbox %q: %w", idOrName, ErrNotFound)
	}

	// IDs sharing the prefix sort right at or after it; read a few.
	const show = 5
	rows, err = db.r.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes
		WHERE id >= ? ORDER BY id LIMIT ?`, idOrName, show+1)
	if err != nil {
		return nil, fmt.Errorf("store: get sandbox %q: %w", idOrName, err)
	}
	list, err = scanSandboxes(rows)
	if err != nil {
		return nil, fmt.Errorf("store: get sandbox %q: %w", idOrName, err)
	}
	var ids []string
	for _, s := range list {
		if !strings.HasPrefix(s.ID, idOrName) {
			break
		}
		ids = append(ids, s.ID)
	}
	switch {
	case len(ids) == 0:
		return nil, fmt.Errorf("sandbox %q: %w", idOrName, ErrNotFound)
	case len(ids) == 1:
		return list[0], nil
	case len(ids) > show:
		ids = append(ids[:show], "...")
	}
	return nil, fmt.Errorf("sandbox ID prefix %q is ambiguous (matches %s): %w",
		idOrName, strings.Join(ids, ", "), ErrConflict)
}

// ListSandboxes returns the sandboxes carrying every label in labels (all of
// them when labels is empty), oldest first.
func (db *DB) ListSandboxes(ctx context.Context, labels map[string]string) ([]*Sandbox, error) {
	var q strings.Builder
	q.WriteString(`SELECT ` + sandboxCols + ` FROM sandboxes`)
	args := make([]any, 0, 2*len(labels))
	sep := " WHERE "
	for k, v := range labels {
		q.WriteString(sep + `EXISTS (SELECT 1 FROM json_each(sandboxes.labels) AS l
			WHERE l.key = ? AND l.type = 'text' AND l.value = ?)`)
		args = append(args, k, v)
		sep = " AND "
	}
	q.WriteString(` ORDER BY created_at, id`)
	rows, err := db.r.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("store: list sandboxes: %w", err)
	}
	list, err := scanSandboxes(rows)
	if err != nil {
		return nil, fmt.Errorf("store: list sandboxes: %w", err)
	}
	return list, nil
}

// DeleteSandbox removes the sandbox with the given ID. Deleting a sandbox
// that does not exist is not an error.
func (db *DB) DeleteSandbox(ctx context.Context, id string) error {
	if _, err := db.w.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: delete sandbox %s: %w", id, err)
	}
	return nil
}

// ExpiredSandboxes returns the sandboxes whose ExpiresAt is set and not after
// now, soonest-expired first.
func (db *DB) ExpiredSandboxes(ctx context.Context, now time.Time) ([]*Sandbox, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes
		WHERE expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at, id`, toNanos(now))
	if err != nil {
		return nil, fmt.Errorf("store: expired sandboxes: %w", err)
	}
	list, err := scanSandboxes(rows)
	if err != nil {
		return nil, fmt.Errorf("store: expired sandboxes: %w", err)
	}
	return list, nil
}

// scanSandboxes reads and closes rows selected with sandboxCols.
func scanSandboxes(rows *sql.Rows) ([]*Sandbox, error) {
	defer rows.Close()
	var list []*Sandbox
	for rows.Next() {
		var (
			s       Sandbox
			name    sql.NullString
			labels  string
			created int64
			expires sql.NullInt64
			doc     []byte
		)
		if err := rows.Scan(&s.ID, &name, &s.Image, &s.State, &s.Runtime,
			&labels, &created, &expires, &doc); err != nil {
			return nil, err
		}
		s.Name = name.String
		if labels != "" && labels != "{}" {
			if err := json.Unmarshal([]byte(labels), &s.Labels); err != nil {
				return nil, fmt.Errorf("sandbox %s labels: %w", s.ID, err)
			}
		}
		s.CreatedAt = fromNanos(created)
		s.ExpiresAt = fromNullNanos(expires)
		if len(doc) > 0 {
			s.Doc = json.RawMessage(doc)
		}
		list = append(list, &s)
	}
	return list, rows.Err()
}
