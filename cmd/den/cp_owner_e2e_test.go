package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
)

// Files den cp puts into a sandbox belong to the sandbox's user (den
// create -u), so commands running as that user can change them; -a keeps
// the local owners instead; a sandbox without a user gets root's files.
func TestCpInOwnedBySandboxUser(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"a.txt", "sub/b.txt"} {
		if err := os.WriteFile(filepath.Join(src, f), []byte("hi\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{src, filepath.Join(src, "sub"), filepath.Join(src, "a.txt"), filepath.Join(src, "sub/b.txt")} {
		if err := os.Lchown(p, 1234, 1234); err != nil {
			t.Fatal(err)
		}
	}
	den := d.must
	owners := func(id, dir string) string {
		t.Helper()
		return d.sh(id, "cd "+dir+" && stat -c %u:%g src src/a.txt src/sub src/sub/b.txt | sort -u")
	}
	sb, err := d.c.Create(ctx, api.CreateRequest{User: "daemon"}) // uid 1 in every Debian /etc/passwd
	if err != nil {
		t.Fatal(err)
	}
	den("cp", src, sb.ID+":/tmp")
	if got := owners(sb.ID, "/tmp"); got != "1:1\n" {
		t.Fatalf("den cp into a -u daemon sandbox: owners %q, want 1:1", got)
	}
	// The user the sandbox runs commands as can change what was copied.
	if out := den("exec", sb.ID, "--", "sh", "-c", "echo more >> /tmp/src/a.txt && id -u"); out != "1\n" {
		t.Fatalf("append as the sandbox's user: %q", out)
	}
	den("exec", "--user", "root", sb.ID, "--", "mkdir", "/tmp/kept")
	den("cp", "-a", src, sb.ID+":/tmp/kept")
	if got := owners(sb.ID, "/tmp/kept"); got != "1234:1234\n" {
		t.Fatalf("den cp -a: owners %q, want the local 1234:1234", got)
	}
	plain, err := d.c.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	den("cp", src, plain.ID+":/tmp")
	if got := owners(plain.ID, "/tmp"); got != "0:0\n" {
		t.Fatalf("den cp into a sandbox without a user: owners %q, want root's", got)
	}
	// An unknown user is a clear error, not files of some other owner.
	odd, err := d.c.Create(ctx, api.CreateRequest{User: "nosuchuser"})
	if err != nil {
		t.Fatal(err)
	}
	err = d.c.Upload(ctx, odd.ID, "/tmp", strings.NewReader(""))
	if err == nil || !strings.Contains(err.Error(), "nosuchuser") {
		t.Fatalf("upload into a sandbox whose user is unknown: %v", err)
	}
	if err := d.c.UploadKeepingOwners(ctx, odd.ID, "/tmp", strings.NewReader("")); err != nil {
		t.Fatalf("upload keeping owners into the same sandbox: %v", err)
	}
}
