package sandbox

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/build"
)

// BuildRequest describes one image build.
type BuildRequest struct {
	ContextDir string            // the unpacked build context on the host
	Dockerfile string            // path of the Dockerfile inside the context
	Tag        string            // name of the resulting image
	BuildArgs  map[string]string // ARG values
	NoCache    bool
	Timeout    time.Duration // for the whole build; RUN steps are killed when it ends
	// Network is the RUN steps' egress policy: its mode (none when unset),
	// allow names and allow_cidr ranges. COPY, ADD and WORKDIR steps never
	// have network.
	Network api.NetworkPolicy
}

// checkBuildTag checks a build's ?t=: a name an image may be stored under,
// and not one of a build's cache.
func checkBuildTag(tag string) error {
	if err := newImageName("t", tag); err != nil {
		return err
	}
	if strings.HasPrefix(tag, cachePrefix) {
		return api.FieldError("t", "%q is a name of the build cache: pick another name", tag)
	}
	return nil
}

// cachePrefix names the intermediate images of builds; they are hidden
// from image lists and reused by later builds as the layer cache.
const cachePrefix = "build-cache:"

// DefaultBuildTimeout bounds a build that sets no timeout.
const DefaultBuildTimeout = 30 * time.Minute

// Build runs a Dockerfile: every RUN executes in a fresh den sandbox made
// from the previous step's image, and COPY/ADD upload files from the
// context into one; each such step's writable layer becomes the next
// image. Steps are cached by the parent image, the instruction and the
// digest of the files they take. Progress goes to out as lines.
func (m *Manager) Build(ctx context.Context, req BuildRequest, out io.Writer) (*api.Image, error) {
	if err := checkBuildTag(req.Tag); err != nil {
		return nil, err
	}
	if err := m.checkBuildNetwork(ctx, &req.Network); err != nil {
		return nil, err
	}
	if req.Timeout <= 0 {
		req.Timeout = DefaultBuildTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, req.Timeout)
	defer cancel()
	if req.Dockerfile == "" {
		req.Dockerfile = "Dockerfile"
	}
	dfPath, err := containedPath(req.ContextDir, req.Dockerfile)
	if err != nil {
		return nil, api.FieldError("dockerfile", "%v", err)
	}
	f, err := os.Open(dfPath)
	if err != nil {
		return nil, api.FieldError("dockerfile", "no %s in the build context", req.Dockerfile)
	}
	df, err := build.ParseWith(f, build.Options{BuildArgs: req.BuildArgs, Base: func(name string) ([]string, string, error) {
		img, err := m.Image(ctx, name)
		if err != nil {
			return nil, "", fmt.Errorf("no image %q here: pull or import it first (den image pull %s)", name, name)
		}
		return img.Config.Env, img.Config.Workdir, nil
	}})
	f.Close()
	if err != nil {
		return nil, api.Errorf(api.KindInvalid, "%v", err)
	}
	start := time.Now()
	var cur *api.Image
	steps := len(df.Instructions)
	for i, ins := range df.Instructions {
		fmt.Fprintf(out, "Step %d/%d : %s\n", i+1, steps, ins.Raw)
		if ins.Cmd == "FROM" {
			cur, err = m.buildBase(ctx, ins)
			if err != nil {
				return nil, err
			}
			continue
		}
		if cur == nil {
			return nil, api.Errorf(api.KindInvalid, "Dockerfile line %d: %s before FROM", ins.Line, ins.Cmd)
		}
		next, err := m.buildStep(ctx, req, cur, ins, out)
		if err != nil {
			if ctx.Err() == context.DeadlineExceeded {
				return nil, api.Errorf(api.KindInvalid, "Dockerfile line %d: the build timed out after %v", ins.Line, req.Timeout)
			}
			return nil, err
		}
		cur = next
	}
	if cur == nil {
		return nil, api.Errorf(api.KindInvalid, "the Dockerfile has no FROM")
	}
	final := *cur
	final.Name, final.CreatedAt = req.Tag, time.Now().UTC()
	if final.Name == HostImage || (final.ID == "builtin:host") {
		final.Base = HostImage
	}
	final.ID = imageID(&final)
	if err := m.putImage(ctx, &final); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "Successfully built %s as %s in %v\n", shortDigest(final.ID), final.Name, time.Since(start).Round(time.Millisecond))
	m.event("", "image.build", map[string]any{"name": final.Name, "id": final.ID})
	return &final, nil
}

// buildBase resolves FROM: a local image, "host", or "scratch".
func (m *Manager) buildBase(ctx context.Context, ins *build.Instruction) (*api.Image, error) {
	if len(ins.Args) == 0 {
		return nil, api.Errorf(api.KindInvalid, "Dockerfile line %d: FROM needs an image", ins.Line)
	}
	name := ins.Args[0]
	if name == "scratch" {
		img := &api.Image{Name: "scratch"}
		img.ID = imageID(img)
		return img, nil
	}
	img, err := m.Image(ctx, name)
	if err != nil {
		return nil, api.Errorf(api.KindNotFound, "Dockerfile line %d: no image %q here: pull or import it first (den image pull %s)", ins.Line, name, name)
	}
	if img.Name == HostImage {
		img.Base = HostImage
	}
	img.ID = imageID(img)
	return img, nil
}

// buildStep applies one instruction to cur and returns the image after it.
func (m *Manager) buildStep(ctx context.Context, req BuildRequest, cur *api.Image, ins *build.Instruction, out io.Writer) (*api.Image, error) {
	next := *cur
	next.Config.Env = append([]string{}, cur.Config.Env...)
	cfg := &next.Config
	switch ins.Cmd {
	case "ARG":
		return cur, nil // substituted by the parser
	case "ENV":
		for _, kv := range ins.KV {
			cfg.Env = setEnv(cfg.Env, kv[0], kv[1])
		}
	case "LABEL":
		labels := map[string]string{}
		for k, v := range cfg.Labels {
			labels[k] = v
		}
		for _, kv := range ins.KV {
			labels[kv[0]] = kv[1]
		}
		cfg.Labels = labels
	case "USER":
		cfg.User = strings.Join(ins.Args, " ")
	case "EXPOSE":
		cfg.ExposedPorts = append(append([]string{}, cfg.ExposedPorts...), ins.Args...)
	case "CMD":
		cfg.Cmd = shellOrExec(ins)
	case "ENTRYPOINT":
		cfg.Entrypoint = shellOrExec(ins)
	case "WORKDIR", "RUN", "COPY", "ADD":
		return m.layerStep(ctx, req, cur, ins, out)
	default:
		return nil, api.Errorf(api.KindInvalid, "Dockerfile line %d: %s is not supported", ins.Line, ins.Cmd)
	}
	next.ID = imageID(&next)
	return &next, nil
}

func shellOrExec(ins *build.Instruction) []string {
	if ins.Shell {
		return []string{"/bin/sh", "-c", strings.Join(ins.Args, " ")}
	}
	return append([]string{}, ins.Args...)
}

func setEnv(env []string, k, v string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, k+"=") {
			out = append(out, kv)
		}
	}
	return append(out, k+"="+v)
}

// layerStep runs a step that changes files, in a sandbox, unless its
// result is in the cache.
func (m *Manager) layerStep(ctx context.Context, req BuildRequest, cur *api.Image, ins *build.Instruction, out io.Writer) (*api.Image, error) {
	inputs := ""
	if ins.Cmd == "COPY" || ins.Cmd == "ADD" {
		d, err := build.ContextDigest(req.ContextDir, ins)
		if err != nil {
			return nil, api.Errorf(api.KindInvalid, "%v", err)
		}
		inputs = d
	}
	if ins.Cmd == "RUN" && networked(req.Network) {
		// As BuildKit keys an exec by its network mode (and not by its
		// proxy settings), a RUN with network is keyed by the mode, not
		// the allow lists; one without keeps the key it always had.
		inputs = "network " + req.Network.Mode
	}
	key := build.CacheKey(cur.ID, ins, inputs)
	cacheName := cachePrefix + key[:32]
	if o := ScopeFrom(ctx).owner(); o != "" {
		// A token's steps ran in sandboxes it controls: its cache is its own.
		cacheName = cachePrefix + o + "-" + key[:32]
	}
	if !req.NoCache {
		if img, err := m.Image(ctx, cacheName); err == nil && img.ID != "" {
			fmt.Fprintf(out, " ---> using cache %s\n", shortDigest(img.ID))
			return img, nil
		}
	}
	// The parent must be an image record a sandbox can start from.
	parent := cur
	if cur.Name == "scratch" || m.imageChanged(ctx, cur) {
		p := *cur
		p.Name = cachePrefix + "base-" + strings.TrimPrefix(cur.ID, "sha256:")[:32]
		if _, err := m.Image(ctx, p.Name); err != nil {
			if err := m.putImage(ctx, &p); err != nil {
				return nil, err
			}
		}
		parent = &p
	}
	creq := api.CreateRequest{Image: parent.Name, Labels: map[string]string{"den.build": req.Tag}}
	if ins.Cmd == "RUN" && networked(req.Network) {
		creq.Network = &req.Network
	}
	sb, err := m.Create(ctx, creq)
	if err != nil {
		return nil, fmt.Errorf("Dockerfile line %d: start a build sandbox: %w", ins.Line, err)
	}
	defer m.Remove(context.WithoutCancel(ctx), sb.ID, true)
	switch ins.Cmd {
	case "WORKDIR":
		dir := strings.Join(ins.Args, " ")
		if !path.IsAbs(dir) {
			dir = path.Join(orRoot(cur.Config.Workdir), dir)
		}
		if err := m.runStep(ctx, sb.ID, cur, ins, []string{"mkdir", "-p", dir}, "/", "root", "", out); err != nil {
			return nil, err
		}
		cur = withConfig(cur, func(c *api.ImageConfig) { c.Workdir = dir })
	case "RUN":
		argv := append([]string{}, ins.Args...)
		if ins.Shell {
			argv = []string{"/bin/sh", "-c", strings.Join(ins.Args, " ")}
		}
		if err := m.runStep(ctx, sb.ID, cur, ins, argv, orRoot(cur.Config.Workdir), cur.Config.User, req.Network.Mode, out); err != nil {
			return nil, err
		}
	case "COPY", "ADD":
		if err := m.copyStep(ctx, sb.ID, req.ContextDir, cur, ins); err != nil {
			return nil, err
		}
	}
	img, err := m.Commit(ctx, sb.ID, api.CommitRequest{Name: cacheName, Config: &cur.Config})
	if err != nil {
		return nil, fmt.Errorf("Dockerfile line %d: %w", ins.Line, err)
	}
	fmt.Fprintf(out, " ---> %s\n", shortDigest(img.ID))
	return img, nil
}

func orRoot(dir string) string {
	if dir == "" {
		return "/"
	}
	return dir
}

func withConfig(img *api.Image, f func(*api.ImageConfig)) *api.Image {
	n := *img
	n.Config.Env = append([]string{}, img.Config.Env...)
	f(&n.Config)
	n.ID = imageID(&n)
	return &n
}

// imageChanged reports whether cur differs from the stored image of its
// name (a config-only step made it), so it must be stored before use.
func (m *Manager) imageChanged(ctx context.Context, cur *api.Image) bool {
	stored, err := m.Image(ctx, cur.Name)
	if err != nil {
		return true
	}
	if cur.Name == HostImage {
		return len(cur.Config.Env) > 0 || cur.Config.Workdir != "" || cur.Config.User != ""
	}
	return imageID(stored) != cur.ID
}

// runStep runs one RUN (or WORKDIR's mkdir) and fails on a non-zero exit;
// netMode is the step's network mode, for what a failure says about it.
func (m *Manager) runStep(ctx context.Context, id string, cur *api.Image, ins *build.Instruction, argv []string, dir, user, netMode string, out io.Writer) error {
	// ARG values reach RUN as environment variables, as with docker build.
	req := api.ExecRequest{Cmd: argv, Env: append(append([]string{}, ins.BuildArgs...), cur.Config.Env...), Workdir: dir, User: user}
	if dl, ok := ctx.Deadline(); ok {
		req.Timeout = api.Duration(time.Until(dl))
	}
	var tail stepTail
	st, err := m.Exec(ctx, id, req, func(typ byte, p []byte) error {
		if typ == api.FrameStdout || typ == api.FrameStderr {
			out.Write(p)
			tail.Write(p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("Dockerfile line %d: %w", ins.Line, err)
	}
	switch {
	case st.Reason == api.ReasonTimeout:
		return api.Errorf(api.KindInvalid, "Dockerfile line %d: %s was stopped by the build timeout", ins.Line, ins.Cmd)
	case st.ExitCode != 0:
		msg := fmt.Sprintf("exited with code %d", st.ExitCode)
		if st.Error != "" {
			msg = st.Error
		} else if st.Reason != api.ReasonExited {
			msg = fmt.Sprintf("ended: %s %s", st.Reason, st.Signal)
		}
		if netMode != "" {
			if hint := buildNetworkHint(netMode, string(tail.buf), st.Denied); hint != "" {
				msg += ": " + hint
			}
		}
		return api.Errorf(api.KindInvalid, "Dockerfile line %d: %s %s", ins.Line, strings.Join(argv, " "), msg)
	}
	return nil
}

// copyStep sends a COPY/ADD's sources from the context into the sandbox.
func (m *Manager) copyStep(ctx context.Context, id, contextDir string, cur *api.Image, ins *build.Instruction) error {
	if len(ins.Args) < 2 {
		return api.Errorf(api.KindInvalid, "Dockerfile line %d: %s needs a source and a destination", ins.Line, ins.Cmd)
	}
	dest := ins.Args[len(ins.Args)-1]
	if !path.IsAbs(dest) {
		slash := strings.HasSuffix(dest, "/")
		dest = path.Join(orRoot(cur.Config.Workdir), dest)
		if slash {
			dest += "/"
		}
	}
	srcs, err := build.Resolve(contextDir, ins)
	if err != nil {
		return api.Errorf(api.KindInvalid, "%v", err)
	}
	if len(srcs) == 0 {
		return api.Errorf(api.KindInvalid, "Dockerfile line %d: no source files match %v", ins.Line, ins.Args[:len(ins.Args)-1])
	}
	uid, gid := -1, -1
	if ch := ins.Flags["chown"]; ch != "" {
		u, g, _ := strings.Cut(ch, ":")
		if uid, err = strconv.Atoi(u); err != nil {
			return api.Errorf(api.KindInvalid, "Dockerfile line %d: --chown=%s: only numeric ids are supported", ins.Line, ch)
		}
		gid = uid
		if g != "" {
			if gid, err = strconv.Atoi(g); err != nil {
				return api.Errorf(api.KindInvalid, "Dockerfile line %d: --chown=%s: only numeric ids are supported", ins.Line, ch)
			}
		}
	}
	var chmod int64 = -1
	if cm := ins.Flags["chmod"]; cm != "" {
		if chmod, err = strconv.ParseInt(cm, 8, 32); err != nil {
			return api.Errorf(api.KindInvalid, "Dockerfile line %d: --chmod=%s is not an octal mode", ins.Line, cm)
		}
	}
	ag, _, err := m.Agent(ctx, id)
	if err != nil {
		return err
	}
	if ins.Cmd == "ADD" {
		// ADD unpacks local tar archives (plain or gzip) into dest, as
		// docker build does; other sources are copied.
		var rest []build.Source
		for _, src := range srcs {
			if src.Dir || !isTarName(src.Path) {
				rest = append(rest, src)
				continue
			}
			if err := m.addArchive(ctx, ag, filepath.Join(contextDir, filepath.FromSlash(src.Path)), strings.TrimSuffix(dest, "/")); err != nil {
				return fmt.Errorf("Dockerfile line %d: ADD %s: %w", ins.Line, src.Path, err)
			}
		}
		if srcs = rest; len(srcs) == 0 {
			return nil
		}
	}
	// A directory destination (trailing slash or several sources) takes
	// files by name; a single file source is renamed to dest.
	toDir := strings.HasSuffix(dest, "/") || len(srcs) > 1
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(writeBuildTar(pw, contextDir, srcs, dest, toDir, uid, gid, chmod))
	}()
	resp, err := ag.Do(ctx, "PUT", agent.PathArchive, map[string][]string{"path": {"/"}}, pr, nil)
	if err != nil {
		pr.CloseWithError(err)
		return fmt.Errorf("Dockerfile line %d: %w", ins.Line, err)
	}
	resp.Body.Close()
	return nil
}

// writeBuildTar writes the resolved sources as a tar rooted at / with
// their destination paths: a file to dest (or dest/NAME for a directory
// destination), a directory's entries beneath dest. Symlinks are sent as
// symlinks; nothing is followed.
func writeBuildTar(w io.Writer, contextDir string, srcs []build.Source, dest string, toDir bool, uid, gid int, chmod int64) error {
	tw := tar.NewWriter(w)
	add := func(rel, target string) error {
		hostPath := filepath.Join(contextDir, filepath.FromSlash(rel))
		info, err := os.Lstat(hostPath)
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(hostPath); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return nil // sockets and the like are skipped
		}
		hdr.Name = strings.TrimPrefix(path.Clean(target), "/")
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		hdr.Uid, hdr.Gid = 0, 0
		if uid >= 0 {
			hdr.Uid, hdr.Gid = uid, gid
		}
		if chmod >= 0 && !info.IsDir() && info.Mode()&fs.ModeSymlink == 0 {
			hdr.Mode = chmod
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(hostPath)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.CopyN(tw, f, hdr.Size)
			return err
		}
		return nil
	}
	base := strings.TrimSuffix(dest, "/")
	for _, src := range srcs {
		if !src.Dir {
			target := dest
			if toDir {
				target = path.Join(base, path.Base(src.Path))
			}
			if err := add(src.Path, target); err != nil {
				return err
			}
			continue
		}
		for _, e := range src.Entries[1:] {
			rel := strings.TrimPrefix(strings.TrimPrefix(e, src.Path), "/")
			if src.Path == "." {
				rel = e
			}
			if err := add(e, path.Join(base, rel)); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// containedPath joins rel to dir, refusing anything that leaves dir.
func containedPath(dir, rel string) (string, error) {
	clean := filepath.Clean("/" + rel)
	if strings.Contains(rel, "\x00") {
		return "", errors.New("NUL in path")
	}
	return filepath.Join(dir, clean), nil
}

// MaxBuildContext bounds an uploaded build context.
const MaxBuildContext = 4 << 30

// BuildFromTar unpacks an uploaded build context (a tar stream) into a
// private temporary directory and builds it.
func (m *Manager) BuildFromTar(ctx context.Context, r io.Reader, req BuildRequest, out io.Writer) (*api.Image, error) {
	if err := checkBuildTag(req.Tag); err != nil {
		return nil, err // before reading the context
	}
	if err := m.checkBuildNetwork(ctx, &req.Network); err != nil {
		return nil, err
	}
	if err := m.mayAdd(ctx, boundImages); err != nil {
		return nil, err
	}
	tmp := filepath.Join(m.cfg.DataDir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(tmp, "build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	lr := &io.LimitedReader{R: r, N: MaxBuildContext + 1}
	if err := agent.ExtractTar(lr, dir); err != nil {
		return nil, api.Errorf(api.KindInvalid, "build context: %v", err)
	}
	if lr.N <= 0 {
		return nil, api.Errorf(api.KindTooLarge, "build context over %d bytes: add a .dockerignore", int64(MaxBuildContext))
	}
	req.ContextDir = dir
	return m.Build(ctx, req, out)
}

// BuildDebian makes a minimal Debian image with mmdebstrap from the host's
// configured Debian mirror.
func (m *Manager) BuildDebian(ctx context.Context, suite, tag string, out io.Writer) (*api.Image, error) {
	if !validSuite(suite) {
		return nil, api.FieldError("debian", "%q is not a Debian suite name like bookworm", suite)
	}
	if err := newImageName("t", tag); err != nil {
		return nil, err
	}
	mm, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return nil, api.Errorf(api.KindUnsupported, "mmdebstrap is not installed on the daemon's host: apt-get install mmdebstrap")
	}
	tmp := filepath.Join(m.cfg.DataDir, "tmp")
	os.MkdirAll(tmp, 0o700)
	dir, err := os.MkdirTemp(tmp, "debian-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "root")
	cmd := exec.CommandContext(ctx, mm, "--mode=root", "--variant=minbase", "--format=directory", suite, root)
	cmd.Stdout, cmd.Stderr = out, out
	fmt.Fprintf(out, "Running %s\n", strings.Join(cmd.Args, " "))
	if err := cmd.Run(); err != nil {
		return nil, api.Errorf(api.KindInvalid, "mmdebstrap %s: %v", suite, err)
	}
	diffID, size, err := m.imgs.layers.AddLayerFromDir(ctx, root)
	if err != nil {
		return nil, err
	}
	img := &api.Image{
		Name: tag, Layers: []string{diffID}, Size: size, CreatedAt: time.Now().UTC(),
		Config: api.ImageConfig{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, Cmd: []string{"/bin/bash"},
			Labels: map[string]string{"org.opencontainers.image.base.name": "debian:" + suite}},
	}
	img.ID = imageID(img)
	if err := m.putImage(ctx, img); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "Successfully built %s as %s\n", shortDigest(img.ID), tag)
	m.event("", "image.build", map[string]any{"name": tag, "id": img.ID, "debian": suite})
	return img, nil
}

func validSuite(s string) bool {
	return wordOK(s, 32, "-", true)
}

func isTarName(p string) bool {
	for _, ext := range []string{".tar", ".tar.gz", ".tgz"} {
		if strings.HasSuffix(strings.ToLower(p), ext) {
			return true
		}
	}
	return false
}

// addArchive unpacks a local tar (gzip or not) into dir in the sandbox;
// the agent refuses entries that would leave dir.
func (m *Manager) addArchive(ctx context.Context, ag *agent.Client, file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	var r io.Reader = f
	br := bufio.NewReader(f)
	r = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	}
	resp, err := ag.Do(ctx, "PUT", agent.PathArchive, map[string][]string{"path": {dir}}, r, nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}
