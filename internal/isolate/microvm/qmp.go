package microvm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// qmp is a client of QEMU's machine protocol on a unix socket: one
// command at a time, events dropped (state is polled with query-status
// and query-migrate).
type qmp struct {
	mu   sync.Mutex
	conn net.Conn
	rd   *bufio.Reader
}

type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string `json:"event"`
}

// dialQMP connects to path, retrying until QEMU listens or ctx ends, and
// negotiates capabilities.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var conn net.Conn
	var err error
	for {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "unix", path)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to QMP %s: %w", path, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	q := &qmp{conn: conn, rd: bufio.NewReader(conn)}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	// The greeting, then capabilities negotiation.
	if _, err := q.rd.ReadBytes('\n'); err != nil {
		conn.Close()
		return nil, fmt.Errorf("QMP greeting: %w", err)
	}
	conn.SetDeadline(time.Time{})
	if _, err := q.run(ctx, "qmp_capabilities", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

// run executes one command and returns its "return" value.
func (q *qmp) run(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.conn == nil {
		return nil, errors.New("QMP connection closed")
	}
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	dl := time.Now().Add(30 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	q.conn.SetDeadline(dl)
	defer q.conn.SetDeadline(time.Time{})
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", cmd, err)
	}
	for {
		line, err := q.rd.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("QMP %s: %w", cmd, err)
		}
		var r qmpReply
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("QMP %s: bad reply %q", cmd, line)
		}
		if r.Event != "" {
			continue
		}
		if r.Error != nil {
			return nil, fmt.Errorf("QMP %s: %s: %s", cmd, r.Error.Class, r.Error.Desc)
		}
		return r.Return, nil
	}
}

// status is the VM's run state ("running", "paused", "postmigrate",
// "inmigrate", ...).
func (q *qmp) status(ctx context.Context) (string, error) {
	raw, err := q.run(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	json.Unmarshal(raw, &st)
	return st.Status, nil
}

func (q *qmp) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.conn != nil {
		q.conn.Close()
		q.conn = nil
	}
}
