package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
)

// readObject takes exactly what one strict json.Unmarshal of an object
// takes, and gives back an object that means the same.
func FuzzReadObject(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, ` {"a":[1,{"b":null}],"c":"x\u0000"} `, `null`, `[]`, `"x"`, `1`, `true`,
		`{"a":1} {}`, `{"a":1}x`, `{"a":`, `{`, ``, `{"a":1,"a":2}`, `{"a":"` + strings.Repeat("z", 100) + `"}`, `{1:2}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		obj, err := readObject(http.MaxBytesReader(nil, nopCloser{strings.NewReader(s)}, 64), 64)
		var want map[string]any
		werr := json.Unmarshal([]byte(s), &want)
		if len(s) > 64 {
			return // the bound cuts it; the error is checked by TestReadObjectBounds
		}
		if err != nil {
			if werr == nil && want != nil {
				t.Fatalf("%q: refused (%v), but it is one JSON object", s, err)
			}
			return
		}
		if werr != nil || want == nil {
			t.Fatalf("%q: accepted as %q, but it is not one JSON object (%v)", s, obj, werr)
		}
		var got map[string]any
		if err := json.Unmarshal(obj, &got); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: read as %q = %v (%v), want %v", s, obj, got, err, want)
		}
	})
}

type nopCloser struct{ *strings.Reader }

func (nopCloser) Close() error { return nil }

func TestReadObjectBounds(t *testing.T) {
	for _, c := range []struct {
		body, kind, field string
	}{
		{`{"env":["` + strings.Repeat("a", 100) + `"]}`, api.KindInvalid, "env"},
		{`{"cmd":["x"],"stdin":"` + strings.Repeat("A", 100) + `"}`, api.KindInvalid, "stdin"},
		{strings.Repeat(" ", 100) + `{}`, api.KindTooLarge, ""},
		{`null`, api.KindInvalid, ""},
		{`[1]`, api.KindInvalid, ""},
	} {
		_, err := readObject(http.MaxBytesReader(nil, nopCloser{strings.NewReader(c.body)}, 64), 64)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Kind != c.kind || ae.Field != c.field {
			t.Errorf("%.20q: %v, want kind %s field %q", c.body, err, c.kind, c.field)
		}
	}
}

// A principal's large bodies in flight are bounded; small ones and other
// principals' are not held back, and a request's share comes back when it ends.
func TestBodyBudget(t *testing.T) {
	var b bodyBudget
	tok := &Principal{TokenID: "t1"}
	req := func(p *Principal, n int64) (*http.Request, *bodyHold) {
		ctx, h := b.hold(context.Background(), p)
		r, _ := http.NewRequestWithContext(ctx, "POST", "/", bytes.NewReader(make([]byte, n)))
		return r, h
	}
	var held []*bodyHold
	for range MaxBodiesInFlight / api.MaxExecBody {
		r, h := req(tok, api.MaxExecBody)
		if err := reserveBody(r, api.MaxExecBody); err != nil {
			t.Fatalf("within the bound: %v", err)
		}
		held = append(held, h)
	}
	r, _ := req(tok, api.MaxExecBody)
	if err := reserveBody(r, api.MaxExecBody); api.KindOf(err) != api.KindBusy {
		t.Fatalf("over the bound: %v, want busy", err)
	}
	if r, _ := req(tok, smallBody); reserveBody(r, api.MaxExecBody) != nil {
		t.Fatal("a small body was held back")
	}
	if r, _ := req(AdminPrincipal, api.MaxExecBody); reserveBody(r, api.MaxExecBody) != nil {
		t.Fatal("another principal was held back")
	}
	held[0].release()
	if r, _ := req(tok, api.MaxExecBody); reserveBody(r, api.MaxExecBody) != nil {
		t.Fatal("a released share did not come back")
	}
}
