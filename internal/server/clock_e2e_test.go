package server_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// A microVM's clock is the host's, as TLS needs: `openssl verify` of a
// certificate issued a minute ago passes in a fresh microVM (whose
// guest clock began at 1970 before den set it), and after hibernate and
// a resume later on, of one issued after the hibernate (the saved guest
// holds the hibernate's time).
func TestMicrovmClock(t *testing.T) {
	e := newTierEnv(t)
	e.need(t, "microvm")
	ctx := context.Background()
	img := e.opensslImage(t)
	sb := e.create(t, api.CreateRequest{Image: img, Runtime: "microvm"})
	defer e.c.Remove(ctx, sb.ID, true)
	e.verifyCert(t, sb.ID, time.Now().Add(-time.Minute), "a fresh microVM")

	if _, err := e.c.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	hibernated := time.Now()
	time.Sleep(5 * time.Second)
	got, err := e.c.Resume(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Resumed != api.ResumedRestored {
		t.Fatalf("resumed %q, want restored", got.Resumed)
	}
	e.verifyCert(t, sb.ID, hibernated.Add(3*time.Second), "a microVM restored 5 s after its hibernate")
}

// verifyCert makes a self-signed CA certificate valid from notBefore for
// a day, and has openssl in sandbox id verify it.
func (e *env) verifyCert(t *testing.T, id string, notBefore time.Time, where string) {
	t.Helper()
	cert := selfSignedAt(t, notBefore, notBefore.Add(24*time.Hour), "den-clock-test")
	p := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	if _, err := e.c.WriteFile(context.Background(), id, "/tmp/cert.pem", bytes.NewReader(p), 0o644); err != nil {
		t.Fatal(err)
	}
	res := e.sh(t, id, "openssl verify -CAfile /tmp/cert.pem /tmp/cert.pem 2>&1; date -u")
	if res.ExitCode != 0 || !strings.Contains(string(res.Stdout), "/tmp/cert.pem: OK") {
		t.Fatalf("%s: openssl verify of a certificate valid from %s (host clock %s): exit %d: %s", where,
			notBefore.UTC().Format(time.RFC3339), time.Now().UTC().Format(time.RFC3339), res.ExitCode, res.Stdout)
	}
}

// opensslImage builds an image of busybox and the host's openssl with the
// libraries ldd names.
func (e *env) opensslImage(t *testing.T) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox not installed (apt-get install busybox-static)")
	}
	ossl, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("openssl not installed")
	}
	out, err := exec.Command("ldd", ossl).Output()
	if err != nil {
		t.Skipf("ldd %s: %v", ossl, err)
	}
	files := map[string]string{"/bin/busybox": bb, "/bin/sh": bb, "/usr/bin/openssl": ossl}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/") {
			files[f[2]] = f[2]
		} else if len(f) >= 1 && strings.HasPrefix(f[0], "/") {
			files[f[0]] = f[0]
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	df := "FROM scratch\nCOPY passwd /etc/passwd\n"
	add := func(name string, data []byte) {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg})
		tw.Write(data)
	}
	add("passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"))
	i := 0
	for dst, src := range files {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		name := "f" + strconv.Itoa(i) + "-" + filepath.Base(dst)
		i++
		add(name, data)
		df += fmt.Sprintf("COPY %s %s\n", name, dst)
	}
	add("Dockerfile", []byte(df))
	tw.Close()
	if _, err := e.c.BuildImage(context.Background(), &buf, client.BuildOptions{Tag: "openssl"}, nil); err != nil {
		t.Fatal(err)
	}
	return "openssl"
}
