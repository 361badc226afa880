package egress

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// limiter bounds each sandbox's concurrent connections and the rate of its
// new ones (a token bucket per sandbox, at the sandbox's Policy.ConnRate or
// else Config.ConnRate).
type limiter struct {
	mu    sync.Mutex
	max   int
	rate  float64 // default tokens per second; 0 = unlimited
	m     map[string]*sbLimit
	swept time.Time
}

type sbLimit struct {
	active int
	rate   float64 // the rate last applied; 0 = unlimited
	tokens float64
	last   time.Time
}

func newLimiter(max int, rate float64) *limiter {
	return &limiter{max: max, rate: rate, m: map[string]*sbLimit{}}
}

func max1(r float64) float64 {
	if r < 1 {
		return 1
	}
	return r
}

// get returns id's entry with its bucket refilled at rate (the sandbox's
// own; ≤ 0 means the default).
func (l *limiter) get(id string, rate float64, now time.Time) *sbLimit {
	if !(rate > 0) {
		rate = l.rate
	}
	e := l.m[id]
	if e == nil {
		e = &sbLimit{rate: rate, tokens: max1(rate), last: now}
		l.m[id] = e
	}
	switch {
	case rate <= 0:
	case e.rate <= 0:
		e.tokens = max1(rate) // was unlimited: start with a full bucket
	default:
		e.tokens = min(max1(rate), e.tokens+now.Sub(e.last).Seconds()*rate)
	}
	e.rate = rate
	e.last = now
	return e
}

// takeToken spends one token of e's rate budget.
func takeToken(e *sbLimit) bool {
	if e.rate <= 0 {
		return true
	}
	if e.tokens < 1 {
		return false
	}
	e.tokens--
	return true
}

// acquire takes a connection slot and a rate token for id, at rate (the
// sandbox's Policy.ConnRate; ≤ 0 = Config.ConnRate); release gives the slot
// back.
func (l *limiter) acquire(id string, rate float64) (bool, string) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	e := l.get(id, rate, now)
	if e.active >= l.max {
		return false, fmt.Sprintf("too many connections (limit %d per sandbox)", l.max)
	}
	if !takeToken(e) {
		return false, "rate limit"
	}
	e.active++
	return true, ""
}

// token takes only a rate token (a further request on a kept-alive
// explicit-proxy connection).
func (l *limiter) token(id string, rate float64) bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return takeToken(l.get(id, rate, now))
}

func (l *limiter) release(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[id]
	if e == nil {
		return
	}
	e.active--
	if e.active <= 0 && e.rate <= 0 {
		delete(l.m, id)
	}
}

// sweep drops idle entries whose bucket is full again, once a minute.
func (l *limiter) sweep(now time.Time) {
	if now.Sub(l.swept) < time.Minute {
		return
	}
	l.swept = now
	for id, e := range l.m {
		if e.active <= 0 && (e.rate <= 0 || e.tokens+now.Sub(e.last).Seconds()*e.rate >= max1(e.rate)) {
			delete(l.m, id)
		}
	}
}

// ---- egress byte accounting ----

// byteCount is a sandbox's total of client → upstream bytes.
type byteCount struct {
	n     atomic.Int64
	users int // connections using it; guarded by Server.bytesMu
}

// meter accounts one connection's client → upstream bytes to its
// sandbox's byteCount. Without a limit, the transparent and CONNECT relays
// add their total when the connection ends (keeping the splice fast path);
// with one, every chunk is reserved before it is sent, and the connection
// stops at the limit.
type meter struct {
	id    string
	c     *byteCount
	limit int64 // 0 = unlimited
}

// errByteLimit ends a connection that reached its sandbox's MaxEgressBytes.
var errByteLimit = errors.New("egress byte limit reached")

func byteLimitReason(limit int64) string {
	return fmt.Sprintf("egress byte limit reached (%d bytes)", limit)
}

func (m *meter) limited() bool { return m != nil && m.limit > 0 }

// exhausted reports whether the limit is reached.
func (m *meter) exhausted() bool { return m.limited() && m.c.n.Load() >= m.limit }

// room is what may still be sent under the limit.
func (m *meter) room() int64 { return m.limit - m.c.n.Load() }

// reserve grants up to n bytes under the limit and counts them.
func (m *meter) reserve(n int64) int64 {
	for {
		cur := m.c.n.Load()
		g := min(n, m.limit-cur)
		if g <= 0 {
			return 0
		}
		if m.c.n.CompareAndSwap(cur, cur+g) {
			return g
		}
	}
}

// add counts n bytes sent without a limit.
func (m *meter) add(n int64) {
	if m != nil && n > 0 {
		m.c.n.Add(n)
	}
}

// meteredWriter writes to w, counting every byte to the sandbox as it goes
// and, with a limit, refusing (errByteLimit) what would exceed it.
type meteredWriter struct {
	w io.Writer
	m *meter
	n int64 // bytes written
}

func (w *meteredWriter) Write(p []byte) (int, error) {
	if !w.m.limited() {
		n, err := w.w.Write(p)
		w.n += int64(n)
		w.m.add(int64(n))
		return n, err
	}
	g := w.m.reserve(int64(len(p)))
	n, err := w.w.Write(p[:g])
	w.n += int64(n)
	if err == nil && g < int64(len(p)) {
		err = errByteLimit
	}
	return n, err
}

// copyMetered copies src to dst through a pooled buffer, reserving each
// chunk under m's limit before writing it; it stops with errByteLimit when
// the client sends more than the limit allows.
func copyMetered(dst io.Writer, src io.Reader, m *meter) (int64, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var total int64
	for {
		// Read no more than may be sent, but at least a byte: at the limit,
		// EOF still ends the copy cleanly.
		p := buf[:max(1, min(int64(len(buf)), m.room()))]
		nr, rerr := src.Read(p)
		if nr > 0 {
			g := m.reserve(int64(nr))
			nw, werr := dst.Write(p[:g])
			total += int64(nw)
			if werr != nil {
				return total, werr
			}
			if g < int64(nr) {
				return total, errByteLimit
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				return total, nil
			}
			return total, rerr
		}
	}
}

// openMeter starts accounting a connection of sandbox id, whose policy
// sets limit (MaxEgressBytes); why is set when the limit is already
// reached. closeMeter must follow.
func (s *Server) openMeter(id string, limit int64) (m *meter, why string) {
	s.bytesMu.Lock()
	c := s.bytes[id]
	if c == nil {
		c = &byteCount{}
		s.bytes[id] = c
	}
	c.users++
	s.bytesMu.Unlock()
	m = &meter{id: id, c: c, limit: max(limit, 0)}
	if m.exhausted() {
		return m, byteLimitReason(m.limit)
	}
	return m, ""
}

func (s *Server) closeMeter(m *meter) {
	s.bytesMu.Lock()
	defer s.bytesMu.Unlock()
	m.c.users--
	if m.c.users <= 0 && m.c.n.Load() == 0 && s.bytes[m.id] == m.c {
		delete(s.bytes, m.id)
	}
}

// EgressBytes is the number of bytes (sandbox → upstream) this Server has
// relayed for sandbox, plus what SetEgressBytes seeded. Connections without
// a byte limit are counted when they end; intercepted requests and
// connections under a limit, as they go.
func (s *Server) EgressBytes(sandbox string) int64 {
	s.bytesMu.Lock()
	c := s.bytes[sandbox]
	s.bytesMu.Unlock()
	if c == nil {
		return 0
	}
	return c.n.Load()
}

// SetEgressBytes sets sandbox's egress byte counter to n (negative counts
// as 0), for example to restore it after a restart; the bytes relayed from
// then on are added to it. Setting 0 for a sandbox without connections in
// progress also frees its entry (call it when a sandbox is removed).
func (s *Server) SetEgressBytes(sandbox string, n int64) {
	n = max(n, 0)
	s.bytesMu.Lock()
	defer s.bytesMu.Unlock()
	c := s.bytes[sandbox]
	if c == nil {
		if n == 0 {
			return
		}
		c = &byteCount{}
		s.bytes[sandbox] = c
	}
	c.n.Store(n)
	if n == 0 && c.users <= 0 {
		delete(s.bytes, sandbox)
	}
}
