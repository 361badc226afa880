package api

import "testing"

// TestUnsupportedIsAClientError: asking for what this host cannot do (a tier
// it lacks, a memory snapshot on the linux tier) is the client's request
// failing, a 4xx, not the server failing (5xx).
func TestUnsupportedIsAClientError(t *testing.T) {
	if got := HTTPStatus(KindUnsupported); got < 400 || got >= 500 {
		t.Errorf("unsupported maps to %d, want a 4xx", got)
	}
	// Every kind maps back to itself through its status, except those
	// sharing one (exists and conflict are both 409).
	for _, k := range []string{KindInvalid, KindUnauthorized, KindNotFound, KindConflict, KindTooLarge, KindBusy, KindUnsupported, KindInternal} {
		if got := KindForStatus(HTTPStatus(k)); got != k {
			t.Errorf("KindForStatus(HTTPStatus(%s) = %d) = %s", k, HTTPStatus(k), got)
		}
	}
	// An older daemon answered unsupported with 501; a route without the
	// method answers 405.
	for _, s := range []int{501, 405} {
		if got := KindForStatus(s); got != KindUnsupported {
			t.Errorf("KindForStatus(%d) = %s, want unsupported", s, got)
		}
	}
	// Any other 4xx is the request's fault; any other status den's.
	for s, want := range map[int]string{406: KindInvalid, 415: KindInvalid, 502: KindInternal, 503: KindInternal} {
		if got := KindForStatus(s); got != want {
			t.Errorf("KindForStatus(%d) = %s, want %s", s, got, want)
		}
	}
}
