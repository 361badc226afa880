package server

import (
	"context"
	"net/http"

	"github.com/den-dev/den/api"
)

// withBody decodes a JSON request body and calls f with the path's id.
func withBody[Req, T any](status int, f func(context.Context, string, Req) (T, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if err := decode(r, &req); err != nil {
			writeError(w, err)
			return
		}
		v, err := f(r.Context(), r.PathValue("id"), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, status, v)
	}
}

func (s *Server) snapshotRoutes() {
	h := s.mux.HandleFunc
	h("POST /v1/sandboxes/{id}/snapshots", s.takeSnapshot)
	h("GET /v1/sandboxes/{id}/snapshots", byID(func(ctx context.Context, id string) ([]*api.Snapshot, error) {
		return s.m.Snapshots(ctx, id)
	}))
	h("POST /v1/sandboxes/{id}/restore", s.restore)
	h("POST /v1/sandboxes/{id}/fork", s.fork)
	h("GET /v1/snapshots", func(w http.ResponseWriter, r *http.Request) {
		list, err := s.m.Snapshots(r.Context(), r.URL.Query().Get("sandbox"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 200, list)
	})
	h("GET /v1/snapshots/{id}", byID(s.m.GetSnapshot))
	h("DELETE /v1/snapshots/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.m.RemoveSnapshot(r.Context(), r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(204)
	})
	h("GET /v1/snapshots/{id}/archive", func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.m.GetSnapshot(r.Context(), r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/x-tar")
		cw := &countingWriter{w: w}
		if err := s.m.SaveSnapshot(r.Context(), r.PathValue("id"), cw); err != nil {
			if cw.n == 0 {
				w.Header().Del("Content-Type")
				writeError(w, err)
				return
			}
			panic(http.ErrAbortHandler) // the client sees a cut stream, not a bad archive
		}
	})
	h("POST /v1/snapshots/load", func(w http.ResponseWriter, r *http.Request) {
		snap, err := s.m.LoadSnapshot(r.Context(), r.Body)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 201, snap)
	})
	h("POST /v1/volumes", func(w http.ResponseWriter, r *http.Request) {
		var req api.VolumeRequest
		if err := decode(r, &req); err != nil {
			writeError(w, err)
			return
		}
		v, err := s.m.CreateVolume(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 201, v)
	})
	h("GET /v1/volumes", func(w http.ResponseWriter, r *http.Request) {
		list, err := s.m.Volumes(r.Context())
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 200, list)
	})
	h("GET /v1/volumes/{id}", byID(s.m.GetVolume))
	h("DELETE /v1/volumes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.m.RemoveVolume(r.Context(), r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(204)
	})
}
