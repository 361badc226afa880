package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/fuzztest"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/storage"
)

// FuzzNetworkPolicy decodes arbitrary network policies as a create or
// network request carries them and checks the egress policy den makes of
// an accepted one: it validates, its CIDRs are masked and zone-free, and
// written back as a request it converts to an equal policy.
func FuzzNetworkPolicy(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"mode":"allow","allow":["*.example.com","API.example.com."],"deny":["bad.example.com"]}`,
		`{"mode":"open","allow_cidr":["10.0.0.1","10.1.2.3/8","fe80::1%eth0/64","::ffff:1.2.3.4/128"]}`,
		`{"mode":"allow","conn_rate":2.5,"max_egress":"1g","bandwidth":"8k"}`, `{"bandwidth":"1k"}`, `{"conn_rate":-1}`,
		`{"mode":"allow","secret_headers":[{"host":"api.example.com","header":"authorization","value":"Bearer ${T}"}]}`,
		`{"mode":"allow","secret_headers":[{"host":"*.x.com","header":"Host","value":"v"}]}`, `{"mode":"bogus"}`, `{"allow":["1.2.3.4"]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var p api.NetworkPolicy
		if json.Unmarshal(body, &p) != nil {
			return
		}
		pol, err := toPolicy(p)
		if err != nil {
			if api.KindOf(err) != api.KindInvalid {
				t.Fatalf("%s: %v is not an invalid-request error", body, err)
			}
			return
		}
		if err := pol.Validate(); err != nil {
			t.Fatalf("%s: accepted, but the policy does not validate: %v", body, err)
		}
		back := api.NetworkPolicy{Mode: string(pol.Mode), Allow: pol.Allow, Deny: pol.Deny, ConnRate: pol.ConnRate, MaxEgress: api.Size(pol.MaxEgressBytes), Bandwidth: p.Bandwidth}
		for _, c := range pol.AllowCIDR {
			if c != c.Masked() || c.Addr().Zone() != "" {
				t.Fatalf("%s: allow_cidr %s is not masked or has a zone", body, c)
			}
			back.AllowCIDR = append(back.AllowCIDR, c.String())
		}
		for _, sh := range pol.Secrets {
			back.SecretHeaders = append(back.SecretHeaders, api.SecretHeader{Host: sh.Host, Header: sh.Header, Value: sh.Value})
		}
		again, err := toPolicy(back)
		if err != nil || !reflect.DeepEqual(again, pol) {
			t.Fatalf("%s: policy %#v written back as %+v gives %#v, %v", body, pol, back, again, err)
		}
	})
}

// noRuntime starts nothing: snapshot loading never boots a sandbox.
type noRuntime struct{}

func (noRuntime) Name() string { return "none" }
func (noRuntime) Start(context.Context, *isolate.Spec) (isolate.Box, error) {
	return nil, api.Errorf(api.KindConflict, "the fuzz runtime starts nothing")
}
func (noRuntime) Destroy(context.Context, *isolate.Spec) error { return nil }

// snapshotArchive builds a snapshot archive of the host image with one
// writable layer holding files, optionally with a manifest that does not
// match it.
func snapshotArchive(t testing.TB, files map[string]string, name string, lie bool) []byte {
	dir := t.TempDir()
	upper := filepath.Join(dir, "upper")
	for p, body := range files {
		p = filepath.Join(upper, "rw", p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var layer bytes.Buffer
	if err := image.WriteTree(context.Background(), &layer, filepath.Join(upper, "rw")); err != nil {
		t.Fatal(err)
	}
	if lie {
		os.WriteFile(filepath.Join(upper, "rw", "extra"), []byte("not in the layer"), 0o644)
	}
	man, err := storage.BuildManifest(context.Background(), upper)
	if err != nil {
		t.Fatal(err)
	}
	manJSON, _ := json.Marshal(man)
	meta, _ := json.Marshal(archiveMeta{Version: snapshotArchiveVersion, Snapshot: api.Snapshot{ID: "x", Name: name, Image: HostImage}})
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range []struct {
		name string
		b    []byte
	}{{"den-snapshot.json", meta}, {"manifest.json", manJSON}, {"upper/rw.tar", layer.Bytes()}} {
		tarBytes(tw, e.name, e.b)
	}
	tw.Close()
	return b.Bytes()
}

// FuzzLoadSnapshot feeds arbitrary snapshot archives (a host's upload of
// one made elsewhere) to LoadSnapshot and checks that a refusal is an
// invalid-request or conflict error, never an internal one; that nothing is
// written outside the daemon's data directory, whatever names, links or
// layers the archive holds; that no half-loaded snapshot is left behind;
// and that a loaded snapshot is recorded without saved memory.
func FuzzLoadSnapshot(f *testing.F) {
	jail := fuzztest.NewJail(f, "data", true)
	m := bootlessManager(f, jail.Dest)
	f.Add(snapshotArchive(f, map[string]string{"a": "x", "d/b": "y"}, "s1", false))
	f.Add(snapshotArchive(f, map[string]string{"a": "x"}, "", true))
	f.Add(snapshotArchive(f, map[string]string{"a": "x"}, "../../bad", false))
	for _, s := range fuzztest.EscapeTars(f, "rw") {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		meta, _ := json.Marshal(archiveMeta{Version: snapshotArchiveVersion, Snapshot: api.Snapshot{Image: HostImage}})
		tarBytes(tw, "den-snapshot.json", meta)
		tarBytes(tw, "manifest.json", []byte(`{}`))
		tarBytes(tw, "upper/rw.tar", s)
		tarBytes(tw, "upper/../../x.tar", s)
		tw.Close()
		f.Add(b.Bytes())
	}
	// The seeds reach both ends: the honest archive loads, the one whose
	// manifest names a file its layer lacks is refused.
	if _, err := m.LoadSnapshot(context.Background(), bytes.NewReader(snapshotArchive(f, map[string]string{"a": "x"}, "", false))); err != nil {
		f.Fatalf("load the seed archive: %v", err)
	}
	if _, err := m.LoadSnapshot(context.Background(), bytes.NewReader(snapshotArchive(f, map[string]string{"a": "x"}, "", true))); api.KindOf(err) != api.KindInvalid {
		f.Fatalf("load an archive failing its manifest: %v, want an invalid-request error", err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx := context.Background()
		snap, err := m.LoadSnapshot(ctx, bytes.NewReader(data))
		if err != nil {
			if k := api.KindOf(err); k != api.KindInvalid && k != api.KindConflict && k != api.KindTooLarge {
				t.Fatalf("refused with a %s error: %v", k, err)
			}
		} else {
			got, gerr := m.snaps.get(ctx, snap.ID)
			if gerr != nil || got.Memory || got.MemorySize != 0 {
				t.Fatalf("loaded snapshot %s: %+v, %v", snap.ID, got, gerr)
			}
		}
		ents, _ := os.ReadDir(m.snaps.root())
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".load") {
				t.Fatalf("a half-loaded snapshot %s is left in %s", e.Name(), m.snaps.root())
			}
		}
		jail.Check(t)
	})
}
