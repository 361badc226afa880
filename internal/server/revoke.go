package server

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/coder/websocket"

	"github.com/den-dev/den/api"
)

// live tracks the requests in flight of each scoped token, so that revoking
// the token ends them at once: exec and log streams, terminals, port
// forwards, and the SSH sessions and MCP calls made of such requests
// (those front ends act through Server.ServeHTTP like any client). A
// request is tracked before its token is checked, so it either sees the
// token gone or is ended by the revocation.
type live struct {
	mu   sync.Mutex
	reqs map[string]map[*context.CancelCauseFunc]struct{}
}

// track gives a request of token id a context that revoking the token
// cancels; done stops tracking it.
func (l *live) track(ctx context.Context, id string) (_ context.Context, done func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	l.mu.Lock()
	if l.reqs == nil {
		l.reqs = map[string]map[*context.CancelCauseFunc]struct{}{}
	}
	if l.reqs[id] == nil {
		l.reqs[id] = map[*context.CancelCauseFunc]struct{}{}
	}
	l.reqs[id][&cancel] = struct{}{}
	l.mu.Unlock()
	return ctx, func() {
		l.mu.Lock()
		delete(l.reqs[id], &cancel)
		if len(l.reqs[id]) == 0 {
			delete(l.reqs, id)
		}
		l.mu.Unlock()
		cancel(nil)
	}
}

// end cancels every request of token id with cause and says how many.
func (l *live) end(id string, cause error) int {
	l.mu.Lock()
	reqs := l.reqs[id]
	delete(l.reqs, id)
	l.mu.Unlock()
	for c := range reqs {
		(*c)(cause)
	}
	return len(reqs)
}

// errRevoked is why a revoked token's requests end.
func errRevoked(id, name string) error {
	return api.Errorf(api.KindUnauthorized, "token %s (%s) was revoked: its streams, terminals and sessions are ended", id, name)
}

// reqErr is err, or why the request was ended when that is what ended it
// (its token was revoked).
func reqErr(r *http.Request, err error) error {
	if err != nil && r.Context().Err() != nil {
		var ae *api.Error
		if cause := context.Cause(r.Context()); errors.As(cause, &ae) {
			return ae
		}
	}
	return err
}

// closeWhenEnded closes WebSocket conns when the request's context ends:
// with a policy-violation close naming the reason when its token was
// revoked, at once otherwise. Stop the returned function when done.
func closeWhenEnded(r *http.Request, conns ...*websocket.Conn) (stop func() bool) {
	return context.AfterFunc(r.Context(), func() {
		var ae *api.Error
		if !errors.As(context.Cause(r.Context()), &ae) {
			for _, c := range conns {
				c.CloseNow()
			}
			return
		}
		reason := ae.Message
		if len(reason) > 120 { // a close reason is at most 123 bytes
			reason = reason[:120]
		}
		for _, c := range conns {
			go c.Close(websocket.StatusPolicyViolation, reason)
		}
	})
}

// acceptBridge accepts the request's WebSocket for a bridge to another
// connection (the agent's terminal, a TCP port) and runs bridge on it,
// with messages bounded by api.MaxTTYMessage. The bridge's ctx outlives a
// cancelled request context only until closeWhenEnded has closed the
// WebSocket, and also (the bridge's other end when it is one), with the
// reason; bridge calls cancel to end it early. The WebSocket is closed
// when bridge returns.
func acceptBridge(w http.ResponseWriter, r *http.Request, bridge func(ctx context.Context, cancel context.CancelFunc, c *websocket.Conn), also ...*websocket.Conn) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(api.MaxTTYMessage)
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	defer closeWhenEnded(r, append([]*websocket.Conn{c}, also...)...)()
	bridge(ctx, cancel, c)
}
