package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/server"
	"github.com/den-dev/den/internal/sshgw"
	"github.com/den-dev/den/internal/store"
)

var verbSSH = &verb{
	name:     "ssh",
	summary:  "open an SSH session to a sandbox through den's SSH gateway",
	synopsis: "[flags] ID [COMMAND...]",
	details: `Runs the system ssh against den's SSH gateway (den serve --ssh ADDR) with the
user set to the sandbox: like ssh -p PORT ID@HOST. A COMMAND runs instead of
a login shell; -L forwards a local port to a port inside the sandbox. Your
key must be authorised first (den ssh-key add).

The gateway's host key and port: den asks the daemon (den info: its ssh
gateway's address and host key) and pins the key in den's known_hosts file
(~/.config/den/known_hosts), so a changed key is refused. --data DIR reads
the key from a data directory instead (DIR/ssh_host_ed25519_key.pub); a
daemon that cannot be asked makes den read $DEN_DATA or /var/lib/den. A
daemon that answers without a gateway has it off: den says so and how to
turn it on (den serve --ssh ADDR) instead of running ssh into a refused
connection, unless --port, $DEN_SSH_PORT, --ssh-host or $DEN_SSH_HOST
point at a gateway of your own. Without a key the first connection records the
key it sees (StrictHostKeyChecking=accept-new) and later ones must match it;
compare the fingerprint with ssh-keygen -lf DATA/ssh_host_ed25519_key.pub on
the daemon's host. --print (or --json) shows the ssh command instead of
running it, for IDE configuration.`,
	example: `den ssh web
		den ssh web -- uname -a
		den ssh -L 8080:localhost:8000 web
		den ssh --print web`,
	run: cmdSSH,
}

// defaultSSHPort is the gateway's conventional port.
const defaultSSHPort = 2222

func cmdSSH(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	port := f.Int("port", "p", "PORT", "the gateway's port (default $DEN_SSH_PORT, else the daemon's gateway's, else 2222)")
	host := f.String("ssh-host", "", "HOST", "the gateway's host (default $DEN_SSH_HOST, else the daemon's TCP host, else the gateway's listen address when it is one, else 127.0.0.1)")
	identity := f.String("identity", "i", "FILE", "private key to use (passed to ssh -i)")
	data := f.String("data", "", "DIR", "read the host key to pin from this data directory instead of asking the daemon")
	var forwards, opts []string
	f.Var(listValue{p: &forwards}, "local", "L", "[LADDR:]LPORT:localhost:PORT", "forward a local port to a port inside the sandbox (repeatable)")
	f.Var(listValue{p: &opts}, "option", "o", "OPT", "an ssh -o option (repeatable)")
	tty := f.Bool("tty", "t", "force a terminal even with a COMMAND (ssh -tt)")
	printOnly := f.Bool("print", "", "print the ssh command instead of running it")
	jsonOut := f.jsonFlag("print the ssh command as JSON instead of running it")
	pos, cmd, err := f.parse(args, 1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef(v, "ssh needs one sandbox ID, like: den ssh web")
	}
	id := pos[0]
	if strings.ContainsAny(id, "@ \t") || strings.HasPrefix(id, "-") {
		return usagef(v, "bad sandbox ID %q", id)
	}
	if !f.isSet("port") {
		*port = 0
		if p := os.Getenv("DEN_SSH_PORT"); p != "" {
			if *port, err = strconv.Atoi(p); err != nil {
				return usagef(v, "DEN_SSH_PORT=%q is not a port number", p)
			}
		}
	} else if *port < 1 || *port > 65535 {
		return usagef(v, "--port %d is not a TCP port (1-65535)", *port)
	}
	cl := c.client(f)
	var pub []byte
	var gw *api.SSHGateway
	if *data != "" {
		pub, _ = os.ReadFile(filepath.Join(*data, sshHostKeyFile+".pub"))
	} else {
		var answered bool
		gw, answered = daemonSSH(cl)
		if gw == nil && answered && *port == 0 && *host == "" && os.Getenv("DEN_SSH_HOST") == "" {
			// ssh would only say "Connection refused".
			return errors.New("the daemon's SSH gateway is off: start the daemon with it, like den serve --ssh 127.0.0.1:2222 (and authorise your key with den ssh-key add), or pass --port and --ssh-host for a gateway the daemon does not report")
		}
		if gw != nil {
			pub = []byte(gw.HostKey)
			if _, p, err := net.SplitHostPort(gw.Addr); err == nil && *port == 0 {
				*port, _ = strconv.Atoi(p)
			}
		} else {
			pub, _ = os.ReadFile(filepath.Join(envOr("DEN_DATA", "/var/lib/den"), sshHostKeyFile+".pub"))
		}
	}
	if *host == "" {
		*host = sshHost(cl.Addr(), gw)
	}
	if *port == 0 {
		*port = defaultSSHPort
	}
	if *port < 1 || *port > 65535 {
		return usagef(v, "port %d is not a TCP port (1-65535)", *port)
	}
	known, strict, err := sshKnownHosts(*host, *port, pub)
	if err != nil {
		return err
	}
	argv := []string{"ssh", "-p", strconv.Itoa(*port),
		"-o", "UserKnownHostsFile=" + known, "-o", "StrictHostKeyChecking=" + strict}
	if *identity != "" {
		argv = append(argv, "-i", *identity, "-o", "IdentitiesOnly=yes")
	}
	for _, o := range opts {
		argv = append(argv, "-o", o)
	}
	for _, l := range forwards {
		argv = append(argv, "-L", l)
	}
	if *tty {
		argv = append(argv, "-tt")
	}
	argv = append(argv, id+"@"+*host)
	if len(cmd) > 0 {
		argv = append(argv, "--")
		argv = append(argv, cmd...)
	}
	switch {
	case *jsonOut:
		return c.printJSON(map[string]any{"argv": argv, "known_hosts": known, "host_key_checking": strict})
	case *printOnly:
		fmt.Fprintln(c.stdout, shellJoin(argv))
		return nil
	}
	path, err := exec.LookPath("ssh")
	if err != nil {
		return errors.New("no ssh command here: install OpenSSH's client (apt-get install openssh-client)")
	}
	p := exec.Command(path, argv[1:]...)
	p.Stdin, p.Stdout, p.Stderr = c.stdin, c.stdout, c.stderr
	if err := p.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return exitError(ee.ExitCode())
		}
		return fmt.Errorf("run ssh: %w", err)
	}
	return nil
}

// sshHost is $DEN_SSH_HOST, else the host of a TCP daemon address, else
// the host the gateway listens on (gw, when it is one address), else
// 127.0.0.1.
func sshHost(addr string, gw *api.SSHGateway) string {
	if h := os.Getenv("DEN_SSH_HOST"); h != "" {
		return h
	}
	if u, err := url.Parse(addr); err == nil && (u.Scheme == "tcp" || u.Scheme == "http" || u.Scheme == "https") && u.Hostname() != "" {
		return u.Hostname()
	}
	if gw != nil {
		if h, _, err := net.SplitHostPort(gw.Addr); err == nil {
			if ip := net.ParseIP(h); ip != nil && !ip.IsUnspecified() {
				return h
			}
		}
	}
	return "127.0.0.1"
}

// daemonSSH asks the daemon about its SSH gateway: nil when it has none
// running (answered) or could not be asked (not answered).
func daemonSSH(cl *client.Client) (gw *api.SSHGateway, answered bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := cl.Info(ctx)
	if err != nil {
		return nil, false
	}
	return info.SSH, true
}

// sshKnownHosts returns den's known_hosts file and the host key checking
// for host:port: the gateway's key pub (an authorized_keys line) pinned
// when there is one, else trust on first use.
func sshKnownHosts(host string, port int, pub []byte) (file, strict string, err error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", "", fmt.Errorf("find a place for den's known_hosts: %w", err)
	}
	file = filepath.Join(dir, "den", "known_hosts")
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return "", "", err
	}
	key, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	if err != nil {
		return file, "accept-new", nil
	}
	name := host
	if port != 22 {
		name = "[" + host + "]:" + strconv.Itoa(port)
	}
	line := name + " " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
	old, _ := os.ReadFile(file)
	var keep []string
	for _, l := range strings.Split(string(old), "\n") {
		if l == line {
			return file, "yes", nil
		}
		if l != "" && !strings.HasPrefix(l, name+" ") {
			keep = append(keep, l)
		}
	}
	keep = append(keep, line)
	if err := os.WriteFile(file, []byte(strings.Join(keep, "\n")+"\n"), 0o600); err != nil {
		return "", "", err
	}
	return file, "yes", nil
}

// shellJoin quotes argv for a POSIX shell.
func shellJoin(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:@[],+") == "" {
			out[i] = a
		} else {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(out, " ")
}

// sshHostKeyFile is the gateway's host key in the daemon's data directory.
const sshHostKeyFile = "ssh_host_ed25519_key"

// startSSH serves den's SSH gateway on addr for den serve. The gateway acts
// only through API clients of principals: the admin for keys the admin
// added, the adding token's principal otherwise, narrowed to the key's
// sandbox.
func startSSH(addr, data string, h *server.Server, db *store.DB, log *slog.Logger) (*sshGateway, error) {
	key, err := sshgw.LoadHostKey(filepath.Join(data, sshHostKeyFile))
	if err != nil {
		return nil, err
	}
	ip := server.NewInProcess(h)
	gw, err := sshgw.New(sshgw.Config{
		HostKey: key,
		Log:     log,
		Key: func(ctx context.Context, fp string) (*sshgw.Grant, error) {
			k, err := h.SSHKeyByFingerprint(ctx, fp)
			if err != nil {
				return nil, err
			}
			return &sshgw.Grant{KeyID: k.ID, Name: k.Name, Fingerprint: k.Fingerprint, Owner: k.Owner, Sandbox: k.Sandbox}, nil
		},
		Client: func(ctx context.Context, g *sshgw.Grant) (*client.Client, error) {
			p := *server.AdminPrincipal
			if g.Owner != "" {
				tp, err := h.PrincipalForToken(ctx, g.Owner)
				if err != nil {
					return nil, err
				}
				p = *tp
			}
			p.Sandbox = g.Sandbox
			return ip.Client(&p), nil
		},
		Event: func(sandbox, typ string, data any) {
			b, _ := json.Marshal(data)
			if err := db.AddEvent(context.Background(), &store.Event{Sandbox: sandbox, Type: typ, Data: b}); err != nil {
				log.Warn("event log", "type", typ, "err", err)
			}
		},
	})
	if err != nil {
		ip.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		ip.Close()
		return nil, fmt.Errorf("ssh gateway: listen on %s: %w", addr, err)
	}
	log.Info("ssh gateway listening", "addr", ln.Addr().String(), "host_key", ssh.FingerprintSHA256(key.PublicKey()))
	go func() {
		if err := gw.Serve(ln); err != nil {
			log.Error("ssh gateway", "err", err)
		}
	}()
	return &sshGateway{Gateway: gw, ip: ip, info: api.SSHGateway{Addr: ln.Addr().String(),
		HostKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key.PublicKey())))}}, nil
}

// sshGateway closes the gateway, then its in-process API transport.
type sshGateway struct {
	*sshgw.Gateway
	ip   *server.InProcess
	info api.SSHGateway // what GET /v1/info says of it
}

func (g *sshGateway) Close() error {
	g.Gateway.Close()
	return g.ip.Close()
}
