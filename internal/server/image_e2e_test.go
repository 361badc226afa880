package server_test

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// busyboxImage builds a one-layer image around the host's static busybox,
// as `docker save` would write it.
func busyboxImage(t *testing.T) []byte {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("needs a static /bin/busybox (Debian package busybox-static) to build a test image")
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, d := range []string{"bin/", "etc/", "tmp/", "srv/", "root/"} {
		tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	tw.WriteHeader(&tar.Header{Name: "bin/busybox", Mode: 0o755, Size: int64(len(bb))})
	tw.Write(bb)
	// A setuid-root copy: it must not make anyone root, in or out of the sandbox.
	tw.WriteHeader(&tar.Header{Name: "bin/busybox-suid", Mode: 0o4755, Size: int64(len(bb))})
	tw.Write(bb)
	for _, l := range []string{"sh", "echo", "cat", "id", "pwd", "hostname", "ls", "touch"} {
		tw.WriteHeader(&tar.Header{Name: "bin/" + l, Typeflag: tar.TypeSymlink, Linkname: "busybox"})
	}
	passwd := "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/srv:/bin/sh\n"
	tw.WriteHeader(&tar.Header{Name: "etc/passwd", Mode: 0o644, Size: int64(len(passwd))})
	tw.Write([]byte(passwd))
	tw.Close()
	l := static.NewLayer(layer.Bytes(), types.DockerLayer)
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin", "FROM_IMAGE=yes"}, WorkingDir: "/srv", User: "app", Cmd: []string{"sh"}})
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.NewTag("example.org/busybox:test")
	var out bytes.Buffer
	if err := tarball.Write(ref, img, &out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func TestImportedImage(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	archive := busyboxImage(t)
	var progressed bool
	imgs, err := e.c.ImportImage(ctx, "bb", bytes.NewReader(archive), func(done, total int64, what string) { progressed = true })
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Name != "bb" || imgs[0].Config.Workdir != "/srv" || imgs[0].Config.User != "app" || !progressed {
		t.Fatalf("imported %+v (progress %v)", imgs, progressed)
	}
	sb := e.create(t, api.CreateRequest{Image: "bb"})
	r := e.sh(t, sb.ID, "echo $FROM_IMAGE; pwd; id -u; ls /bin/busybox; touch /bin/new && echo copyup")
	if got := string(r.Stdout); got != "yes\n/srv\n1000\n/bin/busybox\n" {
		t.Fatalf("sandbox from image: %q %q", got, r.Stderr)
	}
	// Setuid bits in an image give nothing: no_new_privs holds.
	if r := e.sh(t, sb.ID, "ls -l /bin/busybox-suid | cut -c1-10; /bin/busybox-suid sh -c 'id -u'"); string(r.Stdout) != "-rwsr-xr-x\n1000\n" {
		t.Fatalf("setuid binary: %q %q", r.Stdout, r.Stderr)
	}
	// The image's user cannot write its root-owned files; root can, into
	// this sandbox's own layer.
	r, err = e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "touch /bin/new && echo copyup", User: "root"})
	if err != nil || string(r.Stdout) != "copyup\n" {
		t.Fatalf("root copy-up in an image sandbox: %+v %v", r, err)
	}
	other := e.create(t, api.CreateRequest{Image: "bb"})
	if r := e.sh(t, other.ID, "ls /bin/new 2>&1 || true"); strings.Contains(string(r.Stdout), "/bin/new\n") {
		t.Fatal("a write in one sandbox shows in another from the same image")
	}
	// In use → conflict; after removing the sandboxes, the image and its
	// layers go.
	wantKind(t, e.c.RemoveImage(ctx, "bb"), api.KindConflict)
	e.c.Remove(ctx, sb.ID, true)
	e.c.Remove(ctx, other.ID, true)
	if err := e.c.RemoveImage(ctx, "bb"); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Image(ctx, "bb")
	wantKind(t, err, api.KindNotFound)
	// Garbage in → a clear error.
	_, err = e.c.ImportImage(ctx, "junk", strings.NewReader("this is not a tarball"), nil)
	wantKind(t, err, api.KindInvalid)
}
