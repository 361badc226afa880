package server

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/sandbox"
)

// ndjson streams progress lines and then the final result or error as
// JSON lines, flushing each.
type ndjson struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	enc  *json.Encoder
	last time.Time
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(200)
	return &ndjson{w: w, enc: json.NewEncoder(w)}
}

func (n *ndjson) send(v any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.enc.Encode(v)
	if fl, ok := n.w.(http.Flusher); ok {
		fl.Flush()
	}
}

// progress reports at most every 100 ms (and always the last step).
func (n *ndjson) progress(done, total int64, what string) {
	n.mu.Lock()
	if time.Since(n.last) < 100*time.Millisecond && done != total {
		n.mu.Unlock()
		return
	}
	n.last = time.Now()
	n.mu.Unlock()
	n.send(map[string]any{"progress": map[string]any{"done": done, "total": total, "what": what}})
}

// Write makes build output "stream" lines.
func (n *ndjson) Write(p []byte) (int, error) {
	n.send(map[string]string{"stream": string(p)})
	return len(p), nil
}

func (n *ndjson) fail(err error) {
	var ae *api.Error
	if !errors.As(err, &ae) {
		ae = api.Errorf(api.KindInternal, "%v", err)
	}
	n.send(api.ErrorDoc{Error: ae})
}

func wantsNDJSON(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "application/x-ndjson")
}

func (s *Server) pullImage(w http.ResponseWriter, r *http.Request) {
	var req api.PullRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	opts := image.PullOptions{Username: req.Username, Password: req.Password, Insecure: req.Insecure, Platform: req.Platform}
	if !wantsNDJSON(r) {
		img, err := s.m.PullImage(r.Context(), req.Ref, opts, req.Name, nil)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 200, img)
		return
	}
	n := newNDJSON(w)
	img, err := s.m.PullImage(r.Context(), req.Ref, opts, req.Name, n.progress)
	if err != nil {
		n.fail(err)
		return
	}
	n.send(map[string]any{"image": img})
}

func (s *Server) buildImage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	tag := q.Get("t")
	if tag == "" {
		writeError(w, api.FieldError("t", "missing: name the image (?t=NAME)"))
		return
	}
	noCache, err := boolParam(r, "no-cache")
	if err != nil {
		writeError(w, err)
		return
	}
	var timeout time.Duration
	if v := q.Get("timeout"); v != "" {
		d, err := api.ParseDuration(v)
		if err != nil {
			writeError(w, api.FieldError("timeout", "%v", err))
			return
		}
		timeout = d.D()
	}
	args := map[string]string{}
	for _, kv := range q["build-arg"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			writeError(w, api.FieldError("build-arg", "%q is not KEY=VALUE", kv))
			return
		}
		args[k] = v
	}
	if q.Get("debian") != "" && !sandbox.ScopeFrom(r.Context()).IsAdmin() {
		writeError(w, api.Errorf(api.KindUnauthorized, "building with ?debian= runs on the host: it is for the admin token only"))
		return
	}
	if q.Get("debian") != "" && (q.Has("network") || q.Has("allow") || q.Has("allow-cidr")) {
		writeError(w, api.FieldError("network", "a ?debian= build runs mmdebstrap on the host, not RUN steps in sandboxes: it takes no network, allow or allow-cidr"))
		return
	}
	var out io.Writer = io.Discard
	var n *ndjson
	if wantsNDJSON(r) {
		n = newNDJSON(w)
		out = n
	}
	var img *api.Image
	if suite := q.Get("debian"); suite != "" {
		img, err = s.m.BuildDebian(r.Context(), suite, tag, out)
	} else {
		img, err = s.m.BuildFromTar(r.Context(), r.Body, sandbox.BuildRequest{
			Dockerfile: q.Get("dockerfile"), Tag: tag, BuildArgs: args, NoCache: noCache, Timeout: timeout,
			Network: api.NetworkPolicy{Mode: q.Get("network"), Allow: q["allow"], AllowCIDR: q["allow-cidr"]},
		}, out)
	}
	switch {
	case n != nil && err != nil:
		n.fail(err)
	case n != nil:
		n.send(map[string]any{"image": img})
	case err != nil:
		writeError(w, err)
	default:
		writeJSON(w, 200, img)
	}
}

func (s *Server) commit(w http.ResponseWriter, r *http.Request) {
	var req api.CommitRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	img, err := s.m.Commit(r.Context(), r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 201, img)
}

func (s *Server) saveImages(w http.ResponseWriter, r *http.Request) {
	names := r.URL.Query()["name"]
	if len(names) == 0 {
		writeError(w, api.FieldError("name", "missing: ?name=IMAGE (repeatable)"))
		return
	}
	for _, n := range names {
		if _, err := s.m.Image(r.Context(), n); err != nil {
			writeError(w, err)
			return
		}
	}
	w.Header().Set("Content-Type", "application/x-tar")
	cw := &countingWriter{w: w}
	if err := s.m.SaveImages(r.Context(), names, cw); err != nil {
		if cw.n == 0 {
			w.Header().Del("Content-Type")
			writeError(w, err)
			return
		}
		panic(http.ErrAbortHandler) // the client sees a cut stream, not a bad archive
	}
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (s *Server) pruneImages(w http.ResponseWriter, r *http.Request) {
	res, err := s.m.PruneImages(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, res)
}
