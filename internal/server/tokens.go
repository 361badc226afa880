package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/sandbox"
	"github.com/den-dev/den/internal/store"
)

// Scoped API tokens are objects of kind "token" in the store. Only the
// SHA-256 of a token's secret is kept; the token's id is the first 16 hex
// digits of that hash, so a request's token is found by id and then
// compared in full, in constant time.

const (
	kindToken   = "token"
	tokenPrefix = "den_"
)

// tokenDoc is a token as stored: never the secret, only its hash.
type tokenDoc struct {
	api.Token
	Hash string `json:"hash"`
}

// hashSecret is the id and the full hex SHA-256 of a token's secret.
func hashSecret(secret string) (id, hash string) {
	sum := sha256.Sum256([]byte(secret))
	hash = hex.EncodeToString(sum[:])
	return hash[:16], hash
}

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
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("token secret: %w", err)
	}
	secret := tokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	id, hash := hashSecret(secret)
	doc := tokenDoc{Token: api.Token{ID: id, Name: req.Name, MaxSandboxes: req.MaxSandboxes, CPUs: req.CPUs, Memory: req.Memory, Disk: req.Disk,
		MaxVolumes: req.MaxVolumes, MaxSnapshots: req.MaxSnapshots, MaxImages: req.MaxImages, CreatedAt: time.Now().UTC()}, Hash: hash}
	raw, _ := json.Marshal(doc)
	err := s.db.PutObject(ctx, &store.Object{Kind: kindToken, ID: id, Name: req.Name, CreatedAt: doc.CreatedAt, Doc: raw})
	if errors.Is(err, store.ErrExists) {
		return nil, api.Errorf(api.KindExists, "a token named %q already exists: pick another name, or den token rm %s first", req.Name, req.Name)
	}
	if err != nil {
		return nil, err
	}
	s.db.AddEvent(ctx, &store.Event{Type: "token.create", Data: mustJSON(map[string]any{"id": id, "name": req.Name})})
	t := doc.Token
	t.Token = secret
	return &t, nil
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

func decodeToken(o *store.Object) (*tokenDoc, error) {
	var d tokenDoc
	if err := json.Unmarshal(o.Doc, &d); err != nil {
		return nil, fmt.Errorf("token %s: %w", o.ID, err)
	}
	return &d, nil
}

// token finds a token by its exact id.
func (s *Server) token(ctx context.Context, id string) (*tokenDoc, error) {
	o, err := s.db.GetObject(ctx, kindToken, id)
	if err == nil && o.ID != id {
		err = store.ErrNotFound
	}
	if err != nil {
		return nil, api.Errorf(api.KindNotFound, "no token %q", id)
	}
	return decodeToken(o)
}

// tokenForSecret finds the token whose secret this is.
func (s *Server) tokenForSecret(ctx context.Context, secret string) (*tokenDoc, error) {
	id, hash := hashSecret(secret)
	d, err := s.token(ctx, id)
	if err != nil {
		return nil, err
	}
	if subtle.ConstantTimeCompare([]byte(d.Hash), []byte(hash)) != 1 {
		return nil, api.Errorf(api.KindNotFound, "no token %q", id)
	}
	return d, nil
}

// PrincipalForToken is the principal of the scoped token with this id, for
// front ends that authenticate callers their own way (the SSH gateway maps
// a key to a token id). It fails for an unknown or revoked token. Every
// request made for the principal checks the token again.
func (s *Server) PrincipalForToken(ctx context.Context, tokenID string) (*Principal, error) {
	d, err := s.token(ctx, tokenID)
	if err != nil {
		return nil, api.Errorf(api.KindUnauthorized, "token %q is revoked or unknown", tokenID)
	}
	return &Principal{TokenID: d.ID, Name: d.Name}, nil
}

// Tokens lists the scoped tokens, each with how many sandboxes it has.
func (s *Server) Tokens(ctx context.Context) ([]*api.Token, error) {
	objs, err := s.db.ListObjects(ctx, kindToken, "")
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
	out := []*api.Token{}
	for _, o := range objs {
		d, err := decodeToken(o)
		if err != nil {
			continue
		}
		t := d.Token
		t.Sandboxes = count[t.ID]
		out = append(out, &t)
	}
	return out, nil
}

// RemoveToken revokes a token (by id, unique id prefix or name): its next
// request is refused, and its requests in flight (streams, terminals, port
// forwards, SSH sessions' and MCP calls' requests) are ended with the
// reason. Its sandboxes stay, for the admin to see and remove.
func (s *Server) RemoveToken(ctx context.Context, idOrName string) error {
	o, err := s.db.GetObject(ctx, kindToken, idOrName)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return api.Errorf(api.KindNotFound, "no token %q: see den token ls", idOrName)
	case errors.Is(err, store.ErrConflict):
		return api.Errorf(api.KindConflict, "%v: use more of the id", err)
	case err != nil:
		return err
	}
	if err := s.db.DeleteObject(ctx, kindToken, o.ID); err != nil {
		return err
	}
	ended := s.live.end(o.ID, errRevoked(o.ID, o.Name))
	s.db.AddEvent(ctx, &store.Event{Type: "token.remove", Data: mustJSON(map[string]any{"id": o.ID, "name": o.Name, "requests_ended": ended})})
	return nil
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
