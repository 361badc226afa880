package server_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/api"
)

func tarOf(t *testing.T, files map[string]string) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		mode := int64(0o644)
		if strings.HasSuffix(name, ".sh") || strings.HasPrefix(body, "\x7fELF") {
			mode = 0o755
		}
		tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(body)), ModTime: time.Unix(1700000000, 0)})
		tw.Write([]byte(body))
	}
	tw.Close()
	return &buf
}

// build posts a context and returns the image (or error) and the output.
func (e *env) build(t *testing.T, query string, files map[string]string) (*api.Image, *api.Error, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", e.sock)
	}}}
	req, _ := http.NewRequest("POST", "http://den/v1/images/build?"+query, tarOf(t, files))
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Stream string     `json:"stream"`
			Image  *api.Image `json:"image"`
			Error  *api.Error `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("bad build line %q", sc.Text())
		}
		out.WriteString(line.Stream)
		if line.Image != nil || line.Error != nil {
			return line.Image, line.Error, out.String()
		}
	}
	t.Fatalf("build stream ended without a result: %q", out.String())
	return nil, nil, ""
}

func TestCommit(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{Env: []string{"MODE=committed"}})
	e.sh(t, sb.ID, "mkdir -p /opt/app && echo v1 > /opt/app/version && printf '#!/bin/sh\\necho tool\\n' > /usr/local/bin/mytool && chmod +x /usr/local/bin/mytool && rm -f /etc/motd")
	status, b := e.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/commit", strings.NewReader(`{"name":"snap"}`))
	var img api.Image
	if status != 201 || json.Unmarshal(b, &img) != nil || img.Base != "host" || len(img.Layers) != 1 || len(img.MountLayers["/usr"]) != 1 {
		t.Fatalf("commit: %d %s", status, b)
	}
	child := e.create(t, api.CreateRequest{Image: "snap"})
	r := e.sh(t, child.ID, "cat /opt/app/version; mytool; echo $MODE; test -e /etc/motd && echo motd || echo nomotd")
	if string(r.Stdout) != "v1\ntool\ncommitted\nnomotd\n" {
		t.Fatalf("sandbox from the commit: %q %q", r.Stdout, r.Stderr)
	}
	// The parent's further changes do not reach the image.
	e.sh(t, sb.ID, "echo v2 > /opt/app/version")
	if r := e.sh(t, child.ID, "cat /opt/app/version"); string(r.Stdout) != "v1\n" {
		t.Fatalf("image changed under its sandbox: %q", r.Stdout)
	}
	// A name in use by a sandbox is not replaced.
	if status, _ := e.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/commit", strings.NewReader(`{"name":"snap"}`)); status != 409 {
		t.Fatalf("commit over a used name: %d", status)
	}
	if status, _ := e.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/commit", strings.NewReader(`{"name":"Bad Name"}`)); status != 400 {
		t.Fatalf("bad name: %d", status)
	}
	wantKind(t, e.c.RemoveImage(ctx, "snap"), api.KindConflict)
}

func TestBuild(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	files := map[string]string{
		"Dockerfile": `# a small app
FROM host
ARG GREETING=hello
ENV APP=/app \
    PATH=/app/bin:$PATH
WORKDIR /app
COPY src/ ./src/
COPY run.sh bin/run
RUN echo "$GREETING from $(pwd)" > /app/greeting && ls src
USER nobody
EXPOSE 8080
CMD ["run"]
`,
		"src/a.txt":     "a",
		"src/sub/b.txt": "b",
		"run.sh":        "#!/bin/sh\necho running as $(id -un) in $APP\n",
		".dockerignore": "secret.txt\n",
		"secret.txt":    "nope",
	}
	var vendored bytes.Buffer
	tw := tar.NewWriter(&vendored)
	tw.WriteHeader(&tar.Header{Name: "lib/vendored.txt", Mode: 0o644, Size: 3})
	tw.Write([]byte("lib"))
	tw.Close()
	files["vendor.tar"] = vendored.String()
	files["Dockerfile"] += "ADD vendor.tar /opt/vendor/\n"
	img, berr, out := e.build(t, "t=app&build-arg=GREETING=hi", files)
	if berr != nil {
		t.Fatalf("build: %v\n%s", berr, out)
	}
	c := img.Config
	if img.Name != "app" || c.Workdir != "/app" || c.User != "nobody" || len(c.Cmd) != 1 || c.Cmd[0] != "run" || len(c.ExposedPorts) != 1 {
		t.Fatalf("image: %+v", img)
	}
	if !strings.Contains(out, "Step 11/11") || !strings.Contains(out, "a.txt") {
		t.Fatalf("build output: %q", out)
	}
	sb := e.create(t, api.CreateRequest{Image: "app"})
	r := e.sh(t, sb.ID, "cat /app/greeting; cat src/a.txt src/sub/b.txt; echo; run; ls /app/secret.txt 2>&1 | grep -c 'No such'; cat /opt/vendor/lib/vendored.txt")
	if string(r.Stdout) != "hi from /app\nab\nrunning as nobody in /app\n1\nlib" {
		t.Fatalf("sandbox from the build: %q %q", r.Stdout, r.Stderr)
	}
	// Nothing changed: every step comes from the cache, quickly.
	start := time.Now()
	_, berr, out = e.build(t, "t=app2&build-arg=GREETING=hi", files)
	if berr != nil || strings.Count(out, "using cache") != 5 {
		t.Fatalf("rebuild: %v %q", berr, out)
	}
	t.Logf("cached rebuild took %v", time.Since(start))
	// Changing one input reruns that step and what follows only.
	files["run.sh"] = "#!/bin/sh\necho v2\n"
	_, berr, out = e.build(t, "t=app3&build-arg=GREETING=hi", files)
	if berr != nil || strings.Count(out, "using cache") != 2 || !strings.Contains(out, "Step 11/11 : ADD vendor.tar /opt/vendor/\n --->") {
		t.Fatalf("partial rebuild: %v %q", berr, out)
	}
	// Errors name the line.
	for df, want := range map[string]string{
		"FROM host\nRUN true\nHEALTHCHECK CMD true\n": "line 3",
		"FROM host\nRUN exit 3\n":                     "line 2",
		"FROM nosuchimage\n":                          "nosuchimage",
		"RUN true\n":                                  "FROM",
	} {
		_, berr, out := e.build(t, "t=bad", map[string]string{"Dockerfile": df})
		if berr == nil || !strings.Contains(berr.Message, want) {
			t.Fatalf("%q: error %v, want one naming %q (%s)", df, berr, want, out)
		}
	}
	// A RUN that never ends is stopped by the build timeout.
	start = time.Now()
	_, berr, _ = e.build(t, "t=slow&timeout=2s", map[string]string{"Dockerfile": "FROM host\nRUN sleep 1000\n"})
	if berr == nil || !strings.Contains(berr.Message, "timed out") || !strings.Contains(berr.Message, "line 2") || time.Since(start) > 20*time.Second {
		t.Fatalf("endless RUN: %v after %v", berr, time.Since(start))
	}
	// Build sandboxes are gone; the cache is pruned when asked.
	if list, _ := e.c.List(ctx, map[string]string{"den.build": "app"}); len(list) != 0 {
		t.Fatalf("%d build sandboxes left", len(list))
	}
	status, b := e.raw(t, "POST", "/v1/images/prune", nil)
	var pr struct {
		Images []string `json:"images"`
		Layers int      `json:"layers"`
	}
	if status != 200 || json.Unmarshal(b, &pr) != nil || len(pr.Images) == 0 {
		t.Fatalf("prune: %d %s", status, b)
	}
	// The tagged images survive a prune.
	sb2 := e.create(t, api.CreateRequest{Image: "app3"})
	if r := e.sh(t, sb2.ID, "run"); string(r.Stdout) != "v2\n" {
		t.Fatalf("after prune: %q %q", r.Stdout, r.Stderr)
	}
}

// The Debian base needs mmdebstrap and the host's Debian mirror (the one
// scripts/deps.sh installs packages from); DEN_TEST_DEBIAN=0 skips it.
func TestDebianBase(t *testing.T) {
	if os.Getenv("DEN_TEST_DEBIAN") == "0" {
		t.Skip("DEN_TEST_DEBIAN=0")
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Skip("mmdebstrap is not installed (apt-get install mmdebstrap; scripts/deps.sh does)")
	}
	e := newEnv(t)
	img, berr, out := e.build(t, "t=debian&debian=bookworm", nil)
	if berr != nil {
		t.Fatalf("debian: %v\n%s", berr, out)
	}
	sb := e.create(t, api.CreateRequest{Image: img.Name})
	r := e.sh(t, sb.ID, ". /etc/os-release; echo $VERSION_CODENAME; dpkg -l | grep -c '^ii'")
	if !strings.HasPrefix(string(r.Stdout), "bookworm\n") {
		t.Fatalf("debian sandbox: %q %q", r.Stdout, r.Stderr)
	}
	t.Logf("debian image: %d bytes, %s packages", img.Size, strings.TrimSpace(strings.Split(string(r.Stdout), "\n")[1]))
}

// An image without /etc/passwd (FROM scratch, distroless) runs as root by
// default, takes numeric users as they are, and refuses only an unknown
// user name, naming it and the image.
func TestImageWithoutPasswd(t *testing.T) { testImageWithoutPasswd(t, newEnv(t), "linux") }

// The same in the gvisor tier, whose agent runs under runsc.
func TestImageWithoutPasswdGvisor(t *testing.T) {
	e := newTierEnv(t)
	e.need(t, "gvisor")
	testImageWithoutPasswd(t, e, "gvisor")
}

func testImageWithoutPasswd(t *testing.T, e *env, runtime string) {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("needs a static /bin/busybox (Debian package busybox-static)")
	}
	ctx := context.Background()
	img, berr, out := e.build(t, "t=bare", map[string]string{
		"Dockerfile": "FROM scratch\nCOPY busybox /busybox\nRUN [\"/busybox\", \"true\"]\nRUN [\"/busybox\", \"mkdir\", \"/made-by-run\"]\n",
		"busybox":    string(bb),
	})
	if berr != nil || img == nil {
		t.Fatalf("FROM scratch build: %v\n%s", berr, out)
	}
	sb := e.create(t, api.CreateRequest{Image: "bare", Runtime: runtime})
	run := func(user string, argv ...string) (*api.ExecResult, error) {
		return e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: append([]string{"/busybox"}, argv...), User: user})
	}
	if r, err := run("", "ls", "/etc/passwd"); err != nil || r.ExitCode == 0 {
		t.Fatalf("the image has an /etc/passwd: %+v %v", r, err)
	}
	for user, want := range map[string]string{"": "0 0\n", "root": "0 0\n", "1234": "1234 1234\n", "1234:5678": "1234 5678\n"} {
		r, err := run(user, "sh", "-c", "echo $(/busybox id -u) $(/busybox id -g); /busybox ls -d /made-by-run >/dev/null")
		if err != nil || r.ExitCode != 0 || string(r.Stdout) != want {
			t.Fatalf("user %q: %+v %v, want %q", user, r, err, want)
		}
	}
	_, err = run("nosuchuser", "true")
	ae := wantKind(t, err, api.KindInvalid)
	if ae.Field != "user" || !strings.Contains(ae.Message, `"nosuchuser"`) || !strings.Contains(ae.Message, `image "bare"`) || !strings.Contains(ae.Message, "no /etc/passwd") {
		t.Fatalf("unknown user error: %+v", ae)
	}
	_, err = run("1234:nosuchgroup", "true")
	if ae := wantKind(t, err, api.KindInvalid); !strings.Contains(ae.Message, `"nosuchgroup"`) || !strings.Contains(ae.Message, `image "bare"`) {
		t.Fatalf("unknown group error: %+v", ae)
	}
}
