package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Event is one entry of the append-only event log.
type Event struct {
	Seq     int64     // assigned by AddEvent; strictly increasing
	Time    time.Time // set by AddEvent when zero
	Sandbox string    // sandbox ID; empty for daemon-wide events
	Type    string    // e.g. "sandbox.create", "exec.end"
	Data    json.RawMessage
}

// EventFilter selects events. Zero fields select everything.
type EventFilter struct {
	Sandbox string // exact sandbox ID
	// Sandboxes, when not nil, selects only the events of these sandbox IDs.
	Sandboxes []string
	Type      string    // prefix of Type: "exec." matches "exec.start" and "exec.end"
	Since     time.Time // events at or after this time
	AfterSeq  int64     // events with Seq > AfterSeq
	Limit     int       // at most this many, the oldest first; 0 = no limit
}

const addEventSQL = `INSERT INTO events (time, sandbox, type, data) VALUES (?, ?, ?, ?)`

// AddEvent appends e to the log, setting e.Seq and, when it is zero, e.Time.
func (db *DB) AddEvent(ctx context.Context, e *Event) error {
	if e == nil || e.Type == "" {
		return errors.New("store: event without type")
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	res, err := db.addEvent.ExecContext(ctx, toNanos(e.Time), e.Sandbox, e.Type, nullText(e.Data))
	if err != nil {
		return fmt.Errorf("store: add event %s: %w", e.Type, err)
	}
	seq, err := res.LastInsertId()
	if err != nil {
		return fmt.Errorf("store: add event %s: %w", e.Type, err)
	}
	e.Seq = seq
	return nil
}

// Events returns the events matching f in Seq order.
func (db *DB) Events(ctx context.Context, f EventFilter) ([]*Event, error) {
	var q strings.Builder
	q.WriteString(`SELECT seq, time, sandbox, type, data FROM events WHERE seq > ?`)
	args := []any{f.AfterSeq}
	if f.Sandbox != "" {
		q.WriteString(` AND sandbox = ?`)
		args = append(args, f.Sandbox)
	}
	if f.Sandboxes != nil {
		q.WriteString(` AND sandbox IN (SELECT value FROM json_each(?))`)
		ids, _ := json.Marshal(f.Sandboxes)
		args = append(args, string(ids))
	}
	if f.Type != "" {
		// substr counts characters, as does utf8.RuneCountInString.
		q.WriteString(` AND substr(type, 1, ?) = ?`)
		args = append(args, utf8.RuneCountInString(f.Type), f.Type)
	}
	if !f.Since.IsZero() {
		q.WriteString(` AND time >= ?`)
		args = append(args, toNanos(f.Since))
	}
	q.WriteString(` ORDER BY seq`)
	if f.Limit > 0 {
		q.WriteString(` LIMIT ?`)
		args = append(args, f.Limit)
	}
	rows, err := db.r.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("store: events: %w", err)
	}
	defer rows.Close()
	var list []*Event
	for rows.Next() {
		var (
			e    Event
			t    int64
			data []byte
		)
		if err := rows.Scan(&e.Seq, &t, &e.Sandbox, &e.Type, &data); err != nil {
			return nil, fmt.Errorf("store: events: %w", err)
		}
		e.Time = fromNanos(t)
		if len(data) > 0 {
			e.Data = json.RawMessage(data)
		}
		list = append(list, &e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: events: %w", err)
	}
	return list, nil
}
