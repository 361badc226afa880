package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/den-dev/den/api"
)

// MaxBody bounds JSON request bodies (the exec request has its own bound,
// api.MaxExecBody).
const MaxBody = 1 << 20

// MaxBodiesInFlight bounds the bytes of JSON request bodies one principal
// (the admin, or one scoped token) may have in flight at once: a body is
// counted from before it is read until its request ends, at its declared
// length (or its route's bound when the length is not declared). Bodies of
// at most smallBody bytes are not counted, so ordinary requests always pass.
// A body that would go over is refused at once with busy (429).
const MaxBodiesInFlight = 16 << 20

// smallBody is the largest body not counted against MaxBodiesInFlight.
const smallBody = 64 << 10

// bodyBudget counts the request body bytes in flight per principal.
type bodyBudget struct {
	mu   sync.Mutex
	used map[string]int64
}

// bodyHold is what one request holds of its principal's budget; it is given
// back when the request ends (Server.ServeHTTP).
type bodyHold struct {
	b   *bodyBudget
	key string
	mu  sync.Mutex
	n   int64
}

type holdKey struct{}

// budgetKey names the budget a principal's requests draw on: narrowing a
// principal to one sandbox does not give it a budget of its own.
func budgetKey(p *Principal) string {
	switch {
	case p == nil:
		return ""
	case p.Admin:
		return "admin"
	}
	return "token:" + p.TokenID
}

// hold starts counting a request's bodies against its principal's budget.
func (b *bodyBudget) hold(ctx context.Context, p *Principal) (context.Context, *bodyHold) {
	h := &bodyHold{b: b, key: budgetKey(p)}
	return context.WithValue(ctx, holdKey{}, h), h
}

func (h *bodyHold) take(n int64) error {
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	if h.b.used == nil {
		h.b.used = map[string]int64{}
	}
	if used := h.b.used[h.key]; used+n > MaxBodiesInFlight {
		return api.Errorf(api.KindBusy, "%d bytes of this caller's request bodies are in flight and a body of %d would pass the bound of %d: retry when some of them have ended", used, n, MaxBodiesInFlight)
	}
	h.b.used[h.key] += n
	h.mu.Lock()
	h.n += n
	h.mu.Unlock()
	return nil
}

// release gives back everything the request held.
func (h *bodyHold) release() {
	h.mu.Lock()
	n := h.n
	h.n = 0
	h.mu.Unlock()
	if n == 0 {
		return
	}
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	if h.b.used[h.key] -= n; h.b.used[h.key] <= 0 {
		delete(h.b.used, h.key)
	}
}

// reserveBody counts a body of at most limit bytes against the request's
// budget (none for requests outside Server.ServeHTTP).
func reserveBody(r *http.Request, limit int64) error {
	n := limit
	if r.ContentLength >= 0 && r.ContentLength < limit {
		n = r.ContentLength
	}
	h, _ := r.Context().Value(holdKey{}).(*bodyHold)
	if h == nil || n <= smallBody {
		return nil
	}
	return h.take(n)
}

// decode reads a JSON body strictly: one object, no unknown fields, at most MaxBody bytes.
func decode(r *http.Request, v any) error { return decodeLimit(r, v, MaxBody) }

// decodeLimit is decode with another bound on the body. The body is
// counted against the principal's MaxBodiesInFlight before it is read.
func decodeLimit(r *http.Request, v any, limit int64) error {
	if err := reserveBody(r, limit); err != nil {
		return err
	}
	obj, err := readObject(http.MaxBytesReader(nil, r.Body, limit), limit)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(obj))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeErr(err)
	}
	return nil
}

// readObject reads one JSON object, a member at a time, and returns its
// text. Anything but an object (null, an array, a string, a number) is
// invalid, as is data after it. When the body passes limit inside a
// member's value, the error names that member, so an oversized field is
// reported as that field (invalid) rather than as the whole body.
func readObject(r io.Reader, limit int64) ([]byte, error) {
	dec := json.NewDecoder(r)
	tok, err := dec.Token()
	if err != nil {
		return nil, bodyErr(err, "", limit)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, api.Errorf(api.KindInvalid, "the body is %s, not a JSON object: send {...}", jsonKind(tok))
	}
	// Past the opening brace, the end of the body is an unexpected one.
	fail := func(err error, field string) error {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return bodyErr(err, field, limit)
	}
	buf := []byte{'{'}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, fail(err, "")
		}
		key, _ := kt.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fail(err, key)
		}
		if len(buf) > 1 {
			buf = append(buf, ',')
		}
		k, _ := json.Marshal(key)
		buf = append(append(append(buf, k...), ':'), raw...)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fail(err, "")
	}
	if dec.More() {
		return nil, api.Errorf(api.KindInvalid, "trailing data after the JSON object")
	}
	var extra [1]byte
	if n, _ := dec.Buffered().Read(extra[:]); n > 0 && !isSpace(extra[0]) {
		return nil, api.Errorf(api.KindInvalid, "trailing data after the JSON object")
	}
	return append(buf, '}'), nil
}

// bodyErr is the error of reading a body: over its limit (naming the
// member being read, if any) or malformed.
func bodyErr(err error, field string, limit int64) error {
	var mbe *http.MaxBytesError
	switch {
	case !errors.As(err, &mbe):
		return decodeErr(err)
	case field == "":
		return api.Errorf(api.KindTooLarge, "request body over %d bytes", limit)
	}
	if len(field) > 64 {
		field = field[:64]
	}
	return api.FieldError(field, "too large: the request body may be at most %d bytes", limit)
}

// jsonKind names the JSON value a token starts.
func jsonKind(tok json.Token) string {
	switch t := tok.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case float64, json.Number:
		return "a number"
	case string:
		return "a string"
	case json.Delim:
		if t == '[' {
			return "an array"
		}
	}
	return fmt.Sprintf("%v", tok)
}

func isSpace(b byte) bool { return b == ' ' || b == '\n' || b == '\r' || b == '\t' }

// decodeErr maps a JSON decoding error like decode does.
func decodeErr(err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return api.Errorf(api.KindInvalid, "empty request body: send a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return api.Errorf(api.KindInvalid, "malformed JSON: the body ends in the middle of a value")
	case errors.As(err, &se):
		return api.Errorf(api.KindInvalid, "malformed JSON at byte %d: %v", se.Offset, err)
	case errors.As(err, &te) && te.Field == "":
		return api.Errorf(api.KindInvalid, "the body must be a JSON object, not a JSON %s", te.Value)
	case errors.As(err, &te):
		return api.FieldError(te.Field, "want %s, got JSON %s", te.Type, te.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return api.FieldError(f, "unknown field")
	}
	return api.Errorf(api.KindInvalid, "bad request body: %v", err)
}
