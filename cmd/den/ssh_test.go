package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/testenv/e2e"
)

func TestSSHCommandLine(t *testing.T) {
	f := newFakeDaemon(t)
	cfg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfg)
	t.Setenv("DEN_SSH_PORT", "2299")
	t.Setenv("DEN_SSH_HOST", "")
	// With the daemon's host key readable, it is pinned.
	data := t.TempDir()
	pub := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHpg3lL4jKGMVDIX7VJ+Ft/X5YGzXnF1lLlGMJ0W+qNx den ssh gateway\n"
	if err := os.WriteFile(filepath.Join(data, sshHostKeyFile+".pub"), []byte(pub), 0o644); err != nil {
		t.Fatal(err)
	}
	r := den(t, f, "", "ssh", "--json", "--data", data, "-L", "8080:localhost:8000", "web", "--", "uname", "-a")
	if r.code != 0 {
		t.Fatalf("den ssh --json: %+v", r)
	}
	var out struct {
		Argv       []string `json:"argv"`
		KnownHosts string   `json:"known_hosts"`
		Checking   string   `json:"host_key_checking"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("den ssh --json printed %q: %v", r.stdout, err)
	}
	got := strings.Join(out.Argv, " ")
	for _, want := range []string{"ssh -p 2299 ", "-L 8080:localhost:8000", "StrictHostKeyChecking=yes", " web@127.0.0.1 -- uname -a"} {
		if !strings.Contains(got, want) {
			t.Errorf("den ssh argv %q lacks %q", got, want)
		}
	}
	known, err := os.ReadFile(out.KnownHosts)
	if err != nil || !strings.HasPrefix(string(known), "[127.0.0.1]:2299 ssh-ed25519 AAAAC3") {
		t.Errorf("known_hosts %s: %q (%v), want the pinned host key", out.KnownHosts, known, err)
	}
	// Without it, the first connection records the key.
	r = den(t, f, "", "ssh", "--print", "--data", t.TempDir(), "web")
	if r.code != 0 || !strings.Contains(r.stdout, "StrictHostKeyChecking=accept-new") || !strings.HasSuffix(strings.TrimSpace(r.stdout), "web@127.0.0.1") {
		t.Errorf("den ssh --print without the host key: %+v", r)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"ssh"}, 2, "one sandbox ID"},
		{[]string{"ssh", "--print", "-p", "70000", "web"}, 2, "not a TCP port"},
		{[]string{"ssh", "--print", "a@b"}, 2, "bad sandbox ID"},
	} {
		r := den(t, f, "", tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("den %v: exit %d, stderr %q; want %d and %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
}

func TestSSHKeyAddInput(t *testing.T) {
	f := newFakeDaemon(t)
	dir := t.TempDir()
	two := filepath.Join(dir, "two.pub")
	os.WriteFile(two, []byte("ssh-ed25519 AAAA1 a\nssh-ed25519 AAAA2 b\n"), 0o644)
	empty := filepath.Join(dir, "empty.pub")
	os.WriteFile(empty, []byte("# nothing\n\n"), 0o644)
	n := len(f.log)
	for _, tc := range []struct {
		args  []string
		stdin string
		code  int
		want  string
	}{
		{[]string{"ssh-key", "add"}, "", 2, "one KEYFILE"},
		{[]string{"ssh-key", "add", filepath.Join(dir, "missing.pub")}, "", 1, "read the key"},
		{[]string{"ssh-key", "add", two}, "", 1, "one key at a time"},
		{[]string{"ssh-key", "add", empty}, "", 1, "no key in the input"},
		{[]string{"ssh-key", "add", "-"}, "", 1, "no key in the input"},
		{[]string{"ssh-key", "rm"}, "", 2, "at least one key ID"},
		{[]string{"ssh-key", "ls", "x"}, "", 2, "takes no arguments"},
	} {
		r := den(t, f, tc.stdin, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("den %v: exit %d, stderr %q; want %d and %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
	if len(f.log) != n {
		t.Errorf("bad input reached the daemon: %q", f.log[n:])
	}
}

// Without --data, den ssh asks the daemon for its gateway's host key and
// port (den info) and pins the key.
func TestSSHHostKeyFromDaemon(t *testing.T) {
	pub := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHpg3lL4jKGMVDIX7VJ+Ft/X5YGzXnF1lLlGMJ0W+qNx"
	var addr atomic.Value // where the gateway listens
	addr.Store("0.0.0.0:2345")
	host := miniDaemon(t, func(mux *http.ServeMux) {
		mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
			replyJSON(w, 200, api.Info{SSH: &api.SSHGateway{Addr: addr.Load().(string), HostKey: pub}})
		})
	})
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("DEN_SSH_PORT", "")
	t.Setenv("DEN_SSH_HOST", "")
	t.Setenv("DEN_DATA", t.TempDir()) // no key there: it must come from the daemon
	r := den(t, nil, "", "--host", host, "ssh", "--json", "web")
	var out struct {
		Argv       []string `json:"argv"`
		KnownHosts string   `json:"known_hosts"`
		Checking   string   `json:"host_key_checking"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); r.code != 0 || err != nil {
		t.Fatalf("den ssh --json: %+v %v", r, err)
	}
	if got := strings.Join(out.Argv, " "); !strings.HasPrefix(got, "ssh -p 2345 ") || out.Checking != "yes" {
		t.Errorf("den ssh: %q, checking %s; want port 2345 and the key pinned", got, out.Checking)
	}
	if known, err := os.ReadFile(out.KnownHosts); err != nil || string(known) != "[127.0.0.1]:2345 "+pub+"\n" {
		t.Errorf("known_hosts: %q %v", known, err)
	}
	// A gateway listening on one address is reached there (the daemon is
	// on a unix socket: its address says nothing of the host).
	addr.Store("127.0.0.2:2345")
	if r := den(t, nil, "", "--host", host, "ssh", "--print", "web"); r.code != 0 || !strings.HasSuffix(strings.TrimSpace(r.stdout), " web@127.0.0.2") {
		t.Errorf("den ssh to a gateway on 127.0.0.2: %+v", r)
	}
	// -p still wins over the daemon's port.
	if r := den(t, nil, "", "--host", host, "ssh", "--print", "-p", "2200", "web"); r.code != 0 || !strings.HasPrefix(r.stdout, "ssh -p 2200 ") || !strings.Contains(r.stdout, "StrictHostKeyChecking=yes") {
		t.Errorf("den ssh -p 2200: %+v", r)
	}
}

// A real den serve --ssh says its gateway's address and host key in den
// info, and den ssh (no --data, no $DEN_DATA key) pins that key.
func TestSSHInfoRealDaemon(t *testing.T) {
	d := newDaemonArgs(t, []string{"--ssh", "127.0.0.1:0"})
	info, err := d.c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(filepath.Join(d.data, sshHostKeyFile+".pub"))
	if err != nil {
		t.Fatal(err)
	}
	if info.SSH == nil || info.SSH.HostKey == "" || !strings.HasPrefix(string(pub), info.SSH.HostKey) || strings.HasSuffix(info.SSH.Addr, ":0") {
		t.Fatalf("den info ssh: %+v, want the key in %s (%q) and the port listened on", info.SSH, d.data, pub)
	}
	if out, err := d.cli(0, "info"); err != nil || !strings.Contains(out, "ssh gateway "+info.SSH.Addr+", host key SHA256:") {
		t.Errorf("den info: %v\n%s", err, out)
	}
	cfg := t.TempDir()
	cmd := exec.Command(e2e.DenBinary(t), "ssh", "--json", "web")
	cmd.Env = []string{"DEN_HOST=" + d.addr, "DEN_TOKEN=" + d.token, "HOME=" + cfg, "XDG_CONFIG_HOME=" + cfg, "DEN_DATA=" + t.TempDir(), "PATH=/usr/bin:/bin"}
	b, err := cmd.Output()
	var out struct {
		Argv       []string `json:"argv"`
		KnownHosts string   `json:"known_hosts"`
	}
	if err != nil || json.Unmarshal(b, &out) != nil {
		t.Fatalf("den ssh --json: %v %s", err, b)
	}
	_, port, _ := strings.Cut(info.SSH.Addr, ":")
	if got := strings.Join(out.Argv, " "); !strings.HasPrefix(got, "ssh -p "+port+" ") || !strings.Contains(got, "StrictHostKeyChecking=yes") {
		t.Errorf("den ssh: %q, want port %s and the key pinned", got, port)
	}
	if known, _ := os.ReadFile(out.KnownHosts); string(known) != "[127.0.0.1]:"+port+" "+info.SSH.HostKey+"\n" {
		t.Errorf("known_hosts %q", known)
	}
}

// With the daemon's gateway off, den ssh says so and how to turn it on
// instead of running ssh into "Connection refused"; a port given by hand
// still names a gateway of one's own.
func TestSSHGatewayOff(t *testing.T) {
	d := newDaemon(t)
	if info, err := d.c.Info(context.Background()); err != nil || info.SSH != nil {
		t.Fatalf("den info without --ssh: %+v %v, want no gateway", info, err)
	}
	cfg := t.TempDir()
	run := func(args ...string) (string, error) {
		cmd := exec.Command(e2e.DenBinary(t), args...)
		cmd.Env = []string{"DEN_TEST_RUN_DEN=1", "DEN_HOST=" + d.addr, "DEN_TOKEN=" + d.token, "HOME=" + cfg, "XDG_CONFIG_HOME=" + cfg, "PATH=/usr/bin:/bin"}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// The control: with a port given, den builds the ssh command.
	if out, err := run("ssh", "--print", "-p", "2222", "web"); err != nil || !strings.HasPrefix(out, "ssh -p 2222 ") {
		t.Fatalf("den ssh --print -p 2222 web: %q %v", out, err)
	}
	for _, args := range [][]string{{"ssh", "web"}, {"ssh", "--print", "web"}} {
		out, err := run(args...)
		if err == nil || !strings.Contains(out, "SSH gateway is off") || !strings.Contains(out, "den serve --ssh") || strings.Contains(out, "refused") {
			t.Errorf("den %q with the gateway off: %q %v, want it to say the gateway is off and how to turn it on", args, out, err)
		}
	}
}
