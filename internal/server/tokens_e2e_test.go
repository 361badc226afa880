package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/server"
)

const testAdminToken = "admin-secret-for-tests"

// tokenEnv is a daemon (see newEnv) also served on loopback TCP with
// bearer authentication, as den serve --listen tcp://... does.
type tokenEnv struct {
	*env
	srv   *server.Server
	addr  string
	admin *client.Client
}

func newTokenEnv(t *testing.T) *tokenEnv { return tokenEnvFor(t, newEnv(t)) }

// tokenEnvFor serves the daemon of e on TCP too.
func tokenEnvFor(t *testing.T, e *env) *tokenEnv {
	t.Helper()
	srv := server.New(e.m, e.db, slog.New(slog.NewTextHandler(io.Discard, nil)), "test", e.rt.CgroupVersion())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Authenticate(srv, testAdminToken)}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	te := &tokenEnv{env: e, srv: srv, addr: "tcp://" + ln.Addr().String()}
	te.admin = te.as(testAdminToken)
	return te
}

// as is a TCP client sending token.
func (te *tokenEnv) as(token string) *client.Client {
	c := client.New(te.addr)
	c.Token = token
	return c
}

// newToken makes a scoped token through the admin's TCP client.
func (te *tokenEnv) newToken(t *testing.T, req api.TokenRequest) (*api.Token, *client.Client) {
	t.Helper()
	tok, err := te.admin.CreateToken(context.Background(), req)
	if err != nil {
		t.Fatalf("create token %s: %v", req.Name, err)
	}
	if !strings.HasPrefix(tok.Token, "den_") || len(tok.Token) < 40 {
		t.Fatalf("token secret %q does not look like den_ + 32 random bytes", tok.Token)
	}
	return tok, te.as(tok.Token)
}

// rawCall sends a request with a raw body and token, for input the SDK
// would refuse to send.
func rawCall(t *testing.T, te *tokenEnv, method, path, token, body string) (int, *api.Error) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+strings.TrimPrefix(te.addr, "tcp://")+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var doc api.ErrorDoc
	if resp.StatusCode >= 400 {
		if err := json.Unmarshal(b, &doc); err != nil || doc.Error == nil {
			t.Fatalf("%s %s: status %d without an error document: %s", method, path, resp.StatusCode, b)
		}
	}
	return resp.StatusCode, doc.Error
}

func TestTokenBadInput(t *testing.T) {
	te := newTokenEnv(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, body, field string
	}{
		{"empty name", `{"name": ""}`, "name"},
		{"no name", `{}`, "name"},
		{"bad name", `{"name": "-x y"}`, "name"},
		{"negative max", `{"name": "n1", "max_sandboxes": -1}`, "max_sandboxes"},
		{"non-numeric max", `{"name": "n1", "max_sandboxes": "three"}`, "max_sandboxes"},
		{"unparsable memory", `{"name": "n1", "memory": "12q"}`, "memory"},
		{"memory too small", `{"name": "n1", "memory": "1k"}`, "memory"},
		{"negative cpus", `{"name": "n1", "cpus": -1}`, "cpus"},
		{"negative max volumes", `{"name": "n1", "max_volumes": -1}`, "max_volumes"},
		{"negative max snapshots", `{"name": "n1", "max_snapshots": -2}`, "max_snapshots"},
		{"negative max images", `{"name": "n1", "max_images": -1}`, "max_images"},
		{"unparsable disk", `{"name": "n1", "disk": "12q"}`, "disk"},
		{"disk too small", `{"name": "n1", "disk": "1k"}`, "disk"},
		{"disk cap without quotas", `{"name": "n1", "disk": "1g"}`, "disk"},
		{"unknown field", `{"name": "n1", "admin": true}`, "admin"},
	} {
		st, ae := rawCall(t, te, "POST", "/v1/tokens", testAdminToken, tc.body)
		if st != 400 || ae.Kind != api.KindInvalid || ae.Field != tc.field {
			t.Errorf("%s: status %d %+v, want invalid on field %s", tc.name, st, ae, tc.field)
		}
	}
	tok, c := te.newToken(t, api.TokenRequest{Name: "dup"})
	_, err := te.admin.CreateToken(ctx, api.TokenRequest{Name: "dup"})
	wantKind(t, err, api.KindExists)

	// A wrong token, no token, a token-like guess.
	for _, bad := range []string{"wrong", "den_" + strings.Repeat("A", 43), testAdminToken + "x"} {
		_, err := te.as(bad).List(ctx, nil)
		wantKind(t, err, api.KindUnauthorized)
	}
	// The SDK falls back to $DEN_TOKEN or a token file: send none by hand.
	if st, ae := rawCall(t, te, "GET", "/v1/sandboxes", "", ""); st != 401 || ae.Kind != api.KindUnauthorized {
		t.Errorf("no token: %d %+v", st, ae)
	}
	// A scoped token is refused the token routes, and the other admin-only ones.
	_, err = c.CreateToken(ctx, api.TokenRequest{Name: "mine"})
	wantKind(t, err, api.KindUnauthorized)
	_, err = c.Tokens(ctx)
	wantKind(t, err, api.KindUnauthorized)
	wantKind(t, c.RemoveToken(ctx, tok.ID), api.KindUnauthorized)
	_, err = c.Metrics(ctx)
	wantKind(t, err, api.KindUnauthorized)
	wantKind(t, c.RemoveImage(ctx, "host"), api.KindUnauthorized)
	_, _, err = c.PruneImages(ctx)
	wantKind(t, err, api.KindUnauthorized)
	_, err = c.PullImage(ctx, api.PullRequest{Ref: "127.0.0.1:1/x"}, nil)
	wantKind(t, err, api.KindUnauthorized)
	_, err = c.BuildImage(ctx, nil, client.BuildOptions{Tag: "deb", Debian: "bookworm"}, io.Discard)
	wantKind(t, err, api.KindUnauthorized)
	if _, err := c.Images(ctx); err != nil {
		t.Fatalf("a token lists the shared images: %v", err)
	}
	wantKind(t, te.admin.RemoveToken(ctx, "no-such-token"), api.KindNotFound)

	// Listing shows no secret; revocation takes effect on the next request.
	list, err := te.admin.Tokens(ctx)
	if err != nil || len(list) != 1 || list[0].ID != tok.ID || list[0].Name != "dup" || list[0].Token != "" {
		t.Fatalf("token list %+v %v", list, err)
	}
	if _, err := c.List(ctx, nil); err != nil {
		t.Fatalf("a fresh token is refused: %v", err)
	}
	if err := te.admin.RemoveToken(ctx, "dup"); err != nil {
		t.Fatal(err)
	}
	_, err = c.List(ctx, nil)
	wantKind(t, err, api.KindUnauthorized)
	if _, err := te.srv.PrincipalForToken(ctx, tok.ID); err == nil {
		t.Fatal("PrincipalForToken accepted a revoked token")
	}
	if _, err := te.srv.PrincipalForToken(ctx, "0123456789abcdef"); err == nil {
		t.Fatal("PrincipalForToken accepted an unknown token")
	}
}

// TestTokenSecretNotStored: the database holds a hash of each token, never
// the token itself.
func TestTokenSecretNotStored(t *testing.T) {
	te := newTokenEnv(t)
	var secrets []string
	for _, n := range []string{"s1", "s2", "s3"} {
		tok, c := te.newToken(t, api.TokenRequest{Name: n})
		if _, err := c.List(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, tok.Token)
	}
	files, _ := filepath.Glob(filepath.Join(te.data, "den.db*"))
	if len(files) == 0 {
		t.Fatal("no database files")
	}
	var all []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	if !bytes.Contains(all, []byte(`"name":"s2"`)) {
		t.Fatal("the token records are not in the database files read (wrong files?)")
	}
	for _, s := range secrets {
		if bytes.Contains(all, []byte(s)) || bytes.Contains(all, []byte(strings.TrimPrefix(s, "den_"))) {
			t.Fatalf("the raw token %s... is in the database", s[:8])
		}
	}
}

func TestTokenIsolation(t *testing.T) {
	te := newTokenEnv(t)
	ctx := context.Background()
	ta, a := te.newToken(t, api.TokenRequest{Name: "alice"})
	_, b := te.newToken(t, api.TokenRequest{Name: "bob"})

	sa, err := a.Create(ctx, api.CreateRequest{Name: "alice-box"})
	if err != nil {
		t.Fatal(err)
	}
	if sa.Owner != ta.ID {
		t.Fatalf("owner %q, want %q", sa.Owner, ta.ID)
	}
	adminBox := te.create(t, api.CreateRequest{Name: "admin-box"})
	if res, err := a.Exec(ctx, sa.ID, api.ExecRequest{Shell: "echo hi > /tmp/f; echo ok"}); err != nil || string(res.Stdout) != "ok\n" {
		t.Fatalf("owner exec: %v %+v", err, res)
	}
	proc, err := a.StartProcess(ctx, sa.ID, api.ExecRequest{Shell: "echo started; sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SharePort(ctx, sa.ID, 8080, false); err != nil {
		t.Fatal(err)
	}
	snap, err := a.Snapshot(ctx, sa.ID, api.SnapshotRequest{Name: "alice-snap"})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Owner != ta.ID {
		t.Fatalf("snapshot owner %q", snap.Owner)
	}
	if _, err := a.CreateVolume(ctx, api.VolumeRequest{Name: "alice-vol"}); err != nil {
		t.Fatal(err)
	}

	// Lists: each sees its own; the admin sees all.
	if l, err := b.List(ctx, nil); err != nil || len(l) != 0 {
		t.Fatalf("bob lists %v %v", l, err)
	}
	if l, err := a.List(ctx, nil); err != nil || len(l) != 1 || l[0].ID != sa.ID {
		t.Fatalf("alice lists %v %v", l, err)
	}
	if l, err := te.admin.List(ctx, nil); err != nil || len(l) != 2 {
		t.Fatalf("admin lists %d %v", len(l), err)
	}
	if _, err := a.Get(ctx, adminBox.ID); err == nil {
		t.Fatal("a token sees the admin's sandbox")
	}
	if sn, err := b.Snapshots(ctx, ""); err != nil || len(sn) != 0 {
		t.Fatalf("bob's snapshots %v %v", sn, err)
	}
	if v, err := b.Volumes(ctx); err != nil || len(v) != 0 {
		t.Fatalf("bob's volumes %v %v", v, err)
	}

	// Every route family on alice's sandbox answers bob not_found, by
	// id, by name and by id prefix.
	nf := func(what string, err error) {
		t.Helper()
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Kind != api.KindNotFound {
			t.Errorf("bob %s on alice's sandbox: %v, want not_found", what, err)
		}
	}
	for _, ref := range []string{sa.ID, "alice-box", sa.ID[:8]} {
		_, err := b.Get(ctx, ref)
		nf("get "+ref, err)
	}
	id := sa.ID
	_, err = b.Stop(ctx, id)
	nf("stop", err)
	_, err = b.Start(ctx, id)
	nf("start", err)
	_, err = b.Pause(ctx, id)
	nf("pause", err)
	_, err = b.Resume(ctx, id)
	nf("resume", err)
	_, err = b.Hibernate(ctx, id)
	nf("hibernate", err)
	_, err = b.Escalate(ctx, id, "linux")
	nf("escalate", err)
	_, err = b.Exec(ctx, id, api.ExecRequest{Shell: "true"})
	nf("exec", err)
	_, err = b.ReadFile(ctx, id, "/tmp/f")
	nf("read file", err)
	_, err = b.WriteFile(ctx, id, "/tmp/g", strings.NewReader("x"), 0o644)
	nf("write file", err)
	_, err = b.ListDir(ctx, id, "/tmp")
	nf("list dir", err)
	nf("remove file", b.RemoveFile(ctx, id, "/tmp/f", false))
	if rc, err := b.Download(ctx, id, "/tmp"); err == nil {
		rc.Close()
		t.Error("bob downloaded an archive of alice's sandbox")
	} else {
		nf("archive", err)
	}
	_, err = b.StartProcess(ctx, id, api.ExecRequest{Shell: "true"})
	nf("start process", err)
	_, err = b.Processes(ctx, id)
	nf("processes", err)
	_, err = b.Process(ctx, id, proc.ID)
	nf("process", err)
	var out bytes.Buffer
	_, err = b.Logs(ctx, id, proc.ID, client.LogsOptions{}, &out, &out)
	nf("logs", err)
	nf("kill", b.Kill(ctx, id, proc.ID, "KILL"))
	nf("stdin", b.WriteStdin(ctx, id, proc.ID, strings.NewReader("x"), true))
	_, err = b.Wait(ctx, id, proc.ID)
	nf("wait", err)
	_, err = b.AttachTTY(ctx, id, proc.ID)
	nf("tty", err)
	_, err = b.Sessions(ctx, id)
	nf("sessions", err)
	nf("close session", b.CloseSession(ctx, id, "s"))
	_, err = b.Stats(ctx, id)
	nf("stats", err)
	_, err = b.SetNetwork(ctx, id, api.NetworkPolicy{Mode: api.NetNone})
	nf("network", err)
	_, err = b.SharePort(ctx, id, 9000, true)
	nf("share port", err)
	_, err = b.Ports(ctx, id)
	nf("ports", err)
	nf("unshare port", b.UnsharePort(ctx, id, 8080))
	_, err = b.DialPort(ctx, id, 8080)
	nf("tcp port", err)
	_, err = b.Commit(ctx, id, api.CommitRequest{Name: "stolen"})
	nf("commit", err)
	_, err = b.Snapshot(ctx, id, api.SnapshotRequest{})
	nf("snapshot", err)
	_, err = b.Snapshots(ctx, id)
	nf("snapshots of", err)
	_, err = b.Restore(ctx, id, snap.ID)
	nf("restore", err)
	_, err = b.Fork(ctx, id, api.ForkRequest{Count: 1})
	nf("fork", err)
	nf("rm", b.Remove(ctx, id, true))
	_, err = b.Events(ctx, client.EventFilter{Sandbox: id})
	nf("events of", err)

	// Snapshots and volumes of alice's: not found for bob, nor usable.
	for _, ref := range []string{snap.ID, "alice-snap"} {
		_, err := b.GetSnapshot(ctx, ref)
		nf("get snapshot "+ref, err)
	}
	nf("remove snapshot", b.RemoveSnapshot(ctx, snap.ID))
	_, err = b.SaveSnapshot(ctx, snap.ID)
	nf("save snapshot", err)
	_, err = b.Create(ctx, api.CreateRequest{From: snap.ID})
	nf("create from snapshot", err)
	_, err = b.GetVolume(ctx, "alice-vol")
	nf("get volume", err)
	nf("remove volume", b.RemoveVolume(ctx, "alice-vol"))
	_, err = b.Create(ctx, api.CreateRequest{Volumes: []api.VolumeMount{{Name: "alice-vol", Path: "/data"}}})
	nf("create with volume", err)
	// Host bind mounts are the admin's.
	_, err = b.Create(ctx, api.CreateRequest{Mounts: []api.BindMount{{Source: "/tmp", Target: "/mnt"}}})
	wantKind(t, err, api.KindInvalid)

	// Events: bob sees none of alice's (nor the daemon-wide ones);
	// alice sees hers and not the admin's.
	evs, err := b.Events(ctx, client.EventFilter{})
	if err != nil || len(evs) != 0 {
		t.Fatalf("bob's events: %d %v", len(evs), err)
	}
	evs, err = a.Events(ctx, client.EventFilter{})
	if err != nil || len(evs) == 0 {
		t.Fatalf("alice's events: %d %v", len(evs), err)
	}
	for _, ev := range evs {
		if ev.Sandbox != sa.ID {
			t.Fatalf("alice sees an event of %q: %+v", ev.Sandbox, ev)
		}
	}
	all, err := te.admin.Events(ctx, client.EventFilter{})
	if err != nil || len(all) <= len(evs) {
		t.Fatalf("admin events %d (alice %d) %v", len(all), len(evs), err)
	}

	// Alice still controls her sandbox after all of bob's attempts.
	out.Reset()
	if _, err := a.Logs(ctx, id, proc.ID, client.LogsOptions{}, &out, &out); err != nil || !strings.Contains(out.String(), "started") {
		t.Fatalf("alice's logs %q %v", out.String(), err)
	}
	if l, err := a.Ports(ctx, id); err != nil || len(l) != 1 {
		t.Fatalf("alice's ports %v %v", l, err)
	}
	if _, err := a.Create(ctx, api.CreateRequest{Name: "alice-2", From: "alice-snap", Volumes: []api.VolumeMount{{Name: "alice-vol", Path: "/data"}}}); err != nil {
		t.Fatalf("alice creates from her snapshot with her volume: %v", err)
	}
	forks, err := a.Fork(ctx, id, api.ForkRequest{Count: 1})
	if err != nil || len(forks) != 1 || forks[0].Owner != ta.ID {
		t.Fatalf("alice's fork %v %v", forks, err)
	}
	if _, err := b.Get(ctx, forks[0].ID); err == nil {
		t.Fatal("bob sees alice's fork")
	}

	// Through an in-process front end (the SSH gateway's path): a
	// principal for alice's token, narrowed to one sandbox.
	ip := server.NewInProcess(te.srv)
	defer ip.Close()
	p, err := te.srv.PrincipalForToken(ctx, ta.ID)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := ip.Client(p).List(ctx, nil); err != nil || len(l) != 3 {
		t.Fatalf("alice in process lists %d %v", len(l), err)
	}
	one := *p
	one.Sandbox = sa.ID
	c1 := ip.Client(&one)
	if l, err := c1.List(ctx, nil); err != nil || len(l) != 1 || l[0].ID != sa.ID {
		t.Fatalf("narrowed principal lists %v %v", l, err)
	}
	_, err = c1.Get(ctx, forks[0].ID)
	nf("narrowed get of another of alice's", err)
	_, err = c1.Create(ctx, api.CreateRequest{})
	wantKind(t, err, api.KindUnauthorized)
	if _, err := ip.Client(nil).List(ctx, nil); api.KindOf(err) != api.KindUnauthorized {
		t.Fatalf("a nil principal: %v, want unauthorized", err)
	}
}

func TestTokenSecretsNamespaced(t *testing.T) {
	te := newTokenEnv(t)
	ctx := context.Background()
	_, a := te.newToken(t, api.TokenRequest{Name: "alice"})
	_, b := te.newToken(t, api.TokenRequest{Name: "bob"})
	if err := te.admin.SetSecret(ctx, "ADMIN_KEY", []byte("admin-value")); err != nil {
		t.Fatal(err)
	}
	if err := a.SetSecret(ctx, "ALICE_KEY", []byte("alice-value")); err != nil {
		t.Fatal(err)
	}
	if err := b.SetSecret(ctx, "ADMIN_KEY", []byte("bob-value")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    *client.Client
		who  string
		want string
	}{{te.admin, "admin", "ADMIN_KEY"}, {a, "alice", "ALICE_KEY"}, {b, "bob", "ADMIN_KEY"}} {
		names, err := tc.c.Secrets(ctx)
		if err != nil || strings.Join(names, ",") != tc.want {
			t.Errorf("%s's secrets %v %v, want %s", tc.who, names, err, tc.want)
		}
	}
	wantKind(t, a.DeleteSecret(ctx, "ADMIN_KEY"), api.KindNotFound)
	t.Setenv("DEN_TEST_DAEMON_VAR", "from-the-daemon")
	header := func(ref string) *api.NetworkPolicy {
		return &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"api.example.com"},
			SecretHeaders: []api.SecretHeader{{Host: "api.example.com", Header: "Authorization", Value: "Bearer ${" + ref + "}"}}}
	}
	// Alice cannot use the admin's secret, bob's, or the daemon's environment.
	for _, ref := range []string{"ADMIN_KEY", "DEN_TEST_DAEMON_VAR", "NOPE"} {
		_, err := a.Create(ctx, api.CreateRequest{Network: header(ref)})
		ae := wantKind(t, err, api.KindInvalid)
		if !strings.Contains(ae.Message, ref+" not found") {
			t.Errorf("alice with ${%s}: %s", ref, ae.Message)
		}
	}
	// Her own resolves: the create gets past the secret check (and on
	// a daemon without networking stops there).
	_, err := a.Create(ctx, api.CreateRequest{Network: header("ALICE_KEY")})
	if api.KindOf(err) == api.KindInvalid {
		t.Fatalf("alice's own secret: %v", err)
	}
	// The admin's sandboxes still reach the daemon's environment.
	_, err = te.admin.Create(ctx, api.CreateRequest{Network: header("DEN_TEST_DAEMON_VAR")})
	if api.KindOf(err) == api.KindInvalid {
		t.Fatalf("admin with a daemon variable: %v", err)
	}
}

func TestTokenQuotaAndCaps(t *testing.T) {
	te := newTokenEnv(t)
	ctx := context.Background()
	_, c := te.newToken(t, api.TokenRequest{Name: "capped", MaxSandboxes: 2, CPUs: 0.5, Memory: 256 << 20})

	// Limits above the caps are refused, naming the cap.
	_, err := c.Create(ctx, api.CreateRequest{Limits: api.Limits{CPUs: 1}})
	if ae := wantKind(t, err, api.KindInvalid); ae.Field != "limits.cpus" || !strings.Contains(ae.Message, "cap of 0.5") {
		t.Fatalf("cpus above the cap: %+v", ae)
	}
	_, err = c.Create(ctx, api.CreateRequest{Limits: api.Limits{Memory: 1 << 30}})
	if ae := wantKind(t, err, api.KindInvalid); ae.Field != "limits.memory" || !strings.Contains(ae.Message, "256m") {
		t.Fatalf("memory above the cap: %+v", ae)
	}

	// Parallel creates: exactly the quota succeeds.
	const n = 5
	var wg sync.WaitGroup
	var mu sync.Mutex
	var made []*api.Sandbox
	var refused []error
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.Create(ctx, api.CreateRequest{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused = append(refused, err)
				return
			}
			made = append(made, sb)
		}()
	}
	wg.Wait()
	if len(made) != 2 || len(refused) != n-2 {
		t.Fatalf("%d parallel creates under a quota of 2: %d made, refused %v", n, len(made), refused)
	}
	for _, err := range refused {
		if ae := wantKind(t, err, api.KindConflict); !strings.Contains(ae.Message, "quota") || !strings.Contains(ae.Message, "at most 2") {
			t.Fatalf("quota error: %s", ae.Message)
		}
	}
	// A create without limits got the caps.
	for _, sb := range made {
		if sb.Limits.CPUs != 0.5 || sb.Limits.Memory != 256<<20 {
			t.Fatalf("limits %+v, want the caps", sb.Limits)
		}
	}
	// Forks count too.
	_, err = c.Fork(ctx, made[0].ID, api.ForkRequest{Count: 1})
	wantKind(t, err, api.KindConflict)
	if err := c.Remove(ctx, made[1].ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fork(ctx, made[0].ID, api.ForkRequest{Count: 2}); api.KindOf(err) != api.KindConflict {
		t.Fatalf("a fork of 2 with room for 1: %v", err)
	}
	forks, err := c.Fork(ctx, made[0].ID, api.ForkRequest{Count: 1})
	if err != nil || len(forks) != 1 {
		t.Fatalf("a fork with room: %v", err)
	}
	list, _ := te.admin.Tokens(ctx)
	if len(list) != 1 || list[0].Sandboxes != 2 || list[0].MaxSandboxes != 2 {
		t.Fatalf("token list %+v", list)
	}
	// The admin has no quota.
	te.create(t, api.CreateRequest{})
}
