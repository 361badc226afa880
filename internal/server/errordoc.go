package server

import (
	"bytes"
	"net/http"
	"strings"

	"github.com/den-dev/den/api"
)

// errorDocs makes the error answers of h, a handler built outside this
// package (the MCP transport answers plain text), den's error document
// like every other route's: an answer of 400 or more that is not already
// JSON keeps its status and has its text (the first 4 KiB) become the
// message, with the kind api.KindForStatus gives. Other answers pass
// through untouched, streamed and flushed as h writes them.
func errorDocs(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ew := &errorDocWriter{ResponseWriter: w}
		h.ServeHTTP(ew, r)
		ew.finish()
	})
}

type errorDocWriter struct {
	http.ResponseWriter
	status int          // the error status being rewritten, or 0
	text   bytes.Buffer // its text, bounded
	wrote  bool         // WriteHeader was called
}

func (w *errorDocWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote = true
	ct := w.Header().Get("Content-Type")
	if code >= 400 && !strings.HasPrefix(ct, "application/json") {
		w.status = code
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *errorDocWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.status == 0 {
		return w.ResponseWriter.Write(b)
	}
	if room := 4096 - w.text.Len(); room > 0 {
		w.text.Write(b[:min(len(b), room)])
	}
	return len(b), nil
}

// Flush passes through, for event streams.
func (w *errorDocWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok && w.status == 0 {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *errorDocWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish writes the error document of a rewritten answer.
func (w *errorDocWriter) finish() {
	if w.status == 0 {
		return
	}
	msg := strings.TrimSpace(w.text.String())
	if msg == "" {
		msg = http.StatusText(w.status)
	}
	w.Header().Del("Content-Length")
	writeJSON(w.ResponseWriter, w.status, api.ErrorDoc{Error: &api.Error{Kind: api.KindForStatus(w.status), Message: msg}})
}
