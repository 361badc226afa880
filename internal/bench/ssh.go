package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/den-dev/den/api"
)

// The ssh scenario: ssh ID@host true through den's SSH gateway, key
// exchange and authentication included, against the same command through
// Debian's OpenSSH sshd on loopback (started here on a free port, with a
// temporary host key and authorized_keys), interleaved.
const (
	sshN       = 100
	sshLimitMs = 100.0 // den p50 <= 100 ms
)

// sshSkipReason says why the ssh scenario cannot run here, or "".
func (b *runner) sshSkipReason() string {
	if b.o.SSHAddr == "" {
		return "no SSH gateway address given (Options.SSHAddr)"
	}
	if _, err := exec.LookPath("ssh"); err != nil {
		return "ssh not found in PATH (apt-get install openssh-client)"
	}
	c, err := net.DialTimeout("tcp", b.o.SSHAddr, time.Second)
	if err != nil {
		return fmt.Sprintf("no SSH gateway at %s (den serve --ssh %s; or set DEN_SSH_HOST, DEN_SSH_PORT)", b.o.SSHAddr, b.o.SSHAddr)
	}
	c.Close()
	return ""
}

func (b *runner) sshScenario(ctx context.Context) error {
	n := b.iterations(sshN)
	tmp, err := os.MkdirTemp("", "den-bench-ssh-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	key := filepath.Join(tmp, "id_ed25519")
	if err := keygen(key); err != nil {
		return err
	}
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		return err
	}
	sb, err := b.cl.Create(ctx, api.CreateRequest{Labels: b.labels()})
	if err != nil {
		return err
	}
	defer b.cl.Remove(context.WithoutCancel(ctx), sb.ID, true)
	k, err := b.cl.AddSSHKey(ctx, api.SSHKeyRequest{PublicKey: string(pub), Name: "den-bench", Sandbox: sb.ID})
	if err != nil {
		return fmt.Errorf("authorise the bench's key: %w", err)
	}
	defer b.cl.RemoveSSHKey(context.WithoutCancel(ctx), k.ID)

	common := []string{"ssh", "-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
		"-o", "LogLevel=ERROR", "-o", "StrictHostKeyChecking=accept-new", "-o", "UserKnownHostsFile=" + filepath.Join(tmp, "known_hosts")}
	host, port, _ := net.SplitHostPort(b.o.SSHAddr)
	denArgv := append(append([]string(nil), common...), "-p", port, sb.ID+"@"+host, "true")

	peer := &Peer{Name: "sshd", Note: "Debian's OpenSSH sshd on loopback, a temporary host key and authorized_keys, running true"}
	b.rep.Peers = append(b.rep.Peers, peer)
	var peerArgv []string
	sshd, stop, err := startSSHD(tmp, string(pub))
	if err != nil {
		peer.Missing = err.Error()
		peer.Command = "sshd -D -f CONFIG"
	} else {
		defer stop()
		me, err := user.Current()
		if err != nil {
			return err
		}
		peerArgv = append(append([]string(nil), common...), "-p", strconv.Itoa(sshd), me.Username+"@127.0.0.1", "true")
		peer.Command = Quote(peerArgv)
		peer.Version = programVersion("ssh", "-V")
	}
	fmt.Fprintf(b.errw, "ssh: %d logins each way\n", n)
	// One untimed warm-up of each (it also records the host keys).
	if _, err := timeExec(ctx, denArgv, ""); err != nil {
		return fmt.Errorf("ssh through den's gateway: %w", err)
	}
	if peerArgv != nil {
		if _, err := timeExec(ctx, peerArgv, ""); err != nil {
			return fmt.Errorf("ssh to the sshd peer: %w", err)
		}
	}
	var den, ref []time.Duration
	for i := 0; i < n; i++ {
		d, err := timeExec(ctx, denArgv, "")
		if err != nil {
			return fmt.Errorf("ssh through den's gateway: %w", err)
		}
		den = append(den, d)
		if peerArgv != nil {
			d, err := timeExec(ctx, peerArgv, "")
			if err != nil {
				return fmt.Errorf("ssh to the sshd peer: %w", err)
			}
			ref = append(ref, d)
		}
		b.progress("ssh", i+1, n)
	}
	dr := statsRow("ssh", "ssh ID@host true through den's gateway (key exchange included)", den)
	dr.judge(fmt.Sprintf("p50 ≤ %gms", sshLimitMs), dr.p50(), sshLimitMs)
	rows := []*Row{dr}
	if peerArgv != nil {
		pr := statsRow("ssh", "ssh user@127.0.0.1 true to OpenSSH's sshd (peer)", ref)
		dr.compare(pr, "sshd p50")
		rows = append(rows, pr)
	} else {
		dr.Note = "peer not measured: " + peer.Missing
	}
	b.add(rows...)
	return nil
}

func keygen(path string) error {
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "den-bench", "-f", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ssh-keygen: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// startSSHD starts OpenSSH's sshd on a free loopback port, accepting
// pub for the current user, and returns the port and how to stop it.
func startSSHD(dir, pub string) (int, func(), error) {
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/sshd"); serr != nil {
			return 0, nil, fmt.Errorf("sshd not found (apt-get install openssh-server)")
		}
		sshd = "/usr/sbin/sshd"
	}
	hostKey := filepath.Join(dir, "ssh_host_ed25519_key")
	if err := keygen(hostKey); err != nil {
		return 0, nil, err
	}
	auth := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(auth, []byte(pub), 0o600); err != nil {
		return 0, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg := filepath.Join(dir, "sshd_config")
	conf := strings.Join([]string{
		"Port " + strconv.Itoa(port), "ListenAddress 127.0.0.1", "HostKey " + hostKey,
		"AuthorizedKeysFile " + auth, "StrictModes no", "UsePAM no", "PasswordAuthentication no",
		"KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password", "PidFile " + filepath.Join(dir, "sshd.pid"),
		"UseDNS no", "PrintMotd no", "Subsystem sftp internal-sftp",
	}, "\n") + "\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		return 0, nil, err
	}
	// sshd's privilege separation directory, as Debian's service makes it.
	os.MkdirAll("/run/sshd", 0o755)
	cmd := exec.Command(sshd, "-D", "-e", "-f", cfg)
	logf, err := os.Create(filepath.Join(dir, "sshd.log"))
	if err != nil {
		return 0, nil, err
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return 0, nil, fmt.Errorf("start sshd: %w", err)
	}
	stop := func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return port, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			log, _ := os.ReadFile(filepath.Join(dir, "sshd.log"))
			return 0, nil, fmt.Errorf("sshd did not listen on 127.0.0.1:%d: %s", port, strings.TrimSpace(string(log)))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
