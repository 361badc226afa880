package sshgw_test

// End-to-end tests: a real daemon stack (SQLite, the linux runtime, the
// sandbox manager, the API server) in this process, the gateway wired to it
// as den serve wires it, and Debian's OpenSSH client, scp and sftp against
// it. They need root (CI runs them as root) and skip without it or without
// the OpenSSH client.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/isolate/linux"
	"github.com/den-dev/den/internal/reexec"
	"github.com/den-dev/den/internal/sandbox"
	"github.com/den-dev/den/internal/server"
	"github.com/den-dev/den/internal/sshgw"
	"github.com/den-dev/den/internal/store"
	"github.com/den-dev/den/internal/testenv/e2e"
)

func TestMain(m *testing.M) {
	reexec.Run(os.Args[1:])
	code := m.Run()
	if shared != nil {
		shared.close()
	}
	os.Exit(code)
}

// lockedBuffer collects the gateway's log.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// env is one daemon with the gateway, shared by the tests.
type env struct {
	dir  string
	st   *e2e.Stack
	db   *store.DB
	m    *sandbox.Manager
	h    *server.Server
	ip   *server.InProcess
	c    *client.Client // the admin, over the unix socket
	gw   *sshgw.Gateway
	port int
	log  *lockedBuffer
	key  string // the admin's authorised private key
	box  *api.Sandbox
}

var (
	shared    *env
	sharedErr string
	sharedMu  sync.Mutex
)

// setup returns the shared env, starting it on first use; it skips
// without root or OpenSSH.
func setup(t *testing.T) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the SSH gateway's end-to-end tests need root (CI runs them as root)")
	}
	for _, tool := range []string{"ssh", "scp", "sftp", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s here: install openssh-client (scripts/deps.sh)", tool)
		}
	}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedErr != "" {
		t.Fatal(sharedErr)
	}
	if shared == nil {
		e, err := start()
		if err != nil {
			sharedErr = err.Error()
			t.Fatal(err)
		}
		shared = e
	}
	return shared
}

func start() (*env, error) {
	dir, err := os.MkdirTemp("", "den-sshgw-")
	if err != nil {
		return nil, err
	}
	e := &env{dir: dir, log: &lockedBuffer{}}
	if e.st, err = e2e.Open(dir, "sshgw", linux.Config{}); err != nil {
		return nil, err
	}
	if err := e.st.Start(); err != nil {
		return nil, err
	}
	e.db, e.m, e.h, e.c = e.st.DB, e.st.Manager, e.st.Server, e.st.Admin
	e.ip = server.NewInProcess(e.h)

	hostKey, err := sshgw.LoadHostKey(filepath.Join(dir, "ssh_host_ed25519_key"))
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.gw, err = sshgw.New(sshgw.Config{HostKey: hostKey, Log: log, Key: e.grant, Client: e.clientFor, Event: e.event})
	if err != nil {
		return nil, err
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	e.port = gl.Addr().(*net.TCPAddr).Port
	go e.gw.Serve(gl)

	ctx := context.Background()
	if e.box, err = e.c.Create(ctx, api.CreateRequest{Name: "sshbox"}); err != nil {
		return nil, err
	}
	e.key = filepath.Join(dir, "admin_key")
	if err := keygen(e.key); err != nil {
		return nil, err
	}
	if _, err := e.addKey(e.c, e.key, ""); err != nil {
		return nil, err
	}
	return e, nil
}

// The gateway's callbacks, as den serve sets them (cmd/den/ssh.go).

func (e *env) grant(ctx context.Context, fp string) (*sshgw.Grant, error) {
	k, err := e.h.SSHKeyByFingerprint(ctx, fp)
	if err != nil {
		return nil, err
	}
	return &sshgw.Grant{KeyID: k.ID, Name: k.Name, Fingerprint: k.Fingerprint, Owner: k.Owner, Sandbox: k.Sandbox}, nil
}

func (e *env) clientFor(ctx context.Context, g *sshgw.Grant) (*client.Client, error) {
	p := *server.AdminPrincipal
	if g.Owner != "" {
		tp, err := e.h.PrincipalForToken(ctx, g.Owner)
		if err != nil {
			return nil, err
		}
		p = *tp
	}
	p.Sandbox = g.Sandbox
	return e.ip.Client(&p), nil
}

func (e *env) event(sandbox, typ string, data any) {
	b, _ := json.Marshal(data)
	e.db.AddEvent(context.Background(), &store.Event{Sandbox: sandbox, Type: typ, Data: b})
}

func (e *env) close() {
	e.gw.Close()
	e.ip.Close()
	e.st.Close()
	os.RemoveAll(e.dir)
}

// keygen makes an ed25519 key pair with OpenSSH's ssh-keygen.
func keygen(path string) error {
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test@den", "-f", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ssh-keygen: %v: %s", err, out)
	}
	return nil
}

// addKey authorises the public half of the key at path through c.
func (e *env) addKey(c *client.Client, path, sandbox string) (*api.SSHKey, error) {
	pub, err := os.ReadFile(path + ".pub")
	if err != nil {
		return nil, err
	}
	return c.AddSSHKey(context.Background(), api.SSHKeyRequest{PublicKey: string(pub), Sandbox: sandbox})
}

// sshArgs are the options every OpenSSH command of the tests uses.
func (e *env) sshArgs(key, portFlag string) []string {
	return []string{portFlag, strconv.Itoa(e.port), "-i", key,
		"-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
		"-o", "UserKnownHostsFile=" + filepath.Join(e.dir, "known_hosts"), "-o", "StrictHostKeyChecking=accept-new"}
}

// result is how an OpenSSH command ended.
type result struct {
	stdout, stderr string
	code           int
}

// run runs an OpenSSH tool with a time bound.
func run(t *testing.T, stdin io.Reader, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

// ssh runs ssh as user with key; args follow the destination.
func (e *env) ssh(t *testing.T, stdin io.Reader, key, user string, args ...string) result {
	t.Helper()
	a := append(e.sshArgs(key, "-p"), user+"@127.0.0.1")
	return run(t, stdin, "ssh", append(a, args...)...)
}

func randomFile(t *testing.T, path string, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

// sandboxFile reads a file inside the sandbox through the API.
func (e *env) sandboxFile(t *testing.T, path string) []byte {
	t.Helper()
	rc, err := e.c.ReadFile(context.Background(), e.box.ID, path)
	if err != nil {
		t.Fatalf("read %s in the sandbox: %v", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitLog waits for the gateway's log to contain s.
func (e *env) waitLog(t *testing.T, s string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l := e.log.String()
		if strings.Contains(l, s) {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway's log lacks %q:\n%s", s, l)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logged reports whether one line of the gateway's log has all of parts.
func (e *env) logged(parts ...string) bool {
	for _, line := range strings.Split(e.log.String(), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// refusedEvents counts the ssh.refused events that mention s.
func (e *env) refusedEvents(t *testing.T, s string) int {
	t.Helper()
	evs, err := e.db.Events(context.Background(), store.EventFilter{Type: "ssh.refused"})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if strings.Contains(string(ev.Data), s) {
			n++
		}
	}
	return n
}

// checkRefused asserts that an ssh command was refused at authentication,
// and that the refusal was logged and recorded with why.
func (e *env) checkRefused(t *testing.T, r result, fp, why string) {
	t.Helper()
	if r.code != 255 || !strings.Contains(r.stderr, "Permission denied") {
		t.Fatalf("want ssh refused (255, Permission denied), got %d: %q %q", r.code, r.stdout, r.stderr)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !e.logged("ssh: login refused", fp, why) {
		if time.Now().After(deadline) {
			t.Fatalf("the log does not record the refusal of %s (%s):\n%s", fp, why, e.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if e.refusedEvents(t, fp) == 0 {
		t.Errorf("no ssh.refused event for %s", fp)
	}
}

func fingerprint(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	k, _, _, _, err := ssh.ParseAuthorizedKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return ssh.FingerprintSHA256(k)
}
