package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Image is the stored form of a local image.
type Image struct {
	Name   string   // unique key, e.g. "debian:bookworm"
	ID     string   // digest
	Layers []string // layer digests, bottom first
	// CreatedAt orders listings. PutImage sets it to the current time when
	// it is zero.
	CreatedAt time.Time
	Size      int64
	Doc       json.RawMessage // the full API record, opaque to the store
}

const imageCols = `name, id, layers, created_at, size, doc`

// PutImage inserts img, or replaces the image with the same name.
func (db *DB) PutImage(ctx context.Context, img *Image) error {
	if img == nil || img.Name == "" {
		return errors.New("store: image without name")
	}
	layers := "[]"
	if len(img.Layers) > 0 {
		b, err := json.Marshal(img.Layers)
		if err != nil {
			return fmt.Errorf("store: image %q layers: %w", img.Name, err)
		}
		layers = string(b)
	}
	if img.CreatedAt.IsZero() {
		img.CreatedAt = time.Now()
	}
	_, err := db.w.ExecContext(ctx, `INSERT INTO images (`+imageCols+`)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET
			id = excluded.id, layers = excluded.layers, created_at = excluded.created_at,
			size = excluded.size, doc = excluded.doc`,
		img.Name, img.ID, layers, toNanos(img.CreatedAt), img.Size, nullText(img.Doc))
	if err != nil {
		return fmt.Errorf("store: put image %q: %w", img.Name, err)
	}
	return nil
}

// GetImage returns the image called name, or an error wrapping ErrNotFound.
func (db *DB) GetImage(ctx context.Context, name string) (*Image, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT `+imageCols+` FROM images WHERE name = ?`, name)
	if err != nil {
		return nil, fmt.Errorf("store: get image %q: %w", name, err)
	}
	list, err := scanImages(rows)
	if err != nil {
		return nil, fmt.Errorf("store: get image %q: %w", name, err)
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("image %q: %w", name, ErrNotFound)
	}
	return list[0], nil
}

// ListImages returns every image, sorted by name.
func (db *DB) ListImages(ctx context.Context) ([]*Image, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT `+imageCols+` FROM images ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list images: %w", err)
	}
	list, err := scanImages(rows)
	if err != nil {
		return nil, fmt.Errorf("store: list images: %w", err)
	}
	return list, nil
}

// DeleteImage removes the image called name. Deleting an image that does not
// exist is not an error. It does not check ImageInUse; callers do.
func (db *DB) DeleteImage(ctx context.Context, name string) error {
	if _, err := db.w.ExecContext(ctx, `DELETE FROM images WHERE name = ?`, name); err != nil {
		return fmt.Errorf("store: delete image %q: %w", name, err)
	}
	return nil
}

// ImageInUse returns the IDs of the sandboxes whose Image is name, oldest
// first; none (a nil slice) when the image is unused.
func (db *DB) ImageInUse(ctx context.Context, name string) ([]string, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT id FROM sandboxes WHERE image = ? ORDER BY created_at, id`, name)
	if err != nil {
		return nil, fmt.Errorf("store: image %q in use: %w", name, err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("store: image %q in use: %w", name, err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: image %q in use: %w", name, err)
	}
	return ids, nil
}

// LayerRefs returns, for every layer digest used by at least one image, the
// number of images using it. A layer missing from the map is unreferenced
// and may be garbage collected.
func (db *DB) LayerRefs(ctx context.Context) (map[string]int, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT l.value, count(DISTINCT i.name)
		FROM images AS i, json_each(i.layers) AS l GROUP BY l.value`)
	if err != nil {
		return nil, fmt.Errorf("store: layer refs: %w", err)
	}
	defer rows.Close()
	refs := make(map[string]int)
	for rows.Next() {
		var (
			digest string
			n      int
		)
		if err := rows.Scan(&digest, &n); err != nil {
			return nil, fmt.Errorf("store: layer refs: %w", err)
		}
		refs[digest] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: layer refs: %w", err)
	}
	return refs, nil
}

// scanImages reads and closes rows selected with imageCols.
func scanImages(rows *sql.Rows) ([]*Image, error) {
	defer rows.Close()
	var list []*Image
	for rows.Next() {
		var (
			img     Image
			layers  string
			created int64
			doc     []byte
		)
		if err := rows.Scan(&img.Name, &img.ID, &layers, &created, &img.Size, &doc); err != nil {
			return nil, err
		}
		if layers != "" && layers != "[]" {
			if err := json.Unmarshal([]byte(layers), &img.Layers); err != nil {
				return nil, fmt.Errorf("image %q layers: %w", img.Name, err)
			}
		}
		img.CreatedAt = fromNanos(created)
		if len(doc) > 0 {
			img.Doc = json.RawMessage(doc)
		}
		list = append(list, &img)
	}
	return list, rows.Err()
}
