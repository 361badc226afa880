// Package sshgw is den's SSH gateway: `ssh -p 2222 ID@host` reaches sandbox
// ID (or its name) with a public key authorised through den's API. A session
// is a shell or command (with or without a terminal: window size changes,
// signals and exit status pass through, stderr stays separate), an sftp
// subsystem (which OpenSSH's scp uses too) backed by den's file API, or a
// local port forward (ssh -L) to a port inside the sandbox.
//
// The gateway has no powers of its own: every action goes through a den API
// client acting for the key's principal (the admin or the token that added
// the key, narrowed to the key's sandbox), so it is scoped exactly like the
// API. The daemon wires it up with callbacks (Config), so this package
// depends on the API client only.
package sshgw

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// Grant is what an authorised key allows: acting for its owner, within its
// sandbox when it names one.
type Grant struct {
	KeyID       string
	Name        string // the key's label, for logs
	Fingerprint string
	Owner       string // the token id that added the key; "" for the admin
	Sandbox     string // the one sandbox the key reaches; "" for any the owner may
}

// Config wires the gateway to the daemon.
type Config struct {
	// HostKey is the gateway's host key (see LoadHostKey).
	HostKey ssh.Signer
	// Key returns the grant of the key with OpenSSH's SHA256 fingerprint;
	// an error (any) refuses the key.
	Key func(ctx context.Context, fingerprint string) (*Grant, error)
	// Client returns a den API client acting for the grant's principal,
	// narrowed to g.Sandbox when it is set; an error refuses the key.
	Client func(ctx context.Context, g *Grant) (*client.Client, error)
	// Log receives accepted and refused logins (nil: discard).
	Log *slog.Logger
	// Event records an event in den's event log ("" sandbox: daemon-wide);
	// nil: none.
	Event func(sandbox, typ string, data any)
	// HandshakeTimeout bounds key exchange and authentication (default 30s).
	HandshakeTimeout time.Duration
}

// Gateway serves SSH connections.
type Gateway struct {
	cfg  Config
	mu   sync.Mutex
	lns  map[net.Listener]bool
	conn map[net.Conn]bool
	done bool
	wg   sync.WaitGroup
}

// New checks cfg and returns a gateway; Serve starts it.
func New(cfg Config) (*Gateway, error) {
	if cfg.HostKey == nil || cfg.Key == nil || cfg.Client == nil {
		return nil, errors.New("sshgw: HostKey, Key and Client are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Event == nil {
		cfg.Event = func(string, string, any) {}
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 30 * time.Second
	}
	return &Gateway{cfg: cfg, lns: map[net.Listener]bool{}, conn: map[net.Conn]bool{}}, nil
}

// Serve accepts connections on ln until Close; it returns nil after Close.
func (g *Gateway) Serve(ln net.Listener) error {
	g.mu.Lock()
	if g.done {
		g.mu.Unlock()
		ln.Close()
		return nil
	}
	g.lns[ln] = true
	g.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			g.mu.Lock()
			done := g.done
			g.mu.Unlock()
			if done {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("sshgw: accept: %w", err)
		}
		if !g.track(c) {
			c.Close()
			return nil
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			defer g.untrack(c)
			g.serveConn(c)
		}()
	}
}

func (g *Gateway) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done {
		return false
	}
	g.conn[c] = true
	return true
}

func (g *Gateway) untrack(c net.Conn) {
	c.Close()
	g.mu.Lock()
	delete(g.conn, c)
	g.mu.Unlock()
}

// Close stops accepting and ends every connection.
func (g *Gateway) Close() error {
	g.mu.Lock()
	g.done = true
	for ln := range g.lns {
		ln.Close()
	}
	for c := range g.conn {
		c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
	return nil
}

// login is an accepted key for one sandbox.
type login struct {
	grant *Grant
	c     *client.Client
	sb    *api.Sandbox
}

// handshake is the state of one connection's authentication.
type handshake struct {
	g       *Gateway
	ctx     context.Context
	mu      sync.Mutex
	ok      map[string]*login // by fingerprint
	refused []string          // reasons, one per refused key
	sandbox string            // the sandbox id a refusal concerned, when known
	user    string            // the user asked for
}

// check decides whether key may log in as user (a sandbox id or name).
func (h *handshake) check(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
	fp := ssh.FingerprintSHA256(key)
	refuse := func(sandbox, format string, args ...any) (*ssh.Permissions, error) {
		h.mu.Lock()
		h.refused = append(h.refused, fp+": "+fmt.Sprintf(format, args...))
		h.user = meta.User()
		if sandbox != "" {
			h.sandbox = sandbox
		}
		h.mu.Unlock()
		return nil, errors.New("key refused")
	}
	ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
	defer cancel()
	grant, err := h.g.cfg.Key(ctx, fp)
	if err != nil {
		return refuse("", "not an authorised key (%v)", err)
	}
	c, err := h.g.cfg.Client(ctx, grant)
	if err != nil {
		return refuse(grant.Sandbox, "key %s: its principal is gone (%v)", grant.KeyID, err)
	}
	user := meta.User()
	sb, err := c.Get(ctx, user)
	if err != nil {
		return refuse(grant.Sandbox, "key %s: sandbox %q: %v", grant.KeyID, user, err)
	}
	if grant.Sandbox != "" && sb.ID != grant.Sandbox {
		return refuse(grant.Sandbox, "key %s is restricted to sandbox %s, not %s", grant.KeyID, grant.Sandbox, sb.ID)
	}
	h.mu.Lock()
	h.ok[fp] = &login{grant: grant, c: c, sb: sb}
	h.mu.Unlock()
	return &ssh.Permissions{Extensions: map[string]string{"den-key": fp}}, nil
}

func (g *Gateway) serveConn(nc net.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := &handshake{g: g, ctx: ctx, ok: map[string]*login{}}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: h.check,
		MaxAuthTries:      6,
		ServerVersion:     "SSH-2.0-den",
	}
	cfg.AddHostKey(g.cfg.HostKey)
	nc.SetDeadline(time.Now().Add(g.cfg.HandshakeTimeout))
	sconn, chans, reqs, err := ssh.NewServerConn(quickAck(nc), cfg)
	remote := nc.RemoteAddr().String()
	if err != nil {
		h.mu.Lock()
		refused, sandbox, user := h.refused, h.sandbox, h.user
		h.mu.Unlock()
		if len(refused) > 0 {
			g.cfg.Event(sandbox, "ssh.refused", map[string]any{"user": user, "remote": remote, "why": refused})
			g.cfg.Log.Warn("ssh: login refused", "user", user, "remote", remote, "why", strings.Join(refused, "; "))
		} else {
			g.cfg.Log.Debug("ssh: handshake failed", "remote", remote, "err", err)
		}
		return
	}
	nc.SetDeadline(time.Time{})
	defer sconn.Close()
	h.mu.Lock()
	l := h.ok[sconn.Permissions.Extensions["den-key"]]
	h.mu.Unlock()
	if l == nil { // cannot happen: authentication succeeded through check
		g.cfg.Log.Error("ssh: authenticated connection without a login", "remote", remote)
		return
	}
	g.cfg.Log.Info("ssh: login", "sandbox", l.sb.ID, "key", l.grant.KeyID, "key_name", l.grant.Name, "remote", remote)
	g.cfg.Event(l.sb.ID, "ssh.login", map[string]string{"key": l.grant.KeyID, "fingerprint": l.grant.Fingerprint, "remote": remote})
	go ssh.DiscardRequests(reqs) // no remote forwarding (-R) or other global requests
	var wg sync.WaitGroup
	for nch := range chans {
		switch nch.ChannelType() {
		case "session":
			wg.Add(1)
			go func() {
				defer wg.Done()
				g.session(ctx, l, nch)
			}()
		case "direct-tcpip":
			wg.Add(1)
			go func() {
				defer wg.Done()
				g.forward(ctx, l, nch)
			}()
		default:
			nch.Reject(ssh.UnknownChannelType, "den's gateway serves sessions and local forwards (-L) only")
		}
	}
	cancel() // the connection ended: end its forwards and sessions
	wg.Wait()
}

// LoadHostKey reads the gateway's host key from path, creating an ed25519
// key there (mode 0600, and its public half in path.pub) on first use.
func LoadHostKey(path string) (ssh.Signer, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		s, err := ssh.ParsePrivateKey(b)
		if err != nil {
			return nil, fmt.Errorf("ssh host key %s: %w", path, err)
		}
		return s, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("ssh host key: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "den ssh gateway")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) { // another daemon won the race
			return LoadHostKey(path)
		}
		return nil, fmt.Errorf("ssh host key: %w", err)
	}
	if err := pem.Encode(f, block); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, err
	}
	pub := ssh.MarshalAuthorizedKey(s.PublicKey())
	if err := os.WriteFile(path+".pub", pub, 0o644); err != nil {
		return nil, err
	}
	return s, nil
}
