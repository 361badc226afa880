package server

import (
	"fmt"
	"net/http"
	"sync"

	"github.com/den-dev/den/client"
)

// Mount serves h at pattern on the API's mux, behind the same
// authentication as every other route (the listener's wrapper sets the
// request's principal first), for front ends built outside this package,
// like the MCP endpoint: s.Mount("/mcp", h).
// Its error answers are den error documents (errorDocs).
func (s *Server) Mount(pattern string, h http.Handler) { s.mux.Handle(pattern, errorDocs(h)) }

// CallerID names the principal a request acts for, for binding a front
// end's sessions to their caller; "" when the request has none.
func CallerID(r *http.Request) string {
	p := PrincipalFrom(r.Context())
	if p == nil {
		return ""
	}
	return fmt.Sprintf("admin=%t token=%q sandbox=%q", p.Admin, p.TokenID, p.Sandbox)
}

// maxCachedClients bounds the clients ClientFor keeps.
const maxCachedClients = 1024

// ClientFor returns a function that gives, for a request, a client acting
// through ip for the request's principal, or nil when it has none. Clients
// are kept per principal, so their connections are reused.
func (ip *InProcess) ClientFor() func(*http.Request) *client.Client {
	var mu sync.Mutex
	clients := map[string]*client.Client{}
	return func(r *http.Request) *client.Client {
		p := PrincipalFrom(r.Context())
		if p == nil {
			return nil
		}
		k := CallerID(r) + " name=" + p.Name
		mu.Lock()
		defer mu.Unlock()
		if c := clients[k]; c != nil {
			return c
		}
		if len(clients) >= maxCachedClients {
			for k, c := range clients {
				c.HTTPClient.CloseIdleConnections()
				delete(clients, k)
			}
		}
		c := ip.Client(p)
		clients[k] = c
		return c
	}
}
