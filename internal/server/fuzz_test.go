package server

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/sandbox"
	"github.com/den-dev/den/internal/store"
)

// noRuntime is an isolation tier that starts nothing, so a create request
// that passes every check ends in a conflict instead of a sandbox.
type noRuntime struct{}

func (noRuntime) Name() string { return "none" }
func (noRuntime) Start(context.Context, *isolate.Spec) (isolate.Box, error) {
	return nil, api.Errorf(api.KindConflict, "the fuzz runtime starts nothing")
}
func (noRuntime) Destroy(context.Context, *isolate.Spec) error { return nil }

// bodyRoutes are the routes whose request is a JSON body, each with the
// type it decodes to. Routes on a sandbox name one that does not exist, so
// a body that decodes ends in not_found; create runs on noRuntime.
var bodyRoutes = []struct {
	method, path string
	v            func() any
}{
	{"POST", "/v1/sandboxes", func() any { return new(api.CreateRequest) }},
	{"POST", "/v1/sandboxes/nosuch/exec", func() any { return new(api.ExecRequest) }},
	{"POST", "/v1/sandboxes/nosuch/processes", func() any { return new(api.ExecRequest) }},
	{"POST", "/v1/sandboxes/nosuch/processes/p1/kill", func() any { return new(api.SignalRequest) }},
	{"PUT", "/v1/sandboxes/nosuch/network", func() any { return new(api.NetworkPolicy) }},
	{"POST", "/v1/sandboxes/nosuch/ports", func() any { return new(api.PortRequest) }},
	{"POST", "/v1/sandboxes/nosuch/escalate", func() any { return new(api.EscalateRequest) }},
	{"POST", "/v1/sandboxes/nosuch/snapshots", func() any { return new(api.SnapshotRequest) }},
	{"POST", "/v1/sandboxes/nosuch/restore", func() any { return new(api.RestoreRequest) }},
	{"POST", "/v1/sandboxes/nosuch/fork", func() any { return new(api.ForkRequest) }},
	{"POST", "/v1/sandboxes/nosuch/files/mkdir", func() any { return new(api.MkdirRequest) }},
	{"POST", "/v1/sandboxes/nosuch/files/rename", func() any { return new(api.RenameRequest) }},
	{"POST", "/v1/sandboxes/nosuch/commit", func() any { return new(api.CommitRequest) }},
	{"POST", "/v1/sandboxes/nosuch/export", func() any { return new(api.ExportRequest) }},
	{"POST", "/v1/ssh-keys", func() any { return new(api.SSHKeyRequest) }},
}

func fuzzServer(f *testing.F) http.Handler {
	data := f.TempDir()
	db, err := store.Open(filepath.Join(data, "den.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	imgs, err := image.NewStore(filepath.Join(data, "images"))
	if err != nil {
		f.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m, err := sandbox.New(context.Background(), sandbox.Config{DataDir: data, Runtime: noRuntime{}, Store: db, Images: imgs, Log: log})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(m.Close)
	return AsAdmin(New(m, db, log, "fuzz", ""))
}

// FuzzRequestBody sends arbitrary bodies to every JSON-body route of the
// real API handler and checks that none is ever answered with a 5xx or a
// panic: a body the strict decoder refuses gets 400 (or 413) with a JSON
// error that says what is wrong, naming the field for an unknown field or
// a value of the wrong type; and a body it accepts decodes to a value
// whose JSON encoding decodes back to the same encoding.
func FuzzRequestBody(f *testing.F) {
	h := fuzzServer(f)
	for _, s := range []string{
		`{}`, ``, `{"image":"alpine","limits":{"memory":"512m","cpus":1.5},"ttl":"1h"}`,
		`{"cmd":["sh","-c","echo hi"],"env":{"A":"b"},"timeout":"30s","stdin":"aGk="}`,
		`{"cmd":"not a list"}`, `{"nosuch":1}`, `{"limits":{"memory":"-1"}}`, `{"ttl":"9223372036.854775807"}`,
		`{"mode":"allow","allow":["*.example.com","10.0.0.0/8:443"]}`, `{"port":70000}`, `{"signal":"TERM"}`,
		`{"name":"s"} {"name":"t"}`, `{"name":"s"}x`, `null`, `{"a":`, `{"image":"\u0000"}`,
		`{"git":null,"from":"nosuch"}`, `{"public_key":"ssh-ed25519 AAAA x"}`, `{"branch":"-x"}`,
	} {
		for i := range bodyRoutes {
			f.Add([]byte(s), uint8(i))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, route uint8) {
		rt := bodyRoutes[int(route)%len(bodyRoutes)]
		// The decoder alone, as every handler calls it.
		v := rt.v()
		err := decode(httptest.NewRequest(rt.method, rt.path, bytes.NewReader(body)), v)
		if err != nil {
			var ae *api.Error
			if !errors.As(err, &ae) || (ae.Kind != api.KindInvalid && ae.Kind != api.KindTooLarge) || ae.Message == "" {
				t.Fatalf("%s %s %q: decode error %#v is not an invalid-request error with a message", rt.method, rt.path, body, err)
			}
			if strings.HasPrefix(ae.Message, ": ") || (strings.Contains(ae.Message, "unknown field") && ae.Field == "") {
				t.Fatalf("%s %q: %q names neither a field nor the problem", rt.path, body, ae.Message)
			}
		} else {
			once, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("%s %q decoded to %+v, which does not encode: %v", rt.path, body, v, err)
			}
			again := rt.v()
			if err := decode(httptest.NewRequest(rt.method, rt.path, bytes.NewReader(once)), again); err != nil {
				t.Fatalf("%s %q decoded, but its encoding %s does not: %v", rt.path, body, once, err)
			}
			twice, _ := json.Marshal(again)
			if !bytes.Equal(once, twice) {
				t.Fatalf("%s %q: encoding %s decodes and re-encodes as %s", rt.path, body, once, twice)
			}
			if c, ok := v.(*api.CreateRequest); ok && c.Git != nil {
				return // a git create clones its URL: not from a fuzzer
			}
		}
		// The real handler.
		req := httptest.NewRequest(rt.method, rt.path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 {
			t.Fatalf("%s %s %q: status %d: %s", rt.method, rt.path, body, w.Code, w.Body)
		}
		if w.Code >= 400 {
			var doc api.ErrorDoc
			if json.Unmarshal(w.Body.Bytes(), &doc) != nil || doc.Error == nil || doc.Error.Message == "" || api.HTTPStatus(doc.Error.Kind) != w.Code {
				t.Fatalf("%s %s %q: status %d without a matching JSON error: %s", rt.method, rt.path, body, w.Code, w.Body)
			}
		}
		// (An empty body is no body: kill takes that as the default signal.)
		if err != nil && len(body) > 0 && w.Code != api.HTTPStatus(api.KindOf(err)) {
			t.Fatalf("%s %s %q: decode refused it (%v) but the handler answered %d", rt.method, rt.path, body, err, w.Code)
		}
	})
}

// FuzzParseSSHKey checks the validation of a key added with POST
// /v1/ssh-keys: a refusal is an invalid-request error naming public_key
// or name; an accepted key is a plain (no certificate, no DSA) key whose
// stored form parses back to the same key, type and fingerprint, with a
// name that is valid.
func FuzzParseSSHKey(f *testing.F) {
	edPub, _, _ := ed25519.GenerateKey(nil)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 1024)
	for _, k := range []any{edPub, &ecKey.PublicKey, &rsaKey.PublicKey} {
		pk, err := ssh.NewPublicKey(k)
		if err != nil {
			f.Fatal(err)
		}
		line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk)))
		for _, s := range []string{line, line + " me@host", `command="x" ` + line, line + "\n" + line, "  " + line + " a b c  ", line + " " + strings.Repeat("n", 70)} {
			f.Add(s, "")
			f.Add(s, "my-key")
		}
		f.Add(line, "bad name")
	}
	f.Add("-----BEGIN OPENSSH PRIVATE KEY-----", "")
	f.Add("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "")
	f.Fuzz(func(t *testing.T, line, name string) {
		k, err := parseSSHKey(api.SSHKeyRequest{PublicKey: line, Name: name})
		if err != nil {
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Kind != api.KindInvalid || (ae.Field != "public_key" && ae.Field != "name") {
				t.Fatalf("%q: %#v is not an invalid-request error naming public_key or name", line, err)
			}
			return
		}
		if k.Type == ssh.KeyAlgoDSA || strings.Contains(k.Type, "cert") {
			t.Fatalf("%q accepted as a %s", line, k.Type)
		}
		if k.Name != "" && !validKeyName(k.Name) {
			t.Fatalf("%q accepted with the name %q", line, k.Name)
		}
		again, err := parseSSHKey(api.SSHKeyRequest{PublicKey: k.PublicKey})
		if err != nil || again.PublicKey != k.PublicKey || again.Type != k.Type || again.Fingerprint != k.Fingerprint {
			t.Fatalf("%q stored as %q, which parses to %+v, %v", line, k.PublicKey, again, err)
		}
	})
}
