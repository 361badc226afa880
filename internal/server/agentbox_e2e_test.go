package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/den-dev/den/api"
)

// askCLI is an agent-style command-line tool: it sends a prompt to a model
// API and prints the answer. It has no API key and reads none: den's egress
// proxy sets the Authorization header on the way out (docs/agent-in-the-box.md).
// With --wait it stays alive afterwards, so the test can look at its
// process.
const askCLI = `#!/usr/bin/python3
import json, os, sys, time, urllib.request, urllib.error
args = sys.argv[1:]
wait = args[:1] == ["--wait"]
if wait:
    args = args[1:]
url = os.environ.get("MODEL_API_URL", "https://api.example.test:8443/v1/messages")
body = json.dumps({"model": "test-model", "max_tokens": 64,
                   "messages": [{"role": "user", "content": " ".join(args)}]}).encode()
req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=20) as r:
        answer = json.load(r)
except urllib.error.HTTPError as e:
    print("ask: the model API answered %d: %s" % (e.code, e.read().decode()), file=sys.stderr)
    sys.exit(2)
print("".join(c["text"] for c in answer["content"] if c["type"] == "text"), flush=True)
if wait:
    time.sleep(120)
`

// A fake model API that answers only requests carrying the key.
func modelAPI(key string, refused *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method != "POST" || r.URL.Path != "/v1/messages" {
			w.WriteHeader(404)
			io.WriteString(w, `{"error": {"type": "not_found"}}`)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+key {
			refused.Add(1)
			w.WriteHeader(401)
			io.WriteString(w, `{"error": {"type": "authentication_error", "message": "missing or wrong API key"}}`)
			return
		}
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
			w.WriteHeader(400)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"content": []map[string]string{
			{"type": "text", "text": "model says: " + strings.ToUpper(req.Messages[len(req.Messages)-1].Content)},
		}})
	})
}

func TestAgentInTheBox(t *testing.T) {
	e, in := newNetEnv(t)
	ctx := context.Background()
	rb := make([]byte, 16)
	rand.Read(rb)
	key := "sk-den-test-" + hex.EncodeToString(rb)
	var refused atomic.Int32
	srv := &http.Server{Handler: modelAPI(key, &refused)}
	go srv.Serve(tls.NewListener(in.listen(t, 8443), &tls.Config{Certificates: []tls.Certificate{in.cert}}))
	t.Cleanup(func() { srv.Close() })

	// den secret set MODEL_API_KEY; den create --allow api.example.test
	//   --secret-header 'api.example.test=Authorization: Bearer ${MODEL_API_KEY}'
	if status, b := e.raw(t, "PUT", "/v1/secrets/MODEL_API_KEY", strings.NewReader(key)); status != 204 {
		t.Fatalf("set the key: %d %s", status, b)
	}
	box := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{
		Mode: api.NetAllow, Allow: []string{"api.example.test"},
		SecretHeaders: []api.SecretHeader{{Host: "api.example.test", Header: "Authorization", Value: "Bearer ${MODEL_API_KEY}"}},
	}})
	// The same box without the secret header: the model refuses it, so the
	// answer above really depends on the key den adds.
	bare := e.create(t, api.CreateRequest{Network: &api.NetworkPolicy{Mode: api.NetAllow, Allow: []string{"api.example.test"}}})
	for _, id := range []string{box.ID, bare.ID} {
		if _, err := e.c.WriteFile(ctx, id, "/usr/local/bin/ask", strings.NewReader(askCLI), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run := func(id string, args ...string) *api.ExecResult {
		r, err := e.c.Exec(ctx, id, api.ExecRequest{Cmd: append([]string{"ask"}, args...), Timeout: api.Duration(40 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := run(box.ID, "hello", "from", "the", "box"); r.ExitCode != 0 || string(r.Stdout) != "model says: HELLO FROM THE BOX\n" {
		t.Fatalf("ask in the box: exit %d, %q %s", r.ExitCode, r.Stdout, r.Stderr)
	}
	// (Without interception the box sees the server's own certificate,
	// which its trust store lacks: curl -k.)
	if out, code := curl(t, e, bare.ID, "-k", "-X", "POST", "-d", `{"messages": [{"content": "hi"}]}`, "https://api.example.test:8443/v1/messages"); code != 0 || !strings.Contains(out, "authentication_error") || refused.Load() == 0 {
		t.Fatalf("the model API without the secret header: exit %d, %s (refused %d)", code, out, refused.Load())
	}

	// A CLI process that made its request and stays alive, to look at.
	e.sh(t, box.ID, "ask --wait are you there >/tmp/answer 2>&1 &")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if out := e.sh(t, box.ID, "cat /tmp/answer"); string(out.Stdout) == "model says: ARE YOU THERE\n" {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the waiting CLI did not answer: %q", out.Stdout)
		}
	}

	// The key is nowhere the sandbox can see: not in its files (its own
	// layer, and everything its root shows), not in the environment or
	// command line of any of its processes, not in the CLI's memory.
	pids := secretAbsent(t, e, box, key, 2) // the agent and the CLI
	cli := 0
	for _, pid := range pids {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); bytes.Contains(b, []byte("ask\x00--wait")) {
			cli = pid
		}
	}
	if cli == 0 {
		t.Fatalf("no CLI process among %v", pids)
	}
	if n := memoryHolds(t, cli, key); n == 0 {
		t.Fatal("read none of the CLI's memory")
	}
	root := fmt.Sprintf("/proc/%d/root", box.Pid)
	files := 0
	filepath.WalkDir(root+"/", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		switch strings.TrimPrefix(p, root) {
		case "/proc", "/sys", "/dev", "/usr": // kernel views, and the host's own read-only /usr
			return filepath.SkipDir
		}
		if info, err := d.Info(); err == nil && d.Type().IsRegular() && info.Size() < 64<<20 {
			files++
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(key)) {
				t.Errorf("the key is in the sandbox's file %s", strings.TrimPrefix(p, root))
			}
		}
		return nil
	})
	if files < 20 {
		t.Fatalf("looked at only %d files of the sandbox", files)
	}
}

// memoryHolds checks that pid's readable memory does not hold secret and
// returns how many bytes it read (from the host, as root).
func memoryHolds(t *testing.T, pid int, secret string) int64 {
	t.Helper()
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer maps.Close()
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	var total int64
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[1][0] != 'r' || (len(f) > 5 && f[5] == "[vvar]") {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end-start > 1<<30 {
			continue
		}
		buf := make([]byte, end-start)
		n, _ := mem.ReadAt(buf, int64(start))
		total += int64(n)
		if bytes.Contains(buf[:n], []byte(secret)) {
			t.Errorf("the key is in the memory of sandbox process %d (%s)", pid, sc.Text())
		}
	}
	return total
}
