package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync/atomic"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// pullParallel is how many layers Pull downloads at a time.
const pullParallel = 3

// PullOptions modify Pull.
type PullOptions struct {
	// Username and Password, if either is set, are the registry
	// credentials. Otherwise they come from the docker config
	// (~/.docker/config.json or $DOCKER_CONFIG, with credential helpers;
	// podman's auth.json as a fallback), else the pull is anonymous.
	Username, Password string
	// Insecure allows plain http to any registry (for tests and local
	// registries). Without it, plain http is only used for loopback
	// registries (localhost, 127.0.0.0/8, ::1), as docker does.
	Insecure bool
	// Platform picks the image of a multi-platform index:
	// "os/arch[/variant]", default "linux/" + runtime.GOARCH.
	Platform string
	// Transport, if set, carries the registry's HTTP requests (default
	// remote.DefaultTransport, which honours HTTP(S)_PROXY).
	Transport http.RoundTripper
	// LayerProgress, if set, receives per-layer download progress: bytes
	// of the compressed blob of the layer diffID received so far and its
	// size. It is never called concurrently (nor with the Progress
	// callback), and not for layers already in the store.
	LayerProgress func(diffID string, done, total int64)
}

// Pull downloads the image ref (e.g. "alpine", "ghcr.io/org/app:v1",
// "registry.example.com:5000/app@sha256:<hex>") from its registry into the
// store, and returns it with Name = ref as given and Canonical the fully
// qualified reference. Image.ID is the digest of the image manifest (for a
// multi-platform index, of the manifest chosen for opts.Platform).
//
// Manifests, the config and every blob are verified against their
// digests, and every layer against the config's diffID as it is unpacked.
// Layers already in the store are not downloaded, so pulling an image
// again only fetches its manifest and config. Up to 3 layers are
// downloaded at a time.
//
// progress, if not nil, receives overall progress as Import does: done and
// total are bytes of the compressed layers to download, what names the
// layer ("layer sha256:<diffID>") that made progress.
//
// An interrupted pull (ctx canceled, a network error) keeps every layer
// that was complete, and pulling again skips them; a layer that was only
// partly downloaded is discarded and downloaded again from its start.
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions, progress Progress) (NamedImage, error) {
	ni, err := s.pull(ctx, ref, opts, progress)
	if err != nil {
		return NamedImage{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	return ni, nil
}

func (s *Store) pull(ctx context.Context, ref string, opts PullOptions, progress Progress) (NamedImage, error) {
	var nopts []name.Option
	if opts.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return NamedImage{}, err
	}
	registry := r.Context().RegistryStr()
	if (&url.URL{Host: registry}).Hostname() == "" || strings.HasSuffix(registry, ":") {
		// ":" or ":5000" would be dialled as this host's own address, and
		// "host:" (an empty port) as another host than the one named.
		return NamedImage{}, fmt.Errorf("registry %q has no host name or an empty port", registry)
	}
	platform := opts.Platform
	if platform == "" {
		platform = "linux/" + runtime.GOARCH
	}
	plat, err := v1.ParsePlatform(platform)
	if err == nil && (plat.OS == "" || plat.Architecture == "") {
		err = errors.New("want os/architecture[/variant]")
	}
	if err != nil {
		return NamedImage{}, fmt.Errorf("platform %q: %w", platform, err)
	}

	tr := opts.Transport
	if tr == nil {
		tr = remote.DefaultTransport
	}
	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithPlatform(*plat),
		remote.WithUserAgent("den"),
		remote.WithTransport(&schemeGuard{inner: tr, insecure: opts.Insecure}),
	}
	creds := "anonymously"
	kc := &fallbackKeychain{s: s, kc: authn.DefaultKeychain}
	if opts.Username != "" || opts.Password != "" {
		creds = fmt.Sprintf("as %q", opts.Username)
		ropts = append(ropts, remote.WithAuth(&authn.Basic{Username: opts.Username, Password: opts.Password}))
	} else {
		ropts = append(ropts, remote.WithAuthFromKeychain(kc))
	}
	// explain names the registry in errors and says what went wrong with
	// authentication.
	explain := func(err error) error {
		if opts.Username == "" && opts.Password == "" && kc.found.Load() {
			creds = "with the credentials of the docker config"
		}
		var te *transport.Error
		if errors.As(err, &te) {
			switch te.StatusCode {
			case http.StatusUnauthorized:
				return fmt.Errorf("registry %s: authentication failed (pulling %s): %w", registry, creds, err)
			case http.StatusForbidden:
				return fmt.Errorf("registry %s: access denied (pulling %s): %w", registry, creds, err)
			case http.StatusNotFound:
				return fmt.Errorf("registry %s: not found: %w", registry, err)
			}
		}
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return fmt.Errorf("registry %s: %w", registry, err)
	}

	puller, err := remote.NewPuller(ropts...)
	if err != nil {
		return NamedImage{}, err
	}
	desc, err := puller.Get(ctx, r)
	if err != nil {
		return NamedImage{}, explain(err)
	}
	img, err := desc.Image() // resolves an index to the platform's image
	if err != nil {
		return NamedImage{}, explain(err)
	}
	si, err := s.remoteImage(ctx, puller, r, img)
	if err != nil {
		return NamedImage{}, explain(err)
	}
	if got := configPlatform(si.config); got != "" && (si.config.OS != plat.OS || si.config.Architecture != plat.Architecture) {
		s.logf("image: pull %s: the image is for %s, not %s", ref, got, platform)
	}
	prog := &progressState{fn: progress, layer: opts.LayerProgress}
	out, err := s.importImages(ctx, []srcImage{si}, prog, pullParallel)
	if err != nil {
		return NamedImage{}, explain(err)
	}
	return NamedImage{Name: ref, Canonical: canonicalRef(r), Image: out[0].Image}, nil
}

// remoteImage checks the manifest and config of a registry image and
// describes its layers, to be downloaded through puller.
func (s *Store) remoteImage(ctx context.Context, puller *remote.Puller, r name.Reference, img v1.Image) (srcImage, error) {
	id, err := img.Digest()
	if err != nil {
		return srcImage{}, err
	}
	m, err := img.Manifest()
	if err != nil {
		return srcImage{}, fmt.Errorf("manifest %s: %w", id, err)
	}
	if len(m.Layers) > s.maxImageLayers() {
		return srcImage{}, fmt.Errorf("image %s: more than %d layers", id, s.maxImageLayers())
	}
	if m.Config.Size > maxMetaBytes || m.Config.Digest.Algorithm != "sha256" {
		return srcImage{}, fmt.Errorf("image %s: unsupported config %s (%d bytes)", id, m.Config.Digest, m.Config.Size)
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		return srcImage{}, fmt.Errorf("image %s: config: %w", id, err)
	}
	if got := sha256Hash(rawCfg); got != m.Config.Digest {
		return srcImage{}, fmt.Errorf("image %s: config %s: content digest is %s", id, m.Config.Digest, got)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(rawCfg))
	if err != nil {
		return srcImage{}, fmt.Errorf("image %s: config: %w", id, err)
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return srcImage{}, fmt.Errorf("image %s: config has %d diffIDs for %d layers", id, len(cfg.RootFS.DiffIDs), len(m.Layers))
	}
	si := srcImage{id: id, config: cfg}
	for i, ld := range m.Layers {
		diffID := cfg.RootFS.DiffIDs[i]
		if err := checkDiffID(diffID); err != nil {
			return srcImage{}, fmt.Errorf("image %s: %w", id, err)
		}
		if ld.Digest.Algorithm != "sha256" || !isHex64(ld.Digest.Hex) || ld.Size < 0 {
			return srcImage{}, fmt.Errorf("image %s: layer %s: unsupported descriptor %s (%d bytes)", id, diffID, ld.Digest, ld.Size)
		}
		blob := r.Context().Digest(ld.Digest.String())
		si.layers = append(si.layers, srcLayer{
			diffID: diffID,
			digest: ld.Digest,
			size:   ld.Size,
			// Each download is bound to the context of its own unpack, so
			// that a failing layer stops the others at once.
			open: func(ctx context.Context) (io.ReadCloser, error) {
				l, err := puller.Layer(ctx, blob)
				if err != nil {
					return nil, err
				}
				return l.Compressed()
			},
		})
	}
	return si, nil
}

// fallbackKeychain resolves credentials with kc, and pulls anonymously
// (with a log message) if kc fails, e.g. on a broken docker config or a
// missing credential helper.
type fallbackKeychain struct {
	s     *Store
	kc    authn.Keychain
	found atomic.Bool // kc gave credentials
}

func (k *fallbackKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	a, err := k.kc.Resolve(target)
	if err != nil {
		k.s.logf("image: pull: reading the credentials for %s: %v; pulling anonymously", target.RegistryStr(), err)
		return authn.Anonymous, nil
	}
	if a != authn.Anonymous {
		k.found.Store(true)
	}
	return a, nil
}

// schemeGuard refuses plain-http requests to registries that are not on a
// loopback address, unless insecure: without it an attacker who blocks
// https to a registry on a private address could have ggcr fall back to
// http and serve anything under a tag.
type schemeGuard struct {
	inner    http.RoundTripper
	insecure bool
}

func (g *schemeGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !g.insecure && !isLoopbackHost(req.URL.Hostname()) {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("plain http to %s refused (allow it with the insecure option)", req.URL.Host)
	}
	return g.inner.RoundTrip(req)
}

func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
