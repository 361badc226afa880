package agent

import (
	"bytes"
	"errors"
	"sync"
	"time"
)

// ring is a bounded output buffer addressed by absolute byte offsets. It
// keeps the newest max bytes; a cursor that falls behind sees how many bytes
// it lost. Blocking cursors (an attached client) hold back writers instead of
// losing data, until they detach.
type ring struct {
	mu     sync.Mutex
	cond   sync.Cond
	buf    []byte // grows up to max; a ring once full
	head   int    // index in buf of offset start
	max    int
	start  int64 // oldest retained offset
	end    int64 // offset after the newest byte
	closed bool
	block  map[*cursor]struct{}
	marks  []mark // when output arrived, for "since" queries
}

// mark records that output at offset off arrived at time t.
type mark struct {
	off int64
	t   time.Time
}

type cursor struct {
	off      int64
	detached bool
}

var errDetached = errors.New("reader detached")

func newRing(max int) *ring {
	r := &ring{max: max, block: map[*cursor]struct{}{}}
	r.cond.L = &r.mu
	return r
}

func (r *ring) index(off int64) int {
	return (r.head + int(off-r.start)) % len(r.buf)
}

// grow enlarges the buffer to hold n more bytes, up to max.
func (r *ring) grow(n int) {
	used := int(r.end - r.start)
	if used+n <= len(r.buf) || len(r.buf) == r.max {
		return
	}
	size := max(len(r.buf)*2, used+n, 4096)
	size = min(size, r.max)
	nb := make([]byte, size)
	r.copyOut(nb[:used], r.start)
	r.buf, r.head = nb, 0
}

func (r *ring) copyOut(dst []byte, off int64) {
	if len(dst) == 0 {
		return
	}
	i := r.index(off)
	n := copy(dst, r.buf[i:])
	copy(dst[n:], r.buf[:len(dst)-n])
}

// space is how many bytes can be written without overtaking a blocking cursor.
func (r *ring) space() int {
	if len(r.block) == 0 {
		return r.max
	}
	min := r.end
	for c := range r.block {
		min = minOff(min, c.off)
	}
	return r.max - int(r.end-min)
}

func minOff(a, b int64) int64 {
	if a < b {
		return a
	}
	return b
}

// Write appends p, dropping the oldest bytes when full; it waits while a
// blocking cursor has not read what would be dropped.
func (r *ring) Write(p []byte) (int, error) {
	total := len(p)
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(p) > 0 {
		n := min(len(p), r.space())
		if n <= 0 {
			r.cond.Wait()
			continue
		}
		r.grow(n)
		if over := int(r.end-r.start) + n - len(r.buf); over > 0 { // full: drop the oldest
			r.start += int64(over)
			r.head = (r.head + over) % len(r.buf)
		}
		now := time.Now()
		if len(r.marks) == 0 || now.Sub(r.marks[len(r.marks)-1].t) > 50*time.Millisecond {
			r.marks = append(r.marks, mark{r.end, now})
			for len(r.marks) > 1 && r.marks[1].off <= r.start {
				r.marks = r.marks[1:]
			}
		}
		i := (r.head + int(r.end-r.start)) % len(r.buf)
		c := copy(r.buf[i:], p[:n])
		copy(r.buf, p[c:n])
		r.end += int64(n)
		p = p[n:]
		r.cond.Broadcast()
	}
	return total, nil
}

// Close marks the end of output.
func (r *ring) Close() {
	r.mu.Lock()
	r.closed = true
	r.cond.Broadcast()
	r.mu.Unlock()
}

// Attach returns a cursor at offset from. A cursor before what is retained
// first reads how many bytes were dropped.
func (r *ring) Attach(from int64, blocking bool) *cursor {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := &cursor{off: from}
	if blocking {
		r.block[c] = struct{}{}
	}
	return c
}

// Detach releases c; a reader blocked on it returns errDetached.
func (r *ring) Detach(c *cursor) {
	r.mu.Lock()
	c.detached = true
	delete(r.block, c)
	r.cond.Broadcast()
	r.mu.Unlock()
}

// Read copies the next bytes for c into p. dropped is the number of bytes
// that were lost before them. It returns io.EOF-like done=true at the end.
func (r *ring) Read(c *cursor, p []byte) (n int, dropped int64, done bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c.off >= r.end && !r.closed && !c.detached {
		r.cond.Wait()
	}
	if c.detached {
		return 0, 0, false, errDetached
	}
	if c.off < r.start {
		dropped = r.start - c.off
		c.off = r.start
	}
	if c.off >= r.end {
		return 0, dropped, r.closed, nil
	}
	n = min(len(p), int(r.end-c.off))
	r.copyOut(p[:n], c.off)
	c.off += int64(n)
	r.cond.Broadcast()
	return n, dropped, false, nil
}

// Len reports the retained byte count and the total written.
func (r *ring) Len() (retained, total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.end - r.start, r.end
}

// OffsetSince is the offset of the first output that arrived at or after t
// (to the 50 ms granularity of the marks).
func (r *ring) OffsetSince(t time.Time) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.marks {
		if !m.t.Before(t) {
			return max(m.off, r.start)
		}
	}
	return r.end
}

// OffsetTail is the offset where the last n lines of retained output begin.
func (r *ring) OffsetTail(n int) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	data := make([]byte, r.end-r.start)
	r.copyOut(data, r.start)
	end := len(data)
	if end > 0 && data[end-1] == '\n' {
		end-- // a final newline ends the last line rather than starting one
	}
	for i := 0; i < n; i++ {
		j := bytes.LastIndexByte(data[:end], '\n')
		if j < 0 {
			return r.start
		}
		end = j
	}
	return r.start + int64(end) + 1
}

// End is the offset after the newest byte.
func (r *ring) End() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.end
}
