package image

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// testRegistry is ggcr's in-memory registry behind an httptest server,
// with an optional wrapper around its handler.
type testRegistry struct {
	srv  *httptest.Server
	host string
	reg  http.Handler

	mu   sync.Mutex
	wrap func(w http.ResponseWriter, r *http.Request, next http.Handler)
}

func newTestRegistry(t *testing.T) *testRegistry {
	tr := &testRegistry{reg: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	tr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.mu.Lock()
		wrap := tr.wrap
		tr.mu.Unlock()
		if wrap != nil {
			wrap(w, r, tr.reg)
			return
		}
		tr.reg.ServeHTTP(w, r)
	}))
	t.Cleanup(tr.srv.Close)
	tr.host = strings.TrimPrefix(tr.srv.URL, "http://")
	return tr
}

func (tr *testRegistry) setWrap(f func(w http.ResponseWriter, r *http.Request, next http.Handler)) {
	tr.mu.Lock()
	tr.wrap = f
	tr.mu.Unlock()
}

// push writes img as repo (e.g. "den/test:v1") and returns the full
// reference.
func (tr *testRegistry) push(t *testing.T, repo string, img v1.Image) string {
	t.Helper()
	ref := tr.host + "/" + repo
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

// countingTransport counts GET requests per URL path.
type countingTransport struct {
	mu   sync.Mutex
	gets map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet {
		c.mu.Lock()
		if c.gets == nil {
			c.gets = map[string]int{}
		}
		c.gets[r.URL.Path]++
		c.mu.Unlock()
	}
	return http.DefaultTransport.RoundTrip(r)
}

// blobGets returns how often each of the layer blobs of img was fetched.
func (c *countingTransport) blobGets(t *testing.T, img v1.Image) []int {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for _, l := range ls {
		d, _ := l.Digest()
		n := 0
		for p, k := range c.gets {
			if strings.HasSuffix(p, "/blobs/"+d.String()) {
				n += k
			}
		}
		out = append(out, n)
	}
	return out
}

func (c *countingTransport) reset() {
	c.mu.Lock()
	c.gets = nil
	c.mu.Unlock()
}

func layerSizes(t *testing.T, img v1.Image) (map[string]int64, int64) {
	t.Helper()
	ls, _ := img.Layers()
	out := map[string]int64{}
	var total int64
	for _, l := range ls {
		d, _ := l.DiffID()
		n, _ := l.Size()
		out[d.String()] = n
		total += n
	}
	return out, total
}

func TestPull(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	reg := newTestRegistry(t)
	img := mkImage(t, testConfig, mkLayer(t, baseLayer(t), gzipLayer), mkLayer(t, topLayer(t), zstdLayer))
	ref := reg.push(t, "den/test:v1", img)

	s := newStore(t)
	ct := &countingTransport{}
	var mu sync.Mutex
	perLayer := map[string][2]int64{}
	var last [2]int64
	calls := 0
	opts := PullOptions{Insecure: true, Transport: ct, LayerProgress: func(diffID string, done, total int64) {
		mu.Lock()
		defer mu.Unlock()
		if p := perLayer[diffID]; done < p[0] {
			t.Errorf("layer %s progress went back: %d after %d", diffID, done, p[0])
		}
		perLayer[diffID] = [2]int64{done, total}
	}}
	got, err := s.Pull(ctx, ref, opts, func(done, total int64, what string) {
		calls++
		last = [2]int64{done, total}
		if !strings.HasPrefix(what, "layer sha256:") {
			t.Errorf("progress what %q", what)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != ref || got.Canonical != ref {
		t.Errorf("name %q canonical %q, want %q", got.Name, got.Canonical, ref)
	}
	im := got.Image
	if im.ID != imgDigest(t, img) || !reflect.DeepEqual(im.Layers, diffIDs(t, img)) ||
		!reflect.DeepEqual(im.Config, wantConfig()) {
		t.Errorf("pulled %+v", im)
	}
	checkBaseLayer(t, s.LayerPath(im.Layers[0]))
	checkTopLayer(t, s.LayerPath(im.Layers[1]))
	sizes, total := layerSizes(t, img)
	if calls == 0 || last != [2]int64{total, total} {
		t.Errorf("progress: %d calls, last %v, want %d/%d", calls, last, total, total)
	}
	for id, n := range sizes {
		if perLayer[id] != [2]int64{n, n} {
			t.Errorf("layer %s progress %v, want %d/%d", id, perLayer[id], n, n)
		}
	}
	if g := ct.blobGets(t, img); !reflect.DeepEqual(g, []int{1, 1}) {
		t.Errorf("layer blob GETs %v, want one each", g)
	}
	assertTmpEmpty(t, s)

	// Pulling again downloads no layer.
	ct.reset()
	calls = 0
	perLayer = map[string][2]int64{}
	again, err := s.Pull(ctx, ref, opts, func(int64, int64, string) { calls++ })
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, got) {
		t.Errorf("second pull %+v\nfirst %+v", again, got)
	}
	if g := ct.blobGets(t, img); !reflect.DeepEqual(g, []int{0, 0}) || calls != 0 || len(perLayer) != 0 {
		t.Errorf("second pull fetched layer blobs %v, %d progress calls, layer progress %v", g, calls, perLayer)
	}

	// By digest, into a new store.
	byDigest := reg.host + "/den/test@" + imgDigest(t, img)
	s2 := newStore(t)
	got2, err := s2.Pull(ctx, byDigest, PullOptions{Insecure: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got2.Name != byDigest || got2.Canonical != byDigest || !reflect.DeepEqual(got2.Image, im) {
		t.Errorf("by digest: %+v", got2)
	}

	// Unknown tag and repository, bad reference, bad platform.
	_, err = s.Pull(ctx, reg.host+"/den/test:nope", PullOptions{Insecure: true}, nil)
	mustErrContain(t, err, "pull "+reg.host+"/den/test:nope", "registry "+reg.host, "not found")
	_, err = s.Pull(ctx, reg.host+"/den/none:v1", PullOptions{Insecure: true}, nil)
	mustErrContain(t, err, "registry "+reg.host, "not found")
	_, err = s.Pull(ctx, "UPPER/case::x", PullOptions{}, nil)
	mustErrContain(t, err, "pull UPPER/case::x")
	_, err = s.Pull(ctx, ref, PullOptions{Insecure: true, Platform: "linux/"}, nil)
	mustErrContain(t, err, "platform")
	// A digest the registry's content does not match.
	wrong := reg.host + "/den/test@sha256:" + strings.Repeat("0", 64)
	_, err = s.Pull(ctx, wrong, PullOptions{Insecure: true}, nil)
	mustErrContain(t, err, "registry "+reg.host)
}

func TestPullMultiArch(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	reg := newTestRegistry(t)
	archImage := func(arch, variant string) v1.Image {
		img := mkImage(t, v1.Config{Cmd: []string{arch}}, mkLayer(t, mkTar(t, ent{name: "arch", body: arch}), gzipLayer))
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Variant = "linux", arch, variant
		img, err = mutate.ConfigFile(img, cf)
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	amd64, arm64 := archImage("amd64", ""), archImage("arm64", "v8")
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: amd64, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm64, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}},
	)
	ref := reg.host + "/den/multi:v1"
	r, _ := name.ParseReference(ref)
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatal(err)
	}
	idxDigest, _ := idx.Digest()

	check := func(got NamedImage, img v1.Image, arch, plat string) {
		t.Helper()
		if got.Image.ID != imgDigest(t, img) || got.Image.Platform != plat ||
			!reflect.DeepEqual(got.Image.Config.Cmd, []string{arch}) {
			t.Errorf("%s: got %+v", arch, got.Image)
		}
	}
	s := newStore(t)
	if runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64" {
		want := map[string]v1.Image{"amd64": amd64, "arm64": arm64}[runtime.GOARCH]
		got, err := s.Pull(ctx, ref, PullOptions{Insecure: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		check(got, want, runtime.GOARCH, configPlatform(mustConfigFile(t, want)))
	}
	got, err := s.Pull(ctx, ref, PullOptions{Insecure: true, Platform: "linux/arm64"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	check(got, arm64, "arm64", "linux/arm64/v8")
	if b, _ := os.ReadFile(filepath.Join(s.LayerPath(got.Image.Layers[0]), "arch")); string(b) != "arm64" {
		t.Errorf("arm64 layer holds %q", b)
	}
	// The index by digest.
	got, err = s.Pull(ctx, reg.host+"/den/multi@"+idxDigest.String(), PullOptions{Insecure: true, Platform: "linux/amd64"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	check(got, amd64, "amd64", "linux/amd64")
	_, err = s.Pull(ctx, ref, PullOptions{Insecure: true, Platform: "linux/s390x"}, nil)
	mustErrContain(t, err, "pull "+ref, "registry "+reg.host, "linux/s390x")
}

func mustConfigFile(t *testing.T, img v1.Image) *v1.ConfigFile {
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return cf
}

// hermeticDockerConfig points the default keychain at an empty temporary
// home, and returns the docker config directory.
func hermeticDockerConfig(t testing.TB) string {
	home := t.TempDir()
	cfgDir := filepath.Join(home, "docker-config")
	os.Mkdir(cfgDir, 0o700)
	t.Setenv("HOME", home)
	t.Setenv("DOCKER_CONFIG", cfgDir)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, "xdg"))
	t.Setenv("XDG_RUNTIME_DIR", filepath.Join(home, "run"))
	t.Setenv("REGISTRY_AUTH_FILE", filepath.Join(home, "none.json"))
	return cfgDir
}

func TestPullAuth(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	cfgDir := hermeticDockerConfig(t)
	reg := newTestRegistry(t)
	img := mkImage(t, testConfig, mkLayer(t, baseLayer(t), gzipLayer))
	reg.push(t, "den/private:v1", img)
	reg.setWrap(func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if u, p, ok := r.BasicAuth(); !ok || u != "den" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="den-test"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		next.ServeHTTP(w, r)
	})
	ref := reg.host + "/den/private:v1"

	s := newStore(t)
	var logs []string
	s.Logf = func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }
	_, err := s.Pull(ctx, ref, PullOptions{Insecure: true, Username: "den", Password: "wrong"}, nil)
	mustErrContain(t, err, "pull "+ref, "registry "+reg.host+": authentication failed", `as "den"`)
	_, err = s.Pull(ctx, ref, PullOptions{Insecure: true}, nil)
	mustErrContain(t, err, "registry "+reg.host+": authentication failed", "anonymously")
	assertStoreEmpty(t, s)

	got, err := s.Pull(ctx, ref, PullOptions{Insecure: true, Username: "den", Password: "s3cret"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Image.ID != imgDigest(t, img) {
		t.Errorf("pulled %+v", got)
	}

	// Credentials from the docker config.
	auth := base64.StdEncoding.EncodeToString([]byte("den:s3cret"))
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg.host, auth)
	if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(t)
	if _, err := s2.Pull(ctx, ref, PullOptions{Insecure: true}, nil); err != nil {
		t.Fatalf("with the docker config: %v", err)
	}
	// Wrong ones there.
	auth = base64.StdEncoding.EncodeToString([]byte("den:old"))
	cfg = fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg.host, auth)
	os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte(cfg), 0o600)
	_, err = newStore(t).Pull(ctx, ref, PullOptions{Insecure: true}, nil)
	mustErrContain(t, err, "registry "+reg.host+": authentication failed", "docker config")
	// A broken docker config: anonymous, with a log message.
	os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte("{not json"), 0o600)
	_, err = s.Pull(ctx, reg.host+"/den/other:v1", PullOptions{Insecure: true}, nil)
	mustErrContain(t, err, "authentication failed", "anonymously")
	if !strings.Contains(strings.Join(logs, "\n"), "pulling anonymously") {
		t.Errorf("logs: %q", logs)
	}
}

type okTransport struct{}

func (okTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
}

func TestPullPlainHTTPGuard(t *testing.T) {
	g := &schemeGuard{inner: okTransport{}}
	for _, u := range []string{"http://127.0.0.1:5000/v2/", "http://localhost/v2/", "http://[::1]:80/v2/", "https://10.0.0.1/v2/"} {
		req, _ := http.NewRequest("HEAD", u, nil)
		if _, err := g.RoundTrip(req); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	for _, u := range []string{"http://10.0.0.1:5000/v2/", "http://registry.example.com/v2/"} {
		req, _ := http.NewRequest("HEAD", u, nil)
		_, err := g.RoundTrip(req)
		mustErrContain(t, err, "plain http to", "refused", "insecure")
		g.insecure = true
		if _, err := g.RoundTrip(req); err != nil {
			t.Errorf("insecure %s: %v", u, err)
		}
		g.insecure = false
	}
	// Through Pull: a registry on a private address that does not answer
	// https is not tried over plain http.
	_, err := newStore(t).Pull(context.Background(), "10.255.255.1:5000/den/x:v1", PullOptions{Transport: httpOnlyTransport{}}, nil)
	mustErrContain(t, err, "plain http to 10.255.255.1:5000 refused")
}

// httpOnlyTransport fails https requests and answers http ones.
type httpOnlyTransport struct{}

func (httpOnlyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme == "https" {
		return nil, errors.New("tls: handshake failure")
	}
	return okTransport{}.RoundTrip(r)
}

func TestPullTampered(t *testing.T) {
	// "header" changes the gzip header's mtime: the layer unpacks fine and
	// has the right diffID; only the blob digest tells.
	for _, where := range []string{"header", "start", "middle", "end"} {
		t.Run(where, func(t *testing.T) {
			reg := newTestRegistry(t)
			l := mkLayer(t, baseLayer(t), gzipLayer)
			img := mkImage(t, testConfig, l)
			ref := reg.push(t, "den/tampered:v1", img)
			ld, _ := l.Digest()
			diffID, _ := l.DiffID()
			reg.setWrap(func(w http.ResponseWriter, r *http.Request, next http.Handler) {
				if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+ld.String()) {
					next.ServeHTTP(w, r)
					return
				}
				rec := httptest.NewRecorder()
				next.ServeHTTP(rec, r)
				b := rec.Body.Bytes()
				switch where {
				case "header":
					b[5] ^= 0xff
				case "start":
					b[20] ^= 0xff
				case "middle":
					b[len(b)/2] ^= 0x01
				case "end":
					b[len(b)-1] ^= 0x01
				}
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.WriteHeader(rec.Code)
				w.Write(b)
			})
			s := newStore(t)
			_, err := s.Pull(context.Background(), ref, PullOptions{Insecure: true}, nil)
			mustErrContain(t, err, "pull "+ref, "layer "+diffID.String(), "compressed digest mismatch", ld.String())
			assertStoreEmpty(t, s)
		})
	}
}

// randomLayer is a gzip layer of incompressible data, so that its blob is
// about n bytes.
func randomLayer(t *testing.T, seed int64, n int) v1.Layer {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return mkLayer(t, mkTar(t, ent{name: fmt.Sprintf("data-%d", seed), body: string(b)}), gzipLayer)
}

func TestPullResume(t *testing.T) {
	ctx := context.Background()
	reg := newTestRegistry(t)
	// Large enough for per-layer progress reports (every MiB) half way.
	layers := []v1.Layer{randomLayer(t, 1, 3<<20), randomLayer(t, 2, 3<<20), randomLayer(t, 3, 3<<20)}
	img := mkImage(t, v1.Config{}, layers...)
	ref := reg.push(t, "den/big:v1", img)
	ids := diffIDs(t, img)
	stuck, _ := layers[1].Digest()

	// The registry sends half of the second layer and then stalls.
	started := make(chan struct{}, 1)
	reg.setWrap(func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+stuck.String()) {
			next.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		b := rec.Body.Bytes()
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.WriteHeader(http.StatusOK)
		w.Write(b[:len(b)/2])
		w.(http.Flusher).Flush()
		select {
		case started <- struct{}{}:
		default:
		}
		<-r.Context().Done()
	})
	s := newStore(t)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var partial atomic.Int64
	go func() {
		// Cancel once the other two layers are complete and the second is
		// half way.
		<-started
		deadline := time.Now().Add(20 * time.Second)
		for !(s.HasLayer(ids[0]) && s.HasLayer(ids[2]) && partial.Load() > 0) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	_, err := s.Pull(cctx, ref, PullOptions{Insecure: true, LayerProgress: func(id string, done, _ int64) {
		if id == ids[1] {
			partial.Store(done)
		}
	}}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if !s.HasLayer(ids[0]) || s.HasLayer(ids[1]) || !s.HasLayer(ids[2]) {
		t.Fatalf("after the interrupted pull: layers %v present: %v %v %v", ids, s.HasLayer(ids[0]), s.HasLayer(ids[1]), s.HasLayer(ids[2]))
	}
	if partial.Load() == 0 {
		t.Error("the stalled layer made no progress before the cancel")
	}
	assertTmpEmpty(t, s)

	// The second pull completes, downloading only the missing layer, from
	// its start.
	reg.setWrap(nil)
	ct := &countingTransport{}
	var done2, total2 int64
	got, err := s.Pull(ctx, ref, PullOptions{Insecure: true, Transport: ct}, func(done, total int64, _ string) {
		done2, total2 = done, total
	})
	if err != nil {
		t.Fatal(err)
	}
	if g := ct.blobGets(t, img); !reflect.DeepEqual(g, []int{0, 1, 0}) {
		t.Errorf("layer blob GETs %v, want only the second layer", g)
	}
	if size, _ := layers[1].Size(); done2 != size || total2 != size {
		t.Errorf("progress %d/%d, want %d/%d", done2, total2, size, size)
	}
	if !reflect.DeepEqual(got.Image.Layers, ids) {
		t.Errorf("layers %v", got.Image.Layers)
	}
	for i, id := range ids {
		if _, err := os.Stat(filepath.Join(s.LayerPath(id), fmt.Sprintf("data-%d", i+1))); err != nil {
			t.Error(err)
		}
	}
	assertTmpEmpty(t, s)
}

// TestPullFailingLayerStopsOthers: when one layer fails, the downloads of
// the others are stopped at once, even if their registry stalls.
func TestPullFailingLayerStopsOthers(t *testing.T) {
	reg := newTestRegistry(t)
	layers := []v1.Layer{randomLayer(t, 1, 100<<10), randomLayer(t, 2, 100<<10)}
	img := mkImage(t, v1.Config{}, layers...)
	ref := reg.push(t, "den/fail:v1", img)
	stall, _ := layers[0].Digest()
	broken, _ := layers[1].Digest()
	reg.setWrap(func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		switch {
		case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+stall.String()):
			w.Header().Set("Content-Length", "1000000")
			w.WriteHeader(http.StatusOK)
			w.Write(bytes.Repeat([]byte{0x1f}, 10))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+broken.String()):
			time.Sleep(50 * time.Millisecond)
			w.WriteHeader(http.StatusNotFound)
		default:
			next.ServeHTTP(w, r)
		}
	})
	s := newStore(t)
	start := time.Now()
	_, err := s.Pull(context.Background(), ref, PullOptions{Insecure: true}, nil)
	mustErrContain(t, err, "pull "+ref, "registry "+reg.host)
	if errors.Is(err, context.Canceled) {
		t.Errorf("the cancel of the stalled layer hides the cause: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v", d)
	}
	assertStoreEmpty(t, s)
}
