package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/den-dev/den/api"
)

// TestMountedErrorsAreErrorDocs: a mounted handler's plain-text error (the
// MCP transport's "GET requires an Mcp-Session-Id header") reaches the
// client as den's error document under the same status; its JSON and
// successful answers pass through.
func TestMountedErrorsAreErrorDocs(t *testing.T) {
	h := errorDocs(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/text":
			http.Error(w, "Bad Request: GET requires an Mcp-Session-Id header", http.StatusBadRequest)
		case "/json":
			writeJSON(w, 404, api.ErrorDoc{Error: api.Errorf(api.KindNotFound, "no session")})
		case "/ok":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: 1\n\n")
			w.(http.Flusher).Flush()
		}
	}))
	get := func(path string) (*http.Response, []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Result(), rec.Body.Bytes()
	}
	resp, body := get("/text")
	var doc api.ErrorDoc
	if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &doc) != nil || doc.Error == nil {
		t.Fatalf("plain-text 400: %d %s %q, want a 400 error document", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if doc.Error.Kind != api.KindInvalid || doc.Error.Message != "Bad Request: GET requires an Mcp-Session-Id header" {
		t.Errorf("plain-text 400 became %+v", doc.Error)
	}
	resp, body = get("/json")
	if resp.StatusCode != 404 || json.Unmarshal(body, &doc) != nil || doc.Error.Kind != api.KindNotFound || doc.Error.Message != "no session" {
		t.Errorf("JSON 404: %d %q, want it unchanged", resp.StatusCode, body)
	}
	resp, body = get("/ok")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || string(body) != "data: 1\n\n" {
		t.Errorf("event stream: %d %s %q, want it unchanged", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}
