package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/server"
)

// Every JSON endpoint refuses a body that is not an object (null, an
// array, a string, a number, a boolean) as invalid, in one place: a null
// body once made a sandbox with every default.
func TestNonObjectBodies(t *testing.T) {
	e := newEnv(t)
	call := e.call(t)
	// Control: the same route takes an object.
	if st, ae := call("POST", "/v1/sandboxes", `{}`); st != 201 {
		t.Fatalf("create with {}: %d %v", st, ae)
	}
	before, _ := e.c.List(context.Background(), nil)
	x := "/v1/sandboxes/0123456789abcdef0123456789abcdef"
	routes := [][2]string{
		{"POST", "/v1/sandboxes"}, {"POST", x + "/exec"}, {"POST", x + "/escalate"},
		{"POST", x + "/files/mkdir"}, {"POST", x + "/files/rename"}, {"POST", x + "/processes"},
		{"POST", x + "/processes/p1/kill"}, {"PUT", x + "/network"}, {"POST", x + "/ports"},
		{"POST", x + "/commit"}, {"POST", x + "/snapshots"}, {"POST", x + "/restore"},
		{"POST", x + "/fork"}, {"POST", x + "/export"}, {"POST", "/v1/volumes"},
		{"POST", "/v1/tokens"}, {"POST", "/v1/ssh-keys"}, {"POST", "/v1/images/pull"},
	}
	for _, rt := range routes {
		for _, body := range []string{`null`, ` null `, `[]`, `"x"`, `1`, `true`} {
			st, ae := call(rt[0], rt[1], body)
			if st != 400 || ae == nil || ae.Kind != api.KindInvalid || !strings.Contains(ae.Message, "not a JSON object") {
				t.Errorf("%s %s %s: %d %+v, want 400 invalid: not a JSON object", rt[0], rt[1], body, st, ae)
			}
		}
	}
	if after, _ := e.c.List(context.Background(), nil); len(after) != len(before) {
		t.Fatalf("%d sandboxes before the non-object bodies, %d after", len(before), len(after))
	}
}

// call returns a function sending a raw body to e's socket and returning
// the status and error document of the answer.
func (e *env) call(t *testing.T) func(method, path, body string) (int, *api.Error) {
	return func(method, path, body string) (int, *api.Error) {
		t.Helper()
		st, b := e.raw(t, method, path, strings.NewReader(body))
		var doc api.ErrorDoc
		json.Unmarshal(b, &doc)
		return st, doc.Error
	}
}

// vmHWM resets this process's peak resident set and returns a function
// that reads the peak since then, in bytes.
func vmHWM(t *testing.T) func() int64 {
	t.Helper()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Skipf("cannot reset the peak RSS (Linux 4.0+ /proc/self/clear_refs): %v", err)
	}
	return func() int64 {
		b, _ := os.ReadFile("/proc/self/status")
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				return kb << 10
			}
		}
		t.Fatal("no VmHWM in /proc/self/status")
		return 0
	}
}

// A scoped token cannot grow the daemon's memory with large request
// bodies: a flood of big exec bodies stays within a bound of memory
// (the daemon is this process), the token's large bodies in flight are
// bounded (busy, 429, beyond that), and its ordinary execs still run.
func TestBodyFloodBounded(t *testing.T) {
	te := newTokenEnv(t)
	ctx := context.Background()
	_, c := te.newToken(t, api.TokenRequest{Name: "flooder"})
	sb, err := c.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + strings.TrimPrefix(te.addr, "tcp://") + "/v1/sandboxes/" + sb.ID + "/exec"
	tok := c.Token
	post := func(body io.Reader, n int64) (int, *api.Error, error) {
		req, _ := http.NewRequest("POST", url, body)
		req.ContentLength = n
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		var doc api.ErrorDoc
		json.NewDecoder(resp.Body).Decode(&doc)
		return resp.StatusCode, doc.Error, nil
	}

	// 1. Sixteen parallel 32 MiB bodies (the environment of one exec):
	// the daemon's peak RSS grows by less than 256 MiB. (Before the bound,
	// each was buffered, decoded and passed on whole: gigabytes.)
	big := []byte(`{"cmd":["true"],"env":["A=` + strings.Repeat("a", 32<<20) + `"]}`)
	runtime.GC()
	debug.FreeOSMemory()
	peak := vmHWM(t)
	base := peak()
	var wg sync.WaitGroup
	statuses := make(chan int, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, _, err := post(bytes.NewReader(big), int64(len(big)))
			if err != nil {
				st = -1 // the daemon may close the connection of a body it refused unread
			}
			statuses <- st
		}()
	}
	wg.Wait()
	close(statuses)
	grown := peak() - base
	got := map[int]int{}
	for st := range statuses {
		got[st]++
	}
	t.Logf("16 parallel %d MiB exec bodies: peak RSS %d MiB over %d MiB; answers %v", len(big)>>20, grown>>20, base>>20, got)
	if grown > 256<<20 {
		t.Errorf("the daemon's peak RSS grew by %d MiB for 16 large bodies, want under 256 MiB", grown>>20)
	}
	for st := range got {
		if st != 400 && st != 429 && st != -1 {
			t.Errorf("a large body was answered %d, want 400 (env too large) or 429 (busy)", st)
		}
	}

	// 2. Bodies whose sender is slow stay counted while they are read:
	// beyond MaxBodiesInFlight the token gets busy at once.
	full := []byte(`{"cmd":["true"],"env":["A=` + strings.Repeat("a", api.MaxExecBody-40) + `"]}`)
	release := make(chan struct{})
	type answer struct {
		st int
		ae *api.Error
	}
	answers := make(chan answer, 8)
	var sent sync.WaitGroup
	for range 8 {
		pr, pw := io.Pipe()
		sent.Add(1)
		go func() {
			defer sent.Done()
			pw.Write(full[:26])
			<-release
			pw.Write(full[26:])
			pw.Close()
		}()
		go func() {
			st, ae, err := post(pr, int64(len(full)))
			if err != nil {
				st = -1
			}
			pr.CloseWithError(io.ErrClosedPipe)
			answers <- answer{st, ae}
		}()
	}
	fits := server.MaxBodiesInFlight / len(full)
	var busy []answer
	for len(busy) < 8-fits {
		var a answer
		select {
		case a = <-answers:
		case <-time.After(2 * time.Minute):
			close(release)
			t.Fatalf("after 2 minutes, %d of 8 slow large bodies were refused, want %d", len(busy), 8-fits)
		}
		if a.st != 429 || a.ae == nil || a.ae.Kind != api.KindBusy {
			close(release)
			t.Fatalf("while four slow large bodies are in flight: %d %+v, want 429 busy", a.st, a.ae)
		}
		busy = append(busy, a)
	}
	t.Logf("%d of 8 slow large bodies busy: %s", len(busy), busy[0].ae.Message)
	// Meanwhile an ordinary exec of the same token runs.
	res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "echo still here", Timeout: api.Duration(time.Minute)})
	if err != nil || string(res.Stdout) != "still here\n" {
		close(release)
		t.Fatalf("an ordinary exec while the token's bodies are held: %v %+v", err, res)
	}
	close(release)
	sent.Wait()
	for range fits {
		if a := <-answers; a.st != 400 || a.ae == nil || a.ae.Field != "env" {
			t.Errorf("a held body, once sent: %d %+v, want 400 naming env", a.st, a.ae)
		}
	}
	// The shares are given back: as many large bodies pass at once again.
	var again sync.WaitGroup
	for range fits {
		again.Add(1)
		go func() {
			defer again.Done()
			if st, ae, err := post(bytes.NewReader(full), int64(len(full))); err != nil || st != 400 || ae.Field != "env" {
				t.Errorf("a large body after the flood: %d %+v %v, want 400 naming env", st, ae, err)
			}
		}()
	}
	again.Wait()
}

// The exec limits are Linux's own: an argument of the largest size den
// takes runs, and so do arguments and environment near the total.
func TestExecArgLimitsMatchKernel(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, api.CreateRequest{})
	ctx := context.Background()
	arg := strings.Repeat("a", api.MaxArgLen)
	res, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", `echo ${#1}`, "x", arg}})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != fmt.Sprintf("%d\n", api.MaxArgLen) {
		t.Fatalf("an argument of %d bytes: %v %+v", api.MaxArgLen, err, res)
	}
	// 15 arguments and variables of the largest size: 1.9 MiB of the 2 MiB.
	args := []string{"sh", "-c", `echo $#`, "x"}
	for range 8 {
		args = append(args, arg)
	}
	var env []string
	for i := range 7 {
		env = append(env, fmt.Sprintf("V%d=%s", i, arg[:api.MaxArgLen-3]))
	}
	res, err = e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: args, Env: env})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "8\n" {
		t.Fatalf("%d bytes of arguments and environment: %v %+v", api.ArgBytes(args...)+api.ArgBytes(env...), err, res)
	}
	// One more byte in one argument is refused before anything runs.
	_, err = e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", arg + "a"}})
	if ae := wantKind(t, err, api.KindInvalid); ae.Field != "cmd" {
		t.Fatalf("an argument of %d bytes: %+v, want invalid naming cmd", api.MaxArgLen+1, ae)
	}
}
