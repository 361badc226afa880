// Package e2e sets up den for end-to-end tests: the den binary, built once
// per test process (for tests that run den as a command: den serve, den
// mcp, the CLI as another user), and a daemon stack in the test process
// (SQLite, the image store, the linux runtime, the sandbox manager and the
// API server on a unix socket), as den serve assembles it. The tests of
// cmd/den, internal/server, internal/mcp and internal/sshgw use it.
//
// A test binary that starts a Stack must hand the runtime's re-exec to
// linux.Init in its TestMain (linux.IsInit), as den's main does.
package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/isolate/linux"
	"github.com/den-dev/den/internal/sandbox"
	"github.com/den-dev/den/internal/server"
	"github.com/den-dev/den/internal/store"
)

var denBin struct {
	once sync.Once
	path string
	err  error
}

// DenBinary builds den (CGO_ENABLED=0, as it ships) once per test process
// into a directory any user may read, so tests can run it as another user.
// RemoveDenBinary, from TestMain after m.Run, removes it.
func DenBinary(t testing.TB) string {
	t.Helper()
	denBin.once.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		dir, err := os.MkdirTemp("", "den-e2e-bin-")
		if err != nil {
			denBin.err = err
			return
		}
		os.Chmod(dir, 0o755)
		denBin.path = filepath.Join(dir, "den")
		cmd := exec.Command(goTool, "build", "-o", denBin.path, "github.com/den-dev/den/cmd/den")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			denBin.err = fmt.Errorf("go build den: %v\n%s", err, out)
		}
	})
	if denBin.err != nil {
		t.Fatal(denBin.err)
	}
	return denBin.path
}

// RemoveDenBinary removes what DenBinary built, if it built anything.
func RemoveDenBinary() {
	if denBin.path != "" {
		os.RemoveAll(filepath.Dir(denBin.path))
	}
}

// Stack is a den daemon in the test process, serving the API as the
// admin on the unix socket Sock.
type Stack struct {
	Data    string // the data directory
	Run     string // the linux runtime's run directory
	DB      *store.DB
	Images  *image.Store
	Runtime *linux.Runtime
	// Config is what Start gives sandbox.New: a test may set its other
	// fields (WarmPool, Storage, Tiers...) before Start. Open fills in
	// DataDir, Runtime, Store, Images, Log (discarding) and Defaults
	// (512 MiB of memory, 512 pids).
	Config sandbox.Config

	// Set by Start.
	Manager *sandbox.Manager
	Server  *server.Server
	Sock    string
	Admin   *client.Client // the admin, over Sock
	http    *http.Server
}

var runSeq struct {
	sync.Mutex
	n int
}

// Open prepares a stack in data: its store, image store and linux runtime
// with rc (its run directory is /run/den-e2e/NAME-PID-N, its cgroup
// den-e2e, unless rc says); Start starts it.
func Open(data, name string, rc linux.Config) (*Stack, error) {
	runSeq.Lock()
	runSeq.n++
	n := runSeq.n
	runSeq.Unlock()
	s := &Stack{Data: data, Run: fmt.Sprintf("/run/den-e2e/%s-%d-%d", name, os.Getpid(), n), Sock: filepath.Join(data, "den.sock")}
	var err error
	if s.DB, err = store.Open(filepath.Join(data, "den.db")); err != nil {
		return nil, err
	}
	if s.Images, err = image.NewStore(filepath.Join(data, "images")); err != nil {
		s.DB.Close()
		return nil, err
	}
	if rc.RunDir == "" {
		rc.RunDir = s.Run
	}
	s.Run = rc.RunDir
	if rc.CgroupName == "" {
		rc.CgroupName = "den-e2e"
	}
	if s.Runtime, err = linux.New(rc); err != nil {
		s.DB.Close()
		return nil, err
	}
	s.Config = sandbox.Config{DataDir: data, Runtime: s.Runtime, Store: s.DB, Images: s.Images,
		Log: slog.New(slog.DiscardHandler), Defaults: api.Limits{Memory: 512 << 20, Pids: 512}}
	return s, nil
}

// New opens a stack in a temporary directory for t, lets setup (if not
// nil) change it, starts it, and closes it when t ends, before what setup
// registered with t.Cleanup. It skips t
// without root, which the linux runtime needs.
func New(t testing.TB, name string, setup func(*Stack)) *Stack {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("end-to-end tests run a real daemon, which needs root (CI runs them as root)")
	}
	s, err := Open(t.TempDir(), name, linux.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// What setup makes (and cleans up) outlives the stack: its clean-up
	// runs after the stack's.
	set := false
	defer func() {
		if !set {
			s.Close() // setup failed the test
		}
	}()
	if setup != nil {
		setup(s)
	}
	set = true
	t.Cleanup(s.Close)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return s
}

// Start starts the sandbox manager with Config and serves the API on Sock
// as the admin; after Stop it starts them again, as a restarted den serve.
func (s *Stack) Start() error {
	m, err := sandbox.New(context.Background(), s.Config)
	if err != nil {
		return err
	}
	s.Manager = m
	s.Server = server.New(m, s.DB, s.Config.Log, "test", s.Runtime.CgroupVersion())
	os.Remove(s.Sock)
	ln, err := net.Listen("unix", s.Sock)
	if err != nil {
		m.Close()
		return err
	}
	s.http = &http.Server{Handler: server.AsAdmin(s.Server)}
	go s.http.Serve(ln)
	s.Admin = client.New("unix://" + s.Sock)
	return nil
}

// Stop stops serving and closes the manager; sandboxes keep running, as
// when den serve stops.
func (s *Stack) Stop() {
	if s.http == nil {
		return // not running
	}
	s.http.Close()
	s.http = nil
	s.Manager.Close()
}

// Close removes every sandbox, stops the stack, closes the store and
// removes the run directory (a mount of the runtime's own).
func (s *Stack) Close() {
	if s.http != nil {
		ctx := context.Background()
		all, _ := s.Manager.List(ctx, nil)
		for _, sb := range all {
			s.Manager.Remove(ctx, sb.ID, true)
		}
		s.Stop()
	}
	s.DB.Close()
	UnmountRunDir(s.Run)
}

// UnmountRunDir removes a test daemon's run directory, which a runtime
// made a mount of its own.
func UnmountRunDir(dir string) {
	syscall.Unmount(dir, syscall.MNT_DETACH)
	os.RemoveAll(dir)
}

// BusyboxImage builds through c the image "busybox": the host's busybox
// as /bin/busybox and /bin/sh, and an /etc/passwd naming root and nobody;
// a tiny image, so that tests (of the microvm tier above all) do not turn
// the host's /usr into a disk image. It skips t where busybox is not
// installed.
func BusyboxImage(t testing.TB, c *client.Client) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox not installed (apt-get install busybox-static)")
	}
	bin, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"Dockerfile": []byte("FROM scratch\nCOPY busybox /bin/busybox\nCOPY busybox /bin/sh\nCOPY passwd /etc/passwd\n"),
		"busybox":    bin,
		"passwd":     []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"),
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, data := range files {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg})
		tw.Write(data)
	}
	tw.Close()
	if _, err := c.BuildImage(context.Background(), &buf, client.BuildOptions{Tag: "busybox"}, nil); err != nil {
		t.Fatal(err)
	}
	return "busybox"
}
