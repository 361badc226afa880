package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/den-dev/den/api"
)

func TestImagePull(t *testing.T) {
	f := newFakeDaemon(t)
	r := den(t, f, "", "image", "pull", "alpine:3.20")
	if r.code != 0 || r.stdout != "alpine:3.20\n" {
		t.Fatalf("pull: %+v", r)
	}
	if !strings.Contains(r.stderr, "pull: layer sha256:aaaa: 1.00MiB / 3.00MiB (33%)") ||
		!strings.Contains(r.stderr, "pull: layer sha256:aaaa: 3.00MiB / 3.00MiB (100%)") {
		t.Errorf("pull progress on a non-terminal:\n%s", r.stderr)
	}
	r = den(t, f, "s3cret\n", "image", "pull", "--name", "app", "-u", "me", "--password-stdin", "--insecure",
		"--platform", "linux/arm64", "-q", "--json", "reg.example:5000/me/app:1")
	var img api.Image
	if r.code != 0 || r.stderr != "" || json.Unmarshal([]byte(r.stdout), &img) != nil || img.Name != "app" {
		t.Fatalf("pull --json -q: %+v", r)
	}
	want := []api.PullRequest{{Ref: "alpine:3.20"}, {Ref: "reg.example:5000/me/app:1", Name: "app", Username: "me",
		Password: "s3cret", Insecure: true, Platform: "linux/arm64"}}
	if !reflect.DeepEqual(f.pulls, want) {
		t.Errorf("pull requests %+v\nwant %+v", f.pulls, want)
	}
	r = den(t, f, "", "image", "pull", "nosuch/thing")
	if r.code != 1 || !strings.Contains(r.stderr, "den: pull nosuch/thing: manifest unknown") || r.stdout != "" {
		t.Errorf("failed pull: %+v", r)
	}
	for _, args := range [][]string{
		{"image", "pull"},
		{"image", "pull", "a", "b"},
		{"image", "pull", "--password-stdin", "a"},
	} {
		if r := den(t, f, "pw\n", args...); r.code != 2 {
			t.Errorf("%q: %+v", args, r)
		}
	}
	if r := den(t, f, "", "image", "pull", "-u", "me", "--password-stdin", "a"); r.code != 1 || !strings.Contains(r.stderr, "no password") {
		t.Errorf("--password-stdin with nothing on stdin: %+v", r)
	}
}

// mkContext makes a build context: a Dockerfile, a .dockerignore and a few
// files, some of them ignored.
func mkContext(t *testing.T, dockerfile string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range map[string]string{
		"Dockerfile":    dockerfile,
		".dockerignore": "*.log\nsecret\n!secret/keep\nDockerfile\n",
		"a.txt":         "a",
		"b.log":         "log",
		"secret/x":      "x",
		"secret/keep":   "keep",
		"sub/dir/c":     "c",
	} {
		p := filepath.Join(dir, name)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(body), 0o644))
	}
	must(t, os.Symlink("a.txt", filepath.Join(dir, "link")))
	return dir
}

func entryNames(b fakeBuild) []string {
	names := append([]string(nil), b.order...)
	sort.Strings(names)
	return names
}

func TestImageBuild(t *testing.T) {
	f := newFakeDaemon(t)
	dir := mkContext(t, "FROM host\nRUN make\nCOPY . /src")
	t.Setenv("DEN_TEST_ARG", "from-env")
	r := den(t, f, "", "image", "build", "-t", "app", "--build-arg", "A=1", "--build-arg", "DEN_TEST_ARG",
		"--build-arg", "DEN_TEST_UNSET_ARG", "--no-cache", "--timeout", "30m", dir)
	if r.code != 0 {
		t.Fatalf("build: %+v", r)
	}
	wantOut := "Step 1/3 : FROM host\nStep 2/3 : RUN make\nStep 3/3 : COPY . /src\nSuccessfully built b0b0b0b0b0b0 as app\napp sha256:b0b0b0b0b0b0b0b0\n"
	if r.stdout != wantOut || r.stderr != "" {
		t.Errorf("build output:\n%s\nstderr %q\nwant:\n%s", r.stdout, r.stderr, wantOut)
	}
	if len(f.builds) != 1 {
		t.Fatalf("%d builds", len(f.builds))
	}
	b := f.builds[0]
	if got := f.lastQuery["POST /v1/images/build"]; got != "build-arg=A%3D1&build-arg=DEN_TEST_ARG%3Dfrom-env&no-cache=true&t=app&timeout=30m0s" {
		t.Errorf("build query %q", got)
	}
	// .dockerignore leaves out b.log and secret/ except secret/keep; the
	// Dockerfile and .dockerignore go anyway (the daemon reads them).
	want := []string{".dockerignore", "Dockerfile", "a.txt", "link", "secret/keep", "sub/", "sub/dir/", "sub/dir/c"}
	if got := entryNames(b); !reflect.DeepEqual(got, want) {
		t.Errorf("context entries %q, want %q", got, want)
	}
	if b.entries["link"] != "-> a.txt" || b.entries["sub/dir/c"] != "c" || b.entries["Dockerfile"] != "FROM host\nRUN make\nCOPY . /src" {
		t.Errorf("context contents %q", b.entries)
	}

	// -q prints only the name; --json the image, the output on stderr.
	r = den(t, f, "", "image", "build", "-q", "-t", "app:2", dir)
	if r.code != 0 || r.stdout != "app:2\n" || r.stderr != "" {
		t.Errorf("build -q: %+v", r)
	}
	r = den(t, f, "", "image", "build", "--json", "-t", "app:3", dir)
	var img api.Image
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &img) != nil || img.Name != "app:3" || !strings.Contains(r.stderr, "Step 1/3 : FROM host") {
		t.Errorf("build --json: %+v", r)
	}
	if got := f.lastQuery["POST /v1/images/build"]; got != "t=app%3A3" {
		t.Errorf("build query with defaults %q", got)
	}

	// A failed step: exit 1 with the daemon's message naming the line.
	bad := mkContext(t, "FROM host\nRUN false\nRUN true")
	r = den(t, f, "", "image", "build", "-t", "bad", bad)
	if r.code != 1 || r.stderr != "den: Dockerfile line 2: RUN false: exit code 1\n" ||
		r.stdout != "Step 1/3 : FROM host\nStep 2/3 : RUN false\n" {
		t.Errorf("failed build: %+v", r)
	}
	if _, ok := f.images["bad"]; ok {
		t.Error("a failed build made an image")
	}
}

func TestImageBuildDockerfile(t *testing.T) {
	f := newFakeDaemon(t)
	dir := mkContext(t, "FROM host")
	must(t, os.MkdirAll(filepath.Join(dir, "docker"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "docker", "Dockerfile.dev"), []byte("FROM host\nRUN dev"), 0o644))
	t.Chdir(dir)

	// -f inside the context, relative to the current directory.
	r := den(t, f, "", "image", "build", "-f", "docker/Dockerfile.dev", "-t", "dev", ".")
	if r.code != 0 || !strings.Contains(r.stdout, "Step 2/2 : RUN dev") {
		t.Fatalf("build -f: %+v", r)
	}
	if got := f.lastQuery["POST /v1/images/build"]; got != "dockerfile=docker%2FDockerfile.dev&t=dev" {
		t.Errorf("build -f query %q", got)
	}

	// -f outside the context: sent under a random name that .dockerignore
	// then excludes.
	other := t.TempDir()
	must(t, os.WriteFile(filepath.Join(other, "Containerfile"), []byte("FROM host\nRUN outside"), 0o644))
	ctxDir := filepath.Join(other, "ctx")
	must(t, os.MkdirAll(ctxDir, 0o755))
	must(t, os.WriteFile(filepath.Join(ctxDir, "f"), []byte("f"), 0o644))
	r = den(t, f, "", "image", "build", "-f", filepath.Join(other, "Containerfile"), "-t", "out", ctxDir)
	if r.code != 0 || !strings.Contains(r.stdout, "Step 2/2 : RUN outside") {
		t.Fatalf("build -f outside: %+v", r)
	}
	b := f.builds[len(f.builds)-1]
	df := b.query.Get("dockerfile")
	if !regexp.MustCompile(`^\.dockerfile\.[0-9a-f]{20}$`).MatchString(df) {
		t.Errorf("dockerfile %q", df)
	}
	if got, want := entryNames(b), []string{df, ".dockerignore", "f"}; !reflect.DeepEqual(got, want) {
		t.Errorf("context entries %q, want %q", got, want)
	}
	if got := b.entries[".dockerignore"]; got != ".dockerignore\n\n/"+df+"\n" {
		t.Errorf(".dockerignore sent %q", got)
	}

	// No Dockerfile: an error before anything is sent.
	n := len(f.builds)
	empty := t.TempDir()
	if r := den(t, f, "", "image", "build", "-t", "x", empty); r.code != 1 || !strings.Contains(r.stderr, "no Dockerfile in") {
		t.Errorf("build without a Dockerfile: %+v", r)
	}
	if r := den(t, f, "", "image", "build", "-t", "x", "-f", "nosuch", "."); r.code != 1 || !strings.Contains(r.stderr, "Dockerfile") {
		t.Errorf("build -f nosuch: %+v", r)
	}
	if len(f.builds) != n {
		t.Errorf("a build without a Dockerfile reached the daemon")
	}
}

func TestImageBuildStdinAndDebian(t *testing.T) {
	f := newFakeDaemon(t)
	// DIR - : the context tar from standard input, -f inside it.
	tarball := evilTar(t) // an empty archive
	r := den(t, f, string(tarball), "image", "build", "-t", "x", "-f", "sub/Dockerfile", "-")
	if r.code != 1 || !strings.Contains(r.stderr, "dockerfile: no sub/Dockerfile in the build context") {
		t.Errorf("build - with an empty context: %+v", r)
	}
	if got := f.lastQuery["POST /v1/images/build"]; got != "dockerfile=sub%2FDockerfile&t=x" {
		t.Errorf("build - query %q", got)
	}

	r = den(t, f, "", "image", "build", "--debian", "bookworm", "-t", "debian")
	if r.code != 0 || r.stdout != "Step 1/1 : Running mmdebstrap bookworm\nSuccessfully built b0b0b0b0b0b0 as debian\ndebian sha256:b0b0b0b0b0b0b0b0\n" {
		t.Errorf("build --debian: %+v", r)
	}
	if got := f.lastQuery["POST /v1/images/build"]; got != "debian=bookworm&t=debian" {
		t.Errorf("build --debian query %q", got)
	}
	n := len(f.builds)
	for _, args := range [][]string{
		{"image", "build", "."},                                          // no -t
		{"image", "build", "-t", "x"},                                    // no DIR
		{"image", "build", "-t", "x", "a", "b"},                          // two DIRs
		{"image", "build", "--debian", "bookworm", "-t", "d", "."},       // --debian with a DIR
		{"image", "build", "--debian", "bookworm", "-t", "d", "-f", "x"}, // --debian with -f
		{"image", "build", "-t", "x", "--timeout", "soon", "."},
		{"image", "build", "-t", "x", "--build-arg", "=v", "."},
	} {
		if r := den(t, f, "", args...); r.code != 2 || !strings.HasPrefix(r.stderr, "den: ") {
			t.Errorf("%q: %+v", args, r)
		}
	}
	if len(f.builds) != n {
		t.Error("a bad command line reached the daemon")
	}
}

func TestCommit(t *testing.T) {
	f := newFakeDaemon(t)
	f.addSandbox(api.CreateRequest{Name: "box"})
	r := den(t, f, "", "commit", "box", "snap:1")
	if r.code != 0 || r.stdout != "snap:1\n" || r.stderr != "" {
		t.Fatalf("commit: %+v", r)
	}
	if !reflect.DeepEqual(f.commits, []api.CommitRequest{{Name: "snap:1"}}) || !logHas(f, "POST /v1/sandboxes/box/commit", "") {
		t.Errorf("commit requests %+v, log %q", f.commits, f.log)
	}
	r = den(t, f, "", "commit", "--json", "box", "snap:2")
	var img api.Image
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &img) != nil || img.Name != "snap:2" || img.Base != "host" {
		t.Errorf("commit --json: %+v", r)
	}
	// image inspect shows base and mount_layers.
	r = den(t, f, "", "image", "inspect", "snap:2")
	if r.code != 0 || !strings.Contains(r.stdout, `"base": "host"`) || !strings.Contains(r.stdout, `"mount_layers": {`) ||
		!strings.Contains(r.stdout, `"/usr": [`) {
		t.Errorf("image inspect of a committed image:\n%s", r.stdout)
	}
	if r := den(t, f, "", "commit", "nosuch", "x"); r.code != 1 || !strings.Contains(r.stderr, "den ls") {
		t.Errorf("commit of a missing sandbox: %+v", r)
	}
	for _, args := range [][]string{{"commit"}, {"commit", "box"}, {"commit", "box", "a", "b"}} {
		if r := den(t, f, "", args...); r.code != 2 {
			t.Errorf("%q: %+v", args, r)
		}
	}
}

func TestImageSave(t *testing.T) {
	f := newFakeDaemon(t)
	f.images["a:1"] = &api.Image{Name: "a:1", ID: "sha256:1"}
	f.images["b:2"] = &api.Image{Name: "b:2", ID: "sha256:2"}
	f.images["h"] = &api.Image{Name: "h", ID: "sha256:3", Base: "host"}
	out := filepath.Join(t.TempDir(), "imgs.tar")
	r := den(t, f, "", "image", "save", "-o", out, "a:1", "b:2")
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("save -o: %+v", r)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "OCI:a:1,b:2" {
		t.Errorf("saved %q %v", b, err)
	}
	if got := f.lastQuery["GET /v1/images/save"]; got != "name=a%3A1&name=b%3A2" {
		t.Errorf("save query %q", got)
	}
	// To standard output when it is not a terminal.
	if r := den(t, f, "", "image", "save", "a:1"); r.code != 0 || r.stdout != "OCI:a:1" {
		t.Errorf("save to stdout: %+v", r)
	}
	// An image on the host base cannot be saved, and no file is left.
	bad := filepath.Join(t.TempDir(), "bad.tar")
	if r := den(t, f, "", "image", "save", "-o", bad, "h"); r.code != 1 || !strings.Contains(r.stderr, "cannot be saved") {
		t.Errorf("save of a host-based image: %+v", r)
	}
	if entries, _ := os.ReadDir(filepath.Dir(bad)); len(entries) != 0 {
		t.Errorf("a failed save left %v", entries)
	}
	if r := den(t, f, "", "image", "save", "nope"); r.code != 1 || !strings.Contains(r.stderr, "den image ls") {
		t.Errorf("save of a missing image: %+v", r)
	}
	if r := den(t, f, "", "image", "save"); r.code != 2 {
		t.Errorf("save of nothing: %+v", r)
	}

	// Never to a terminal.
	pty := openPty(t)
	n := len(f.log)
	var errb strings.Builder
	code := run([]string{"--host", f.host, "image", "save", "a:1"}, strings.NewReader(""), pty, &errb)
	if code != 1 || !strings.Contains(errb.String(), "refusing to write an archive to a terminal") {
		t.Errorf("save to a terminal: exit %d, stderr %q", code, errb.String())
	}
	if len(f.log) != n {
		t.Error("save to a terminal asked the daemon")
	}
}

// openPty returns the controlling side of a new pseudo-terminal, or skips
// the test.
func openPty(t *testing.T) *os.File {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Skipf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Skipf("ptsname: %v", err)
	}
	s, err := os.OpenFile("/dev/pts/"+itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("open the pty: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestImagePrune(t *testing.T) {
	f := newFakeDaemon(t)
	r := den(t, f, "", "image", "prune")
	if r.code != 0 || r.stdout != "deleted den-cache/0123\ndeleted den-cache/4567\nremoved 3 unused layers\n" {
		t.Errorf("prune: %+v", r)
	}
	r = den(t, f, "", "image", "prune", "--json")
	var res struct {
		Images []string `json:"images"`
		Layers int      `json:"layers"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || res.Layers != 3 || len(res.Images) != 2 {
		t.Errorf("prune --json: %+v", r)
	}
	if r := den(t, f, "", "image", "prune", "x"); r.code != 2 {
		t.Errorf("prune x: %+v", r)
	}
	if !logHas(f, "POST /v1/images/prune", "") {
		t.Errorf("log %q", f.log)
	}
}

// TestImageBuildNetwork: --network, --allow and --allow-cidr reach the
// daemon as ?network=, ?allow=, ?allow-cidr=; bad combinations are usage
// errors naming the flags, and never reach it.
func TestImageBuildNetwork(t *testing.T) {
	f := newFakeDaemon(t)
	dir := mkContext(t, "FROM host\nRUN apt-get update")
	for _, c := range []struct {
		args  []string
		query string
	}{
		{[]string{"--network", "allow", "--allow", "deb.debian.org", "--allow", "*.pypi.org", "--allow-cidr", "203.0.113.0/24"},
			"allow=deb.debian.org&allow=%2A.pypi.org&allow-cidr=203.0.113.0%2F24&network=allow&t=app"},
		{[]string{"--allow", "deb.debian.org"}, "allow=deb.debian.org&network=allow&t=app"}, // implies allow
		{[]string{"--network", "open"}, "network=open&t=app"},
		{[]string{"--network", "none"}, "network=none&t=app"},
		{nil, "t=app"},
	} {
		r := den(t, f, "", append(append([]string{"image", "build", "-t", "app"}, c.args...), dir)...)
		if r.code != 0 {
			t.Fatalf("%q: %+v", c.args, r)
		}
		if got := f.lastQuery["POST /v1/images/build"]; got != c.query {
			t.Errorf("%q sent ?%s, want ?%s", c.args, got, c.query)
		}
	}
	n := len(f.builds)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--network", "bogus"}, "want none, allow or open"},
		{[]string{"--network", "allow"}, "--network allow needs --allow DOMAIN or --allow-cidr CIDR"},
		{[]string{"--network", "none", "--allow", "x.test"}, "--allow does not go with --network none"},
		{[]string{"--network", "none", "--allow-cidr", "10.0.0.0/8"}, "--allow-cidr does not go with --network none"},
		{[]string{"--network", "open", "--allow", "x.test"}, "--allow does not go with --network open"},
		{[]string{"--allow", "1.2.3.4"}, "use --allow-cidr"},
		{[]string{"--allow-cidr", "nope"}, "want a CIDR"},
	} {
		r := den(t, f, "", append(append([]string{"image", "build", "-t", "app"}, c.args...), dir)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%q: want exit 2 with %q, got %+v", c.args, c.want, r)
		}
	}
	if r := den(t, f, "", "image", "build", "--debian", "bookworm", "-t", "d", "--network", "open"); r.code != 2 || !strings.Contains(r.stderr, "takes no") {
		t.Errorf("--debian with --network: %+v", r)
	}
	if len(f.builds) != n {
		t.Error("a bad command line reached the daemon")
	}
	// The help names the flags.
	r := den(t, f, "", "image", "build", "-h")
	for _, flag := range []string{"--network MODE", "--allow DOMAIN", "--allow-cidr CIDR", "--network allow lets them reach"} {
		if !strings.Contains(r.stdout+r.stderr, flag) {
			t.Errorf("image build -h lacks %q", flag)
		}
	}
}
