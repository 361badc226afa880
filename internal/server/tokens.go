package server

import (
	"context"
	"encoding/json"
	"net/http"
	"runtime"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/sandbox"
)

// Scoped API tokens: the routes and their checks. What a token is in the
// store (only its secret's hash is kept) is sandbox.Credentials'.

func validTokenName(n string) bool {
	if n == "" || len(n) > 63 {
		return false
	}
	for i, c := range n {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '_' || c == '.' || c == '-'):
		default:
			return false
		}
	}
	return true
}

func validateTokenRequest(req *api.TokenRequest) error {
	if req.Name == "" {
		return api.FieldError("name", "missing: name the token (for example after the agent that uses it)")
	}
	if !validTokenName(req.Name) {
		return api.FieldError("name", "%q: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit", req.Name)
	}
	for _, c := range []struct {
		field string
		n     int
	}{{"max_sandboxes", req.MaxSandboxes}, {"max_volumes", req.MaxVolumes}, {"max_snapshots", req.MaxSnapshots}, {"max_images", req.MaxImages}} {
		if c.n < 0 {
			return api.FieldError(c.field, "%d is negative: use 0 for no bound", c.n)
		}
	}
	if req.CPUs < 0 || req.CPUs > float64(runtime.NumCPU()) {
		return api.FieldError("cpus", "%g is out of range: this host has %d CPUs (0: no cap)", req.CPUs, runtime.NumCPU())
	}
	if req.CPUs > 0 && req.CPUs < 0.01 {
		return api.FieldError("cpus", "%g is below the minimum of 0.01", req.CPUs)
	}
	if req.Memory < 0 || req.Memory > 0 && req.Memory < 8<<20 {
		return api.FieldError("memory", "%s is below the minimum of 8m (0: no cap)", req.Memory)
	}
	if req.Disk < 0 || req.Disk > 0 && req.Disk < 16<<20 {
		return api.FieldError("disk", "%s is below the minimum of 16m (0: no cap)", req.Disk)
	}
	return nil
}

// CreateToken makes a scoped token; the answer holds its secret, which is
// not kept anywhere.
func (s *Server) CreateToken(ctx context.Context, req api.TokenRequest) (*api.Token, error) {
	if err := validateTokenRequest(&req); err != nil {
		return nil, err
	}
	if req.Disk > 0 && !s.m.DiskQuotas() {
		return nil, api.FieldError("disk", "disk caps need den's managed filesystem (btrfs) with quotas, which this daemon does not have: see den info")
	}
	return s.creds.CreateToken(ctx, req)
}

// PrincipalForToken is the principal of the scoped token with this id, for
// front ends that authenticate callers their own way (the SSH gateway maps
// a key to a token id). It fails for an unknown or revoked token. Every
// request made for the principal checks the token again.
func (s *Server) PrincipalForToken(ctx context.Context, tokenID string) (*Principal, error) {
	d, err := s.creds.Token(ctx, tokenID)
	if err != nil {
		return nil, api.Errorf(api.KindUnauthorized, "token %q is revoked or unknown", tokenID)
	}
	return &Principal{TokenID: d.ID, Name: d.Name}, nil
}

// Tokens lists the scoped tokens, each with how many sandboxes it has.
func (s *Server) Tokens(ctx context.Context) ([]*api.Token, error) {
	list, err := s.creds.Tokens(ctx)
	if err != nil {
		return nil, err
	}
	all, err := s.m.List(sandbox.WithScope(ctx, nil), nil)
	if err != nil {
		return nil, err
	}
	count := map[string]int{}
	for _, sb := range all {
		count[sb.Owner]++
	}
	for _, t := range list {
		t.Sandboxes = count[t.ID]
	}
	return list, nil
}

// RemoveToken revokes a token (by id, unique id prefix or name): its next
// request is refused, and its requests in flight (streams, terminals, port
// forwards, SSH sessions' and MCP calls' requests) are ended with the
// reason. Its sandboxes stay, for the admin to see and remove.
func (s *Server) RemoveToken(ctx context.Context, idOrName string) error {
	return s.creds.RemoveToken(ctx, idOrName, func(id, name string) int {
		return s.live.end(id, errRevoked(id, name))
	})
}

func (s *Server) tokenRoutes() {
	h := s.mux.HandleFunc
	h("POST /v1/tokens", adminOnly(func(w http.ResponseWriter, r *http.Request) {
		// Sizes are decoded apart, so a bad size names its field.
		var body struct {
			Name         string          `json:"name"`
			MaxSandboxes int             `json:"max_sandboxes"`
			MaxVolumes   int             `json:"max_volumes"`
			MaxSnapshots int             `json:"max_snapshots"`
			MaxImages    int             `json:"max_images"`
			CPUs         float64         `json:"cpus"`
			Memory       json.RawMessage `json:"memory"`
			Disk         json.RawMessage `json:"disk"`
		}
		if err := decode(r, &body); err != nil {
			writeError(w, err)
			return
		}
		req := api.TokenRequest{Name: body.Name, MaxSandboxes: body.MaxSandboxes, MaxVolumes: body.MaxVolumes, MaxSnapshots: body.MaxSnapshots,
			MaxImages: body.MaxImages, CPUs: body.CPUs}
		for _, f := range []struct {
			name string
			raw  json.RawMessage
			dst  *api.Size
		}{{"memory", body.Memory, &req.Memory}, {"disk", body.Disk, &req.Disk}} {
			if len(f.raw) > 0 {
				if err := json.Unmarshal(f.raw, f.dst); err != nil {
					writeError(w, api.FieldError(f.name, "%v", err))
					return
				}
			}
		}
		t, err := s.CreateToken(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 201, t)
	}))
	h("GET /v1/tokens", adminOnly(func(w http.ResponseWriter, r *http.Request) {
		list, err := s.Tokens(r.Context())
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 200, list)
	}))
	h("DELETE /v1/tokens/{id}", adminOnly(func(w http.ResponseWriter, r *http.Request) {
		if err := s.RemoveToken(r.Context(), r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(204)
	}))
}
