package egress

import (
	"fmt"
	"sync"
	"time"
)

// limiter bounds each sandbox's concurrent connections and the rate of its
// new ones (a token bucket).
type limiter struct {
	mu    sync.Mutex
	max   int
	rate  float64 // tokens per second; 0 = unlimited
	burst float64
	m     map[string]*sbLimit
	swept time.Time
}

type sbLimit struct {
	active int
	tokens float64
	last   time.Time
}

func newLimiter(max int, rate float64) *limiter {
	return &limiter{max: max, rate: rate, burst: max1(rate), m: map[string]*sbLimit{}}
}

func max1(r float64) float64 {
	if r < 1 {
		return 1
	}
	return r
}

func (l *limiter) get(id string, now time.Time) *sbLimit {
	e := l.m[id]
	if e == nil {
		e = &sbLimit{tokens: l.burst, last: now}
		l.m[id] = e
	}
	if l.rate > 0 {
		e.tokens = min(l.burst, e.tokens+now.Sub(e.last).Seconds()*l.rate)
	}
	e.last = now
	return e
}

// takeToken spends one token of id's rate budget.
func (l *limiter) takeToken(e *sbLimit) bool {
	if l.rate <= 0 {
		return true
	}
	if e.tokens < 1 {
		return false
	}
	e.tokens--
	return true
}

// acquire takes a connection slot and a rate token for id; release gives
// the slot back.
func (l *limiter) acquire(id string) (bool, string) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	e := l.get(id, now)
	if e.active >= l.max {
		return false, fmt.Sprintf("too many connections (limit %d per sandbox)", l.max)
	}
	if !l.takeToken(e) {
		return false, "rate limit"
	}
	e.active++
	return true, ""
}

// token takes only a rate token (a further request on a kept-alive
// explicit-proxy connection).
func (l *limiter) token(id string) bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.takeToken(l.get(id, now))
}

func (l *limiter) release(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[id]
	if e == nil {
		return
	}
	e.active--
	if e.active <= 0 && l.rate <= 0 {
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
		if e.active <= 0 && (l.rate <= 0 || e.tokens+now.Sub(e.last).Seconds()*l.rate >= l.burst) {
			delete(l.m, id)
		}
	}
}
