package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// onlyHost is a transport that reaches host only: a fuzzed challenge or
// manifest may name any URL, and a fuzzer must not reach the network.
type onlyHost struct{ host string }

func (o onlyHost) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Host != o.host {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, fmt.Errorf("fuzz: %s is not the test registry", r.URL.Host)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// FuzzPull pulls from a registry that answers the API check with an
// arbitrary WWW-Authenticate challenge ({realm} stands for its own token
// endpoint) and the tag with an arbitrary manifest of an arbitrary media
// type, serving one image's real blobs but an arbitrary config under the
// config's digest. A failed pull says so, naming the reference; a pull
// that succeeds is content-addressed: its id is the manifest's digest,
// the config it used is the one that digest names, and its layers are in
// the store.
func FuzzPull(f *testing.F) {
	requireRoot(f)
	hermeticDockerConfig(f)
	img := mkImage(f, testConfig, mkLayer(f, baseLayer(f), gzipLayer))
	manifest, err := img.RawManifest()
	if err != nil {
		f.Fatal(err)
	}
	config, err := img.RawConfigFile()
	if err != nil {
		f.Fatal(err)
	}
	cfgName, _ := img.ConfigName()
	blobs := map[string][]byte{cfgName.String(): nil}
	layers, _ := img.Layers()
	for _, l := range layers {
		d, _ := l.Digest()
		rc, _ := l.Compressed()
		var b strings.Builder
		buf := make([]byte, 32<<10)
		for {
			n, err := rc.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		rc.Close()
		blobs[d.String()] = []byte(b.String())
	}
	var mu sync.Mutex
	var cur struct {
		challenge, mediaType string
		manifest, config     []byte
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		c := cur
		mu.Unlock()
		authed := r.Header.Get("Authorization") != ""
		switch p := r.URL.Path; {
		case p == "/token":
			w.Write([]byte(`{"token":"t","access_token":"t","expires_in":60}`))
		case c.challenge != "" && !authed && strings.HasPrefix(p, "/v2/"):
			w.Header().Set("WWW-Authenticate", c.challenge)
			w.WriteHeader(401)
		case p == "/v2/":
			w.WriteHeader(200)
		case p == "/v2/den/fuzz/manifests/v1":
			w.Header().Set("Content-Type", c.mediaType)
			w.Write(c.manifest)
		case strings.HasPrefix(p, "/v2/den/fuzz/blobs/"):
			d := strings.TrimPrefix(p, "/v2/den/fuzz/blobs/")
			b, ok := blobs[d]
			if d == cfgName.String() {
				b = c.config
			}
			if !ok {
				w.WriteHeader(404)
				return
			}
			w.Write(b)
		default:
			w.WriteHeader(404)
		}
	}))
	f.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	ref := host + "/den/fuzz:v1"
	mediaTypes := []string{string(types.OCIManifestSchema1), string(types.DockerManifestSchema2), string(types.OCIImageIndex), string(types.DockerManifestList), "application/json", ""}
	for _, ch := range []string{"", `Bearer realm="{realm}/token",service="reg",scope="repository:den/fuzz:pull"`, `Basic realm="x"`,
		`Bearer realm="http://169.254.169.254/latest",service="x"`, `Bearer realm=`, `Bearer ,,,="`, `Bearer realm="{realm}/token", error="insufficient_scope"`} {
		f.Add(ch, uint8(0), manifest, config)
		f.Add(ch, uint8(1), manifest, config)
	}
	f.Add("", uint8(0), manifest, append([]byte(nil), config[:len(config)-1]...))
	f.Add("", uint8(2), []byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:`+strings.Repeat("0", 64)+`","size":1}]}`), config)
	f.Add("", uint8(0), []byte(`{"schemaVersion":2,"config":{"digest":"sha256:`+strings.Repeat("a", 64)+`","size":-1},"layers":[{"digest":"../../x","size":1}]}`), config)
	// The honest registry works, with and without a token challenge.
	for _, ch := range []string{"", `Bearer realm="` + srv.URL + `/token",service="reg"`} {
		cur.challenge, cur.mediaType, cur.manifest, cur.config = ch, mediaTypes[0], manifest, config
		if _, err := newStore(f).Pull(context.Background(), ref, PullOptions{Insecure: true, Transport: onlyHost{host}, Platform: "linux/amd64"}, nil); err != nil {
			f.Fatalf("pull from the test registry (challenge %q): %v", ch, err)
		}
	}
	f.Fuzz(func(t *testing.T, challenge string, mt uint8, man, cfg []byte) {
		mu.Lock()
		cur.challenge = strings.ReplaceAll(challenge, "{realm}", srv.URL)
		cur.mediaType = mediaTypes[int(mt)%len(mediaTypes)]
		cur.manifest, cur.config = man, cfg
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s := newStore(t)
		got, err := s.Pull(ctx, ref, PullOptions{Insecure: true, Transport: onlyHost{host}, Platform: "linux/amd64"}, nil)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "pull "+ref+": ") {
				t.Fatalf("error %q does not name the reference", err)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("pull hung: %v", err)
			}
			return
		}
		sum := sha256.Sum256(man)
		if got.Image.ID != "sha256:"+hex.EncodeToString(sum[:]) {
			t.Fatalf("pulled image id %s, the manifest served is sha256:%x", got.Image.ID, sum)
		}
		cs := sha256.Sum256(cfg)
		if "sha256:"+hex.EncodeToString(cs[:]) != cfgName.String() {
			t.Fatalf("pulled with a config %q that does not hash to the digest %s it was served under", cfg, cfgName)
		}
		for _, l := range got.Image.Layers {
			if !s.HasLayer(l) {
				t.Fatalf("pulled image's layer %s is not in the store", l)
			}
		}
		if _, err := name.ParseReference(got.Canonical); err != nil {
			t.Fatalf("canonical reference %q: %v", got.Canonical, err)
		}
	})
}

// recordHosts refuses every request and records the hosts asked for.
type recordHosts struct {
	mu    sync.Mutex
	hosts map[string]bool
}

func (r *recordHosts) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.hosts[req.URL.Host] = true
	r.mu.Unlock()
	if req.Body != nil {
		req.Body.Close()
	}
	return nil, errors.New("fuzz: no network")
}

// FuzzPullRef pulls arbitrary image references with a transport that
// reaches nothing: a reference den cannot parse is refused before any
// request, a parsed one makes requests to its own registry only, and
// every error names the reference.
func FuzzPullRef(f *testing.F) {
	for _, s := range []string{"alpine", "alpine:3.20", "docker.io/library/alpine@sha256:" + strings.Repeat("a", 64), "localhost:5000/x/y:z",
		"[::1]:5000/a", "ghcr.io/a/b:c@sha256:" + strings.Repeat("0", 64), "UPPER/case", "a//b", "a:b:c", "http://evil/x", "a@sha256:xyz", "", ":", "127.0.0.1/x#y"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	hermeticDockerConfig(f)
	f.Fuzz(func(t *testing.T, ref string, insecure bool) {
		rec := &recordHosts{hosts: map[string]bool{}}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := newStore(t).Pull(ctx, ref, PullOptions{Insecure: insecure, Transport: rec, Platform: "linux/amd64"}, nil)
		if err == nil {
			t.Fatalf("pull %q succeeded without a network", ref)
		}
		if !strings.HasPrefix(err.Error(), "pull "+ref+": ") {
			t.Fatalf("error %q does not name the reference %q", err, ref)
		}
		var opts []name.Option
		if insecure {
			opts = append(opts, name.Insecure)
		}
		r, perr := name.ParseReference(ref, opts...)
		if perr != nil {
			if len(rec.hosts) > 0 {
				t.Fatalf("unparsable %q made requests to %v", ref, rec.hosts)
			}
			return
		}
		reg := r.Context().RegistryStr()
		for h := range rec.hosts {
			if h != reg && !(reg == name.DefaultRegistry && h == "registry-1.docker.io") {
				t.Fatalf("pull %q (registry %s) asked %s", ref, reg, h)
			}
		}
	})
}
