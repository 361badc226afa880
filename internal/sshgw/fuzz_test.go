package sshgw

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// connMeta is the ssh.ConnMetadata of a connection asking for user.
type connMeta struct{ user string }

func (m connMeta) User() string          { return m.user }
func (m connMeta) SessionID() []byte     { return []byte("s") }
func (m connMeta) ClientVersion() []byte { return []byte("SSH-2.0-fuzz") }
func (m connMeta) ServerVersion() []byte { return []byte("SSH-2.0-den") }
func (m connMeta) RemoteAddr() net.Addr  { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2} }
func (m connMeta) LocalAddr() net.Addr   { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 22} }

// FuzzLoginUser sends arbitrary SSH user names (ssh ID@host: the sandbox
// the login is for) through the gateway's key check against a fake den
// API holding sandboxes sb1 and sb2, for a key restricted to sb1 and for
// an unrestricted one. The user must reach the API as exactly one path
// segment, unchanged (never a path of its own choosing), and a login is
// accepted only for a sandbox the API answered and the key may reach.
func FuzzLoginUser(f *testing.F) {
	var mu sync.Mutex
	var asked []string // the ids the API was asked for, decoded
	var paths []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.Method+" "+r.URL.EscapedPath())
		mu.Unlock()
		mux := http.NewServeMux()
		mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
			id := r.PathValue("id")
			mu.Lock()
			asked = append(asked, id)
			mu.Unlock()
			if id != "sb1" && id != "sb2" && id != "named" {
				w.WriteHeader(404)
				json.NewEncoder(w).Encode(apiErr("no sandbox " + id))
				return
			}
			if id == "named" {
				id = "sb2" // a name resolves to its id
			}
			json.NewEncoder(w).Encode(map[string]string{"id": id})
		})
		mux.ServeHTTP(w, r)
	}))
	f.Cleanup(api.Close)
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		f.Fatal(err)
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		f.Fatal(err)
	}
	for _, u := range []string{"sb1", "sb2", "named", "", "nosuch", "sb1/../sb2", "../../v1/secrets", "sb1?x=1", "sb1#f", "%2e%2e", "sb1\x00", "sb1%2F..", "a b", "sb1/stop"} {
		f.Add(u, false)
		f.Add(u, true)
	}
	f.Fuzz(func(t *testing.T, user string, restricted bool) {
		grant := &Grant{KeyID: "k1", Fingerprint: ssh.FingerprintSHA256(key)}
		if restricted {
			grant.Sandbox = "sb1"
		}
		g := &Gateway{cfg: Config{
			Key:    func(context.Context, string) (*Grant, error) { return grant, nil },
			Client: func(context.Context, *Grant) (*client.Client, error) { return client.New(api.URL), nil },
		}}
		mu.Lock()
		asked, paths = nil, nil
		mu.Unlock()
		h := &handshake{g: g, ctx: context.Background(), ok: map[string]*login{}}
		perms, err := h.check(connMeta{user}, key)
		mu.Lock()
		gotAsked, gotPaths := asked, paths
		mu.Unlock()
		if len(gotPaths) > 0 && len(gotAsked) != 1 {
			t.Fatalf("user %q: the API got %q, not one sandbox lookup", user, gotPaths)
		}
		if len(gotAsked) == 1 && gotAsked[0] != user {
			t.Fatalf("user %q reached the API as sandbox %q (%q)", user, gotAsked[0], gotPaths)
		}
		if err != nil {
			if perms != nil || len(h.ok) != 0 {
				t.Fatalf("user %q: refused but a login was kept", user)
			}
			return
		}
		l := h.ok[perms.Extensions["den-key"]]
		if l == nil {
			t.Fatalf("user %q: accepted without a login", user)
		}
		want := map[string]string{"sb1": "sb1", "sb2": "sb2", "named": "sb2"}[user]
		if want == "" || l.sb.ID != want || (restricted && want != "sb1") {
			t.Fatalf("user %q (restricted %v): logged in to %q", user, restricted, l.sb.ID)
		}
	})
}

func apiErr(msg string) api.ErrorDoc {
	return api.ErrorDoc{Error: api.Errorf(api.KindNotFound, "%s", msg)}
}

// FuzzSessionRequest feeds arbitrary channel request payloads (pty-req,
// env, window-change, signal, exec, subsystem) to a session and checks
// what it keeps: an env request is taken only with a name free of '=' and
// NUL, and becomes exactly NAME=VALUE; a pty or window size is kept as
// sent; a payload that does not decode is refused; nothing is started
// twice; and a decoded payload re-encodes to the bytes it came from.
func FuzzSessionRequest(f *testing.F) {
	types := []string{"pty-req", "env", "window-change", "signal", "exec", "subsystem", "shell", "x11-req"}
	for i, p := range [][]byte{
		ssh.Marshal(ptyReq{Term: "xterm", Cols: 80, Rows: 24}), ssh.Marshal(envReq{Name: "LANG", Value: "C"}),
		ssh.Marshal(windowChange{Cols: 1 << 20, Rows: 10}), ssh.Marshal(signalReq{Signal: "INT"}),
		ssh.Marshal(execReq{Command: "echo hi"}), ssh.Marshal(subsystemReq{Name: "sftp"}), nil, {0, 0, 0, 9, 'x'},
	} {
		f.Add(uint8(i), p)
		f.Add(uint8(1), ssh.Marshal(envReq{Name: "A=B", Value: "x"}))
		f.Add(uint8(1), ssh.Marshal(envReq{Name: "A\x00", Value: "x"}))
	}
	f.Fuzz(func(t *testing.T, typ uint8, payload []byte) {
		rt := types[int(typ)%len(types)]
		// Started, so an exec, shell or subsystem is refused rather than
		// run; pty-req and env are tried both ways.
		s := &session{started: rt != "pty-req" && rt != "env" && rt != "window-change", ctx: context.Background()}
		var wg sync.WaitGroup
		ok := s.request(&ssh.Request{Type: rt, Payload: payload}, &wg, func() {})
		wg.Wait()
		switch rt {
		case "env":
			var e envReq
			derr := ssh.Unmarshal(payload, &e)
			if ok != (derr == nil && e.Name != "" && !strings.ContainsAny(e.Name, "=\x00")) {
				t.Fatalf("env %q: accepted %v", payload, ok)
			}
			if ok && (len(s.env) != 1 || s.env[0] != e.Name+"="+e.Value) {
				t.Fatalf("env %q kept as %q", payload, s.env)
			}
			if ok && string(ssh.Marshal(e)) != string(payload) {
				t.Fatalf("env %q re-encodes as %q", payload, ssh.Marshal(e))
			}
		case "pty-req":
			var p ptyReq
			if ok != (ssh.Unmarshal(payload, &p) == nil) || (ok && *s.pty != p) {
				t.Fatalf("pty-req %q: accepted %v, kept %+v", payload, ok, s.pty)
			}
		case "window-change":
			var w windowChange
			if ok != (ssh.Unmarshal(payload, &w) == nil) || (ok && *s.size != w) {
				t.Fatalf("window-change %q: accepted %v, kept %+v", payload, ok, s.size)
			}
		default:
			if ok {
				t.Fatalf("%s %q accepted on a started session without a process", rt, payload)
			}
		}
	})
}
