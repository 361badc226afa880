package sshgw_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/api"
)

func TestCommandExitStatusAndStreams(t *testing.T) {
	e := setup(t)
	r := e.ssh(t, nil, e.key, "sshbox", "echo to-stdout; echo to-stderr >&2; exit 3")
	if r.code != 3 || r.stdout != "to-stdout\n" || r.stderr != "to-stderr\n" {
		t.Fatalf("got exit %d, stdout %q, stderr %q; want 3, to-stdout, to-stderr\n%s", r.code, r.stdout, r.stderr, e.log.String())
	}
	// Standard input streams to the command, which sees its end.
	r = e.ssh(t, strings.NewReader("line one\nline two\n"), e.key, "sshbox", "wc -l")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "2" {
		t.Fatalf("wc -l of two lines: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	// The sandbox's id works as the user as well as its name, and the
	// command runs inside it.
	r = e.ssh(t, nil, e.key, e.box.ID, "hostname")
	if r.code != 0 || strings.TrimSpace(r.stdout) == "" {
		t.Fatalf("hostname by id: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	// A shell without a terminal reads its commands from the stream.
	r = e.ssh(t, strings.NewReader("echo from-shell; exit 5\n"), e.key, "sshbox", "-T")
	if r.code != 5 || !strings.Contains(r.stdout, "from-shell") {
		t.Fatalf("ssh -T with commands on stdin: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	// A command killed by a signal is reported as one (ssh exits 255).
	r = e.ssh(t, nil, e.key, "sshbox", "kill -9 $$")
	if r.code != 255 {
		t.Fatalf("a command killed by SIGKILL: exit %d, want 255 (%q)", r.code, r.stderr)
	}
}

func TestPTYShell(t *testing.T) {
	e := setup(t)
	// Forced terminal with a command: it has a tty.
	r := e.ssh(t, nil, e.key, "sshbox", "-tt", "tty; exit 4")
	if r.code != 4 || !strings.Contains(r.stdout, "/dev/pts/") {
		t.Fatalf("ssh -tt tty: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	// An interactive login shell on a real terminal (tmux): its size,
	// a window resize, and the exit status.
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("no tmux here for the interactive part (scripts/deps.sh installs it)")
	}
	sess := fmt.Sprintf("densshgw%d", os.Getpid())
	status := filepath.Join(e.dir, "pty-status")
	os.Remove(status)
	ssh := "ssh " + strings.Join(e.sshArgs(e.key, "-p"), " ") + " sshbox@127.0.0.1"
	// A socket of the test's own (-S), removed with its directory: -L
	// would leave one in /tmp/tmux-UID after kill-server.
	sock := filepath.Join(t.TempDir(), "tmux")
	tmux := func(args ...string) string {
		out, err := exec.Command("tmux", append([]string{"-S", sock}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	tmux("new-session", "-d", "-s", sess, "-x", "100", "-y", "30", "sh", "-c", ssh+"; echo $? > "+status+"; sleep 30")
	defer exec.Command("tmux", "-S", sock, "kill-server").Run()
	screen := func(want string) string {
		deadline := time.Now().Add(20 * time.Second)
		for {
			s := tmux("capture-pane", "-p", "-t", sess)
			if strings.Contains(s, want) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("the terminal never showed %q:\n%s", want, s)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	tmux("send-keys", "-t", sess, "echo SIZE=$(stty size) TTY=$(tty)", "Enter")
	screen("SIZE=30 100 TTY=/dev/pts/")
	tmux("resize-window", "-t", sess, "-x", "120", "-y", "40")
	time.Sleep(300 * time.Millisecond)
	tmux("send-keys", "-t", sess, "echo NEWSIZE=$(stty size)", "Enter")
	screen("NEWSIZE=40 120")
	tmux("send-keys", "-t", sess, "exit 7", "Enter")
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(status)
		if s := strings.TrimSpace(string(b)); s != "" {
			if s != "7" {
				t.Fatalf("the interactive shell's exit status: ssh exited %s, want 7", s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ssh did not exit after the shell's exit")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestSCP(t *testing.T) {
	e := setup(t)
	local := filepath.Join(e.dir, "up.bin")
	data := randomFile(t, local, 3<<20+12345)
	scp := func(flag, from, to string) {
		t.Helper()
		args := e.sshArgs(e.key, "-P")
		if flag != "" {
			args = append(args, flag)
		}
		r := run(t, nil, "scp", append(args, from, to)...)
		if r.code != 0 {
			t.Fatalf("scp %s %s %s: exit %d: %s", flag, from, to, r.code, r.stderr)
		}
	}
	// OpenSSH's scp speaks sftp: up, then down again.
	scp("", local, "sshbox@127.0.0.1:/tmp/up.bin")
	if got := e.sandboxFile(t, "/tmp/up.bin"); !bytes.Equal(got, data) {
		t.Fatalf("uploaded %d bytes, the sandbox has %d (or different ones)", len(data), len(got))
	}
	back := filepath.Join(e.dir, "down.bin")
	scp("", "sshbox@127.0.0.1:/tmp/up.bin", back)
	if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
		t.Fatalf("downloaded %d bytes, want the %d uploaded", len(got), len(data))
	}
	// A relative remote path is in root's home directory.
	scp("", local, "sshbox@127.0.0.1:rel.bin")
	if got := e.sandboxFile(t, "/root/rel.bin"); !bytes.Equal(got, data) {
		t.Fatalf("scp to a relative path: /root/rel.bin has %d bytes", len(got))
	}
	// scp -p sets the mode through the sandbox's chmod.
	os.Chmod(local, 0o751)
	scp("-p", local, "sshbox@127.0.0.1:/tmp/exe.bin")
	fi, err := e.c.Stat(context.Background(), e.box.ID, "/tmp/exe.bin")
	if err != nil || fi.Mode&0o777 != 0o751 || fi.Size != int64(len(data)) {
		t.Fatalf("scp -p: the sandbox's file is %+v (%v), want mode 0751", fi, err)
	}
	// Legacy scp (-O) runs scp inside the sandbox, which the host image
	// has where the host has OpenSSH.
	res, err := e.c.Exec(context.Background(), e.box.ID, api.ExecRequest{Shell: "command -v scp"})
	if err != nil || res.ExitCode != 0 {
		t.Log("the sandbox has no scp: legacy scp -O not tested")
		return
	}
	scp("-O", local, "sshbox@127.0.0.1:/tmp/legacy.bin")
	if got := e.sandboxFile(t, "/tmp/legacy.bin"); !bytes.Equal(got, data) {
		t.Fatalf("legacy scp upload: the sandbox has %d bytes", len(got))
	}
}

func TestSFTPBatch(t *testing.T) {
	e := setup(t)
	local := filepath.Join(e.dir, "sftp.bin")
	data := randomFile(t, local, 200<<10)
	back := filepath.Join(e.dir, "sftp-back.bin")
	batch := filepath.Join(e.dir, "batch")
	script := strings.Join([]string{
		"mkdir /tmp/sftpdir",
		"cd /tmp/sftpdir",
		"put " + local + " a.bin",
		"rename a.bin b.bin",
		"ls -l",
		"get b.bin " + back,
		"-rm /tmp/sftpdir/missing",
		"rm b.bin",
		"cd /",
		"rmdir /tmp/sftpdir",
	}, "\n") + "\n"
	if err := os.WriteFile(batch, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, nil, "sftp", append(e.sshArgs(e.key, "-P"), "-b", batch, "sshbox@127.0.0.1")...)
	if r.code != 0 {
		t.Fatalf("sftp batch: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "b.bin") || !strings.Contains(r.stdout, strconv.Itoa(len(data))) {
		t.Errorf("ls -l after the rename does not show b.bin with its size:\n%s", r.stdout)
	}
	if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
		t.Fatalf("sftp get: %d bytes, want the %d put", len(got), len(data))
	}
	if _, err := e.c.Stat(context.Background(), e.box.ID, "/tmp/sftpdir"); err == nil {
		t.Error("rmdir left /tmp/sftpdir in the sandbox")
	}
	// A missing file is reported as one, and sftp's batch stops there.
	r = run(t, strings.NewReader(""), "sftp", append(e.sshArgs(e.key, "-P"), "-b", "-", "sshbox@127.0.0.1:/no/such/file", e.dir)...)
	if r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("sftp get of a missing file: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestLocalForward(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	// A server bound to the sandbox's own loopback only.
	const inside = 8765
	p, err := e.c.StartProcess(ctx, e.box.ID, api.ExecRequest{Shell: fmt.Sprintf("echo forwarded-ok > /tmp/index.html && cd /tmp && exec python3 -m http.server %d --bind 127.0.0.1", inside)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Kill(ctx, e.box.ID, p.ID, "KILL")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	local := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	args := append(e.sshArgs(e.key, "-p"), "-N", "-o", "ExitOnForwardFailure=yes",
		"-L", fmt.Sprintf("127.0.0.1:%d:localhost:%d", local, inside), "sshbox@127.0.0.1")
	cmd := exec.Command("ssh", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	url := fmt.Sprintf("http://127.0.0.1:%d/index.html", local)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && strings.TrimSpace(string(body)) == "forwarded-ok" {
				break
			}
			err = fmt.Errorf("%s: %q", resp.Status, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s through ssh -L: %v; ssh: %s", url, err, stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A destination outside the sandbox is refused.
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", local))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	out := e.ssh(t, nil, e.key, "sshbox", "-o", "ExitOnForwardFailure=yes", "-W", "192.0.2.1:80")
	if out.code == 0 {
		t.Errorf("ssh -W to an outside address: exit %d, %q", out.code, out.stderr)
	}
	e.waitLog(t, "only to ports inside the sandbox")
}

func TestRefusesWrongKey(t *testing.T) {
	e := setup(t)
	other := filepath.Join(e.dir, "unknown_key")
	if _, err := os.Stat(other); err != nil {
		if err := keygen(other); err != nil {
			t.Fatal(err)
		}
	}
	r := e.ssh(t, nil, other, "sshbox", "true")
	e.checkRefused(t, r, fingerprint(t, other), "not an authorised key")
}

func TestRefusesUnknownSandbox(t *testing.T) {
	e := setup(t)
	r := e.ssh(t, nil, e.key, "no-such-box", "true")
	e.checkRefused(t, r, fingerprint(t, e.key), "no-such-box")
}

func TestRefusesKeyOfAnotherSandbox(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	a, err := e.c.Create(ctx, api.CreateRequest{Name: "ssh-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Remove(ctx, a.ID, true)
	b, err := e.c.Create(ctx, api.CreateRequest{Name: "ssh-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Remove(ctx, b.ID, true)
	key := filepath.Join(e.dir, "key_a")
	if err := keygen(key); err != nil {
		t.Fatal(err)
	}
	k, err := e.addKey(e.c, key, "ssh-a")
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.RemoveSSHKey(ctx, k.ID)
	if k.Sandbox != a.ID {
		t.Fatalf("the key's sandbox is %q, want ssh-a's id %s", k.Sandbox, a.ID)
	}
	if r := e.ssh(t, nil, key, "ssh-a", "echo in-a"); r.code != 0 || r.stdout != "in-a\n" {
		t.Fatalf("the key in its own sandbox: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	r := e.ssh(t, nil, key, "ssh-b", "true")
	// The API already hides ssh-b from a principal confined to ssh-a; the
	// gateway would refuse it anyway (restricted to sandbox ...).
	e.checkRefused(t, r, k.Fingerprint, "user=ssh-b")
	// A revoked key is refused from then on.
	if err := e.c.RemoveSSHKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	r = e.ssh(t, nil, key, "ssh-a", "true")
	if r.code != 255 {
		t.Fatalf("a revoked key: exit %d, want 255", r.code)
	}
}

func TestSSHKeyAPIBadInput(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	pub, err := os.ReadFile(e.key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	priv, err := os.ReadFile(e.key)
	if err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(e.dir, "fresh_key")
	if _, err := os.Stat(fresh); err != nil {
		if err := keygen(fresh); err != nil {
			t.Fatal(err)
		}
	}
	freshPub, _ := os.ReadFile(fresh + ".pub")
	for _, tc := range []struct {
		name string
		req  api.SSHKeyRequest
		kind string
		msg  string
	}{
		{"empty", api.SSHKeyRequest{}, api.KindInvalid, "no key"},
		{"garbage", api.SSHKeyRequest{PublicKey: "ssh-ed25519 not-base64!"}, api.KindInvalid, "not an OpenSSH public key"},
		{"private key", api.SSHKeyRequest{PublicKey: string(priv)}, api.KindInvalid, "private key"},
		{"two keys", api.SSHKeyRequest{PublicKey: string(pub) + string(freshPub)}, api.KindInvalid, "one key at a time"},
		{"options", api.SSHKeyRequest{PublicKey: `command="true" ` + string(freshPub)}, api.KindInvalid, "options"},
		{"bad name", api.SSHKeyRequest{PublicKey: string(freshPub), Name: "no spaces allowed"}, api.KindInvalid, "name"},
		{"unknown sandbox", api.SSHKeyRequest{PublicKey: string(freshPub), Sandbox: "no-such-box"}, api.KindInvalid, "no-such-box"},
		{"already added", api.SSHKeyRequest{PublicKey: string(pub)}, api.KindExists, "already authorised"},
	} {
		_, err := e.c.AddSSHKey(ctx, tc.req)
		ae, ok := err.(*api.Error)
		if !ok || ae.Kind != tc.kind || !strings.Contains(ae.Message, tc.msg) {
			t.Errorf("%s: got %v, want a %s error mentioning %q", tc.name, err, tc.kind, tc.msg)
		}
	}
	if err := e.c.RemoveSSHKey(ctx, "nokey"); err == nil || err.(*api.Error).Kind != api.KindNotFound {
		t.Errorf("removing an unknown key: %v, want not_found", err)
	}
	// The list shows the admin's key, without its comment turned into
	// anything but the name.
	keys, err := e.c.SSHKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, k := range keys {
		if k.Fingerprint == fingerprint(t, e.key) {
			found = k.Name == "test@den" && k.Owner == "" && k.Type == "ssh-ed25519"
		}
	}
	if !found {
		t.Errorf("the admin's key is not listed as expected: %+v", keys)
	}
}

func TestStoppedSandbox(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	sb, err := e.c.Create(ctx, api.CreateRequest{Name: "ssh-stopped"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Remove(ctx, sb.ID, true)
	if _, err := e.c.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	r := e.ssh(t, nil, e.key, "ssh-stopped", "true")
	if r.code != 255 || !strings.Contains(r.stderr, "den: ") || !strings.Contains(r.stderr, "is stopped") {
		t.Fatalf("a command in a stopped sandbox: exit %d, stderr %q; want 255 and den's error", r.code, r.stderr)
	}
}
