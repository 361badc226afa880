package server

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/sandbox"
)

// Authenticate wraps h for a TCP listener: every request must carry
// "Authorization: Bearer TOKEN", where TOKEN is the daemon's admin token
// (its data dir's token file) or a scoped token made with POST /v1/tokens.
// The request then acts for that Principal. Previews are let through: they
// carry their own per-port tokens.
func (s *Server) Authenticate(h http.Handler, adminToken string) http.Handler {
	admin := []byte(adminToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/preview/") {
			h.ServeHTTP(w, r)
			return
		}
		p, err := s.principalForBearer(r.Context(), r.Header.Get("Authorization"), admin)
		if err != nil {
			writeError(w, err)
			return
		}
		h.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
	})
}

// principalForBearer resolves an Authorization header's bearer token.
func (s *Server) principalForBearer(ctx context.Context, header string, admin []byte) (*Principal, error) {
	tok, ok := strings.CutPrefix(header, "Bearer ")
	if !ok || tok == "" {
		return nil, api.Errorf(api.KindUnauthorized, "missing bearer token: set DEN_TOKEN (the admin's is in the daemon's data dir, file token; scoped ones come from den token create)")
	}
	if len(admin) > 0 && subtle.ConstantTimeCompare([]byte(tok), admin) == 1 {
		return AdminPrincipal, nil
	}
	if strings.HasPrefix(tok, sandbox.TokenPrefix) {
		if doc, err := s.creds.TokenForSecret(ctx, tok); err == nil {
			return &Principal{TokenID: doc.ID, Name: doc.Name}, nil
		}
	}
	return nil, api.Errorf(api.KindUnauthorized, "wrong or revoked bearer token: check DEN_TOKEN (den token ls shows the tokens that are valid)")
}

// scopeFor turns a request's principal into the scope the sandbox manager
// checks every lookup against. A nil principal, or one that is neither the
// admin nor a token that still exists, has no access. A token's quota and
// caps are read afresh on each request, so a revoked token stops working
// on its next request, whichever front end it came through.
func (s *Server) scopeFor(ctx context.Context, p *Principal) (*sandbox.Scope, error) {
	var sc *sandbox.Scope
	switch {
	case p == nil:
		return nil, api.Errorf(api.KindUnauthorized, "no credentials: send a bearer token (DEN_TOKEN)")
	case p.Admin:
		sc = &sandbox.Scope{All: true}
	case p.TokenID != "":
		doc, err := s.creds.Token(ctx, p.TokenID)
		if err != nil {
			return nil, api.Errorf(api.KindUnauthorized, "token %s is revoked or unknown", p.TokenID)
		}
		sc = &sandbox.Scope{Owner: doc.ID, MaxSandboxes: doc.MaxSandboxes, MaxVolumes: doc.MaxVolumes, MaxSnapshots: doc.MaxSnapshots, MaxImages: doc.MaxImages,
			Caps: api.Limits{CPUs: doc.CPUs, Memory: doc.Memory, Disk: doc.Disk}}
	default:
		return nil, api.Errorf(api.KindUnauthorized, "no credentials: send a bearer token (DEN_TOKEN)")
	}
	if p.Sandbox != "" {
		// Narrowed to one sandbox: resolve a name or prefix to its id
		// within what the principal sees anyway.
		sc.Sandbox = p.Sandbox
		if sb, err := s.m.Get(sandbox.WithScope(ctx, &sandbox.Scope{All: sc.All, Owner: sc.Owner}), p.Sandbox); err == nil {
			sc.Sandbox = sb.ID
		}
	}
	return sc, nil
}

// adminOnly serves h only to the admin (not to scoped tokens, nor to a
// principal narrowed to one sandbox).
func adminOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !sandbox.ScopeFrom(r.Context()).IsAdmin() {
			writeError(w, api.Errorf(api.KindUnauthorized, "%s %s is for the admin token only", r.Method, r.Pattern))
			return
		}
		h(w, r)
	}
}
