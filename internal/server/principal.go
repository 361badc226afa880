package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/sandbox"
)

// Principal is who a request acts for: the admin (the daemon's own token, or
// anyone on the root-only unix socket) or one scoped token. Routes consult it
// to decide which sandboxes, processes, events, snapshots and ports a request
// may see.
type Principal struct {
	// Admin sees and controls everything.
	Admin bool
	// TokenID is the scoped token's id; "" for the admin.
	TokenID string
	// Name is a label for logs and events ("admin", or the token's name).
	Name string
	// Sandbox, when set, confines the request to that one sandbox (an SSH key
	// authorised for a single sandbox). It narrows Admin or TokenID further.
	Sandbox string
}

// AdminPrincipal acts for the daemon's administrator.
var AdminPrincipal = &Principal{Admin: true, Name: "admin"}

type principalKey struct{}

// WithPrincipal returns ctx carrying p. It also gives ctx p's sandbox
// scope (without a token's quota, which the Server adds per request), so a
// front end that calls the sandbox manager directly with this context sees
// only what p may; a nil p sees nothing.
func WithPrincipal(ctx context.Context, p *Principal) context.Context {
	sc := &sandbox.Scope{}
	if p != nil {
		sc = &sandbox.Scope{All: p.Admin, Owner: p.TokenID, Sandbox: p.Sandbox}
	}
	return sandbox.WithScope(context.WithValue(ctx, principalKey{}, p), sc)
}

// PrincipalFrom returns the principal a request acts for, or nil when none
// was established (which every route must treat as "no access").
func PrincipalFrom(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}

// AsAdmin wraps h so every request acts for the admin: the handler for
// listeners that are secure by construction (the root-only unix socket).
func AsAdmin(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), AdminPrincipal)))
	})
}

// InProcess serves a handler to in-memory connections, each acting for the
// principal it was dialled with, for den's own front ends that run inside the
// daemon (the MCP endpoint, the SSH gateway). Requests through it skip bearer
// authentication: the front end has already authenticated its caller.
// Streaming responses and connection upgrades (WebSocket) work as over TCP.
type InProcess struct {
	srv   *http.Server
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// NewInProcess starts serving h in memory.
func NewInProcess(h http.Handler) *InProcess {
	ip := &InProcess{conns: make(chan net.Conn), done: make(chan struct{})}
	ip.srv = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if pc, ok := c.(*principalConn); ok {
				return WithPrincipal(ctx, pc.p)
			}
			return ctx
		},
	}
	go ip.srv.Serve(memListener{ip})
	return ip
}

// Client returns a den API client whose requests act for p.
func (ip *InProcess) Client(p *Principal) *client.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return ip.dial(ctx, p)
		},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
	return &client.Client{Host: "http://den.in-process", Token: "in-process", HTTPClient: &http.Client{Transport: tr}}
}

func (ip *InProcess) dial(ctx context.Context, p *Principal) (net.Conn, error) {
	a, b := net.Pipe()
	select {
	case ip.conns <- &principalConn{Conn: b, p: p}:
		return a, nil
	case <-ip.done:
		a.Close()
		b.Close()
		return nil, errors.New("den: in-process server closed")
	case <-ctx.Done():
		a.Close()
		b.Close()
		return nil, ctx.Err()
	}
}

// Close stops serving; connections in flight are closed.
func (ip *InProcess) Close() error {
	ip.once.Do(func() { close(ip.done) })
	return ip.srv.Close()
}

// memListener hands the server the connections Client's transports dial.
type memListener struct{ ip *InProcess }

func (l memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ip.conns:
		return c, nil
	case <-l.ip.done:
		return nil, net.ErrClosed
	}
}

func (l memListener) Close() error {
	l.ip.once.Do(func() { close(l.ip.done) })
	return nil
}

func (memListener) Addr() net.Addr { return inProcessAddr{} }

type inProcessAddr struct{}

func (inProcessAddr) Network() string { return "memory" }
func (inProcessAddr) String() string  { return "den.in-process" }

type principalConn struct {
	net.Conn
	p *Principal
}
