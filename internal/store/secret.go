package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// PutSecret stores (or replaces) a secret's value.
func (db *DB) PutSecret(ctx context.Context, name string, value []byte) error {
	_, err := db.w.ExecContext(ctx, `INSERT INTO secrets (name, value, updated_at) VALUES (?, ?, ?)
		ON CONFLICT(name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at`,
		name, value, time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("store: put secret %q: %w", name, err)
	}
	return nil
}

// GetSecret returns a secret's value; ErrNotFound if there is none.
func (db *DB) GetSecret(ctx context.Context, name string) ([]byte, error) {
	var v []byte
	err := db.r.QueryRowContext(ctx, `SELECT value FROM secrets WHERE name = ?`, name).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("secret %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: get secret %q: %w", name, err)
	}
	return v, nil
}

// SecretNames lists the stored secrets' names (never their values).
func (db *DB) SecretNames(ctx context.Context) ([]string, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT name FROM secrets ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list secrets: %w", err)
	}
	defer rows.Close()
	names := []string{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	return names, rows.Err()
}

// DeleteSecret removes a secret. Idempotent.
func (db *DB) DeleteSecret(ctx context.Context, name string) error {
	if _, err := db.w.ExecContext(ctx, `DELETE FROM secrets WHERE name = ?`, name); err != nil {
		return fmt.Errorf("store: delete secret %q: %w", name, err)
	}
	return nil
}
