package server_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
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

// Pull from a registry served in-process, run the image, save it, and
// import the archive again.
func TestPullSaveImport(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	archive := busyboxImage(t)
	reg := httptest.NewServer(registry.New())
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	img, err := tarball.Image(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(archive)), nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(host + "/tools/busybox:1")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	var progressed bool
	pulled, err := e.c.PullImage(ctx, api.PullRequest{Ref: host + "/tools/busybox:1", Name: "bb-pulled"}, func(done, total int64, what string) { progressed = true })
	if err != nil || pulled.Name != "bb-pulled" || !progressed {
		t.Fatalf("pull: %+v %v (progress %v)", pulled, err, progressed)
	}
	// Pulling again is idempotent.
	if again, err := e.c.PullImage(ctx, api.PullRequest{Ref: host + "/tools/busybox:1", Name: "bb-pulled2"}, nil); err != nil || again.ID != pulled.ID {
		t.Fatalf("second pull: %+v %v", again, err)
	}
	sb := e.create(t, api.CreateRequest{Image: "bb-pulled"})
	if r := e.sh(t, sb.ID, "echo $FROM_IMAGE; id -u"); string(r.Stdout) != "yes\n1000\n" {
		t.Fatalf("sandbox from pulled image: %q %q", r.Stdout, r.Stderr)
	}
	// A missing tag: a clear error.
	_, err = e.c.PullImage(ctx, api.PullRequest{Ref: host + "/tools/busybox:nope"}, nil)
	wantKind(t, err, api.KindInvalid)
	// Save, then import the archive under another name.
	rc, err := e.c.SaveImages(ctx, []string{"bb-pulled"})
	if err != nil {
		t.Fatal(err)
	}
	saved, _ := io.ReadAll(rc)
	rc.Close()
	imgs, err := e.c.ImportImage(ctx, "bb-reimported", bytes.NewReader(saved), nil)
	if err != nil || len(imgs) != 1 {
		t.Fatalf("import of a saved archive: %v %v", imgs, err)
	}
	sb2 := e.create(t, api.CreateRequest{Image: "bb-reimported"})
	if r := e.sh(t, sb2.ID, "echo $FROM_IMAGE; pwd"); string(r.Stdout) != "yes\n/srv\n" {
		t.Fatalf("sandbox from the re-imported image: %q %q", r.Stdout, r.Stderr)
	}
	// Host-based images cannot be saved.
	host2 := e.create(t, api.CreateRequest{})
	if _, err := e.c.Commit(ctx, host2.ID, api.CommitRequest{Name: "on-host"}); err != nil {
		t.Fatal(err)
	}
	if rc, err := e.c.SaveImages(ctx, []string{"on-host"}); err == nil {
		rc.Close()
		t.Fatal("saved an image built on the host's own files")
	}
}
