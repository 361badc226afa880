package sandbox

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/store"
)

var secretRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// validSecretName: like an environment variable name.
func validSecretName(n string) bool {
	if n == "" || len(n) > 128 {
		return false
	}
	for i, c := range n {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// expandSecret resolves ${NAME} references for a sandbox of owner: the
// owner's own secrets first, then (for the admin's sandboxes only) the
// daemon's environment. A token's sandbox never reaches the admin's or
// another token's secrets, nor the daemon's environment.
func (m *Manager) expandSecret(ctx context.Context, owner, v string) (string, error) {
	var missing []string
	out := secretRef.ReplaceAllStringFunc(v, func(ref string) string {
		name := ref[2 : len(ref)-1]
		if b, err := m.db.GetSecret(ctx, secretKey(owner, name)); err == nil {
			return string(b)
		}
		if e, ok := os.LookupEnv(name); ok && owner == "" {
			return e
		}
		missing = append(missing, name)
		return ""
	})
	if len(missing) > 0 && owner != "" {
		return "", api.FieldError("network.secret_headers", "secret %s not found: den secret set %s (with this token)", missing[0], missing[0])
	}
	if len(missing) > 0 {
		return "", api.FieldError("network.secret_headers", "secret %s not found: den secret set %s, or set it in the daemon's environment", missing[0], missing[0])
	}
	return out, nil
}

// secretOwner is whose secrets a request reads and writes: the admin's
// (""), or its token's. A request narrowed to one sandbox has none.
func secretOwner(ctx context.Context) (string, error) {
	sc := ScopeFrom(ctx)
	if sc != nil && sc.Sandbox != "" {
		return "", api.Errorf(api.KindUnauthorized, "this credential is for sandbox %s only: it has no secrets", short(sc.Sandbox))
	}
	return sc.owner(), nil
}

// SetSecret stores a secret in the secret store of the request's owner.
func (m *Manager) SetSecret(ctx context.Context, name string, value []byte) error {
	owner, err := secretOwner(ctx)
	if err != nil {
		return err
	}
	if !validSecretName(name) {
		return api.FieldError("name", "%q: use letters, digits and _ (like an environment variable)", name)
	}
	if len(value) == 0 || len(value) > 64<<10 {
		return api.FieldError("value", "a secret is 1 byte to 64 KiB")
	}
	if err := m.db.PutSecret(ctx, secretKey(owner, name), value); err != nil {
		return err
	}
	m.event("", "secret.set", map[string]any{"name": name, "owner": owner})
	m.refreshPolicies(ctx)
	return nil
}

// Secrets lists the names (never values) of the request's owner's secrets.
func (m *Manager) Secrets(ctx context.Context) ([]string, error) {
	owner, err := secretOwner(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := m.db.SecretNames(ctx)
	if err != nil {
		return nil, err
	}
	names := []string{}
	for _, k := range keys {
		if n, ok := secretName(owner, k); ok {
			names = append(names, n)
		}
	}
	return names, nil
}

// DeleteSecret removes one of the request's owner's secrets.
func (m *Manager) DeleteSecret(ctx context.Context, name string) error {
	owner, err := secretOwner(ctx)
	if err != nil {
		return err
	}
	if !validSecretName(name) {
		return api.Errorf(api.KindNotFound, "no secret %q", name)
	}
	if _, err := m.db.GetSecret(ctx, secretKey(owner, name)); errors.Is(err, store.ErrNotFound) {
		return api.Errorf(api.KindNotFound, "no secret %q", name)
	}
	if err := m.db.DeleteSecret(ctx, secretKey(owner, name)); err != nil {
		return err
	}
	m.event("", "secret.delete", map[string]any{"name": name, "owner": owner})
	m.refreshPolicies(ctx)
	return nil
}

// refreshPolicies re-expands the policies of running networked sandboxes
// (a secret they use changed).
func (m *Manager) refreshPolicies(ctx context.Context) {
	for _, id := range m.net.networkedIDs() {
		if rec, err := m.get(ctx, id); err == nil {
			m.setNetPolicy(rec.ID, rec.Owner, rec.Network)
		}
	}
}

// SandboxCA returns the sandbox's own CA, made on first use and kept in
// its state directory on the host (never inside the sandbox).
func (m *Manager) SandboxCA(id string) (*tls.Certificate, error) {
	dir := filepath.Join(m.sandboxesDir(), id)
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if c, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		return &c, nil
	}
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "den sandbox " + id[:12], Organization: []string{"den"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	c, err := tls.LoadX509KeyPair(certPath, keyPath)
	return &c, err
}

// Where a sandbox finds its CA.
const (
	sandboxCAFile = "/usr/local/share/ca-certificates/den-sandbox-ca.crt"
	systemBundle  = "/etc/ssl/certs/ca-certificates.crt"
)

// installCA puts the sandbox's CA in its trust store (the Debian bundle,
// and a file of its own for tools that take one).
func (m *Manager) installCA(ctx context.Context, id string, b isolate.Box) error {
	ca, err := m.SandboxCA(id)
	if err != nil {
		return err
	}
	pemCert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Certificate[0]})
	ag := b.Agent()
	put := func(path string, body []byte) error {
		resp, err := ag.Do(ctx, "PUT", agent.PathFiles, map[string][]string{"path": {path}, "mode": {"0644"}}, bytes.NewReader(body), nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	if err := put(sandboxCAFile, pemCert); err != nil {
		return err
	}
	bundle := []byte{}
	if resp, err := ag.Do(ctx, "GET", agent.PathFiles, map[string][]string{"path": {systemBundle}}, nil, nil); err == nil {
		bundle, _ = io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		resp.Body.Close()
	}
	if bytes.Contains(bundle, pemCert) {
		return nil
	}
	if len(bundle) > 0 && !bytes.HasSuffix(bundle, []byte("\n")) {
		bundle = append(bundle, '\n')
	}
	return put(systemBundle, append(bundle, pemCert...))
}

// caEnv points TLS libraries with bundles of their own at the system one.
func caEnv(p api.NetworkPolicy) []string {
	if len(p.SecretHeaders) == 0 {
		return nil
	}
	return []string{"SSL_CERT_FILE=" + systemBundle, "REQUESTS_CA_BUNDLE=" + systemBundle, "CURL_CA_BUNDLE=" + systemBundle, "NODE_EXTRA_CA_CERTS=" + sandboxCAFile}
}
