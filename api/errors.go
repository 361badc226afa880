package api

import (
	"errors"
	"fmt"
)

// Error kinds. Each maps to one HTTP status in the server.
const (
	KindInvalid      = "invalid"      // 400: the request is malformed or a value is out of range
	KindUnauthorized = "unauthorized" // 401: missing or wrong bearer token
	KindNotFound     = "not_found"    // 404
	KindExists       = "exists"       // 409: a name or id is already taken
	KindConflict     = "conflict"     // 409: the object is in the wrong state (stopped, in use)
	KindTooLarge     = "too_large"    // 413
	KindBusy         = "busy"         // 429: too many large requests of this caller in flight; retry later
	KindUnsupported  = "unsupported"  // 422: not available on this host or runtime (501 before; still read as unsupported)
	KindInternal     = "internal"     // 500
)

// Error is den's error document: {"error": {"kind": ..., "message": ...}}.
// It implements error so the SDK can return it and callers can inspect Kind.
type Error struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	// Field names the request field at fault, when there is one.
	Field string `json:"field,omitempty"`
}

// ErrorDoc is the JSON envelope of an Error.
type ErrorDoc struct {
	Error *Error `json:"error"`
}

func (e *Error) Error() string { return e.Message }

// Is lets errors.Is(err, api.ErrNotFound) match any Error of the same kind.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Kind == e.Kind
}

// Sentinels for errors.Is. They carry only a kind.
var (
	ErrInvalid     = &Error{Kind: KindInvalid}
	ErrNotFound    = &Error{Kind: KindNotFound}
	ErrExists      = &Error{Kind: KindExists}
	ErrConflict    = &Error{Kind: KindConflict}
	ErrTooLarge    = &Error{Kind: KindTooLarge}
	ErrBusy        = &Error{Kind: KindBusy}
	ErrUnsupported = &Error{Kind: KindUnsupported}
)

// Errorf makes an Error of the given kind.
func Errorf(kind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// FieldError makes an invalid-input Error naming a request field.
func FieldError(field, format string, args ...any) *Error {
	return &Error{Kind: KindInvalid, Field: field, Message: field + ": " + fmt.Sprintf(format, args...)}
}

// KindOf returns the kind of err: the Kind of the first *Error in its chain,
// or KindInternal.
func KindOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}

// HTTPStatus is the one mapping from error kind to HTTP status.
func HTTPStatus(kind string) int {
	switch kind {
	case KindInvalid:
		return 400
	case KindUnauthorized:
		return 401
	case KindNotFound:
		return 404
	case KindExists, KindConflict:
		return 409
	case KindTooLarge:
		return 413
	case KindBusy:
		return 429
	case KindUnsupported:
		// 4xx: the client asked for what this host or runtime cannot
		// do; the server did not fail (a 5xx would say it did).
		return 422
	}
	return 500
}

// KindForStatus is the inverse of HTTPStatus, for answers without a
// document. It also reads 501, which daemons before 422 answered for
// unsupported, and 405 (a route without that method) as unsupported.
func KindForStatus(status int) string {
	switch status {
	case 400:
		return KindInvalid
	case 401, 403:
		return KindUnauthorized
	case 404:
		return KindNotFound
	case 409:
		return KindConflict
	case 413:
		return KindTooLarge
	case 429:
		return KindBusy
	case 405, 422, 501:
		return KindUnsupported
	}
	if status >= 400 && status < 500 {
		return KindInvalid // another 4xx: the request was at fault
	}
	return KindInternal
}
