package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"path/filepath"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	"github.com/den-dev/den/internal/image"
)

// raw sends one request to the daemon and returns status and body.
func (e *env) raw(t *testing.T, method, path string, body io.Reader) (int, []byte) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", e.sock)
	}}}
	req, _ := http.NewRequest(method, "http://den"+path, body)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (e *env) startProc(t *testing.T, id, shell string) api.ProcessInfo {
	t.Helper()
	b, _ := json.Marshal(api.ExecRequest{Shell: shell})
	status, out := e.raw(t, "POST", "/v1/sandboxes/"+id+"/processes", bytes.NewReader(b))
	var info api.ProcessInfo
	if status != 201 || json.Unmarshal(out, &info) != nil || info.ID == "" {
		t.Fatalf("start %q: %d %s", shell, status, out)
	}
	return info
}

// logs decodes a framed stream into stdout, stderr, dropped bytes and exit.
func logs(t *testing.T, b []byte) (stdout, stderr string, dropped int64, exit *api.ExitStatus) {
	t.Helper()
	fr := api.NewFrameReader(bytes.NewReader(b))
	var o, e strings.Builder
	for {
		typ, p, err := fr.Next()
		if err == io.EOF {
			return o.String(), e.String(), dropped, exit
		}
		if err != nil {
			t.Fatalf("logs stream: %v", err)
		}
		switch typ {
		case api.FrameStdout:
			o.Write(p)
		case api.FrameStderr:
			e.Write(p)
		case api.FrameDropped:
			var d api.DroppedOutput
			json.Unmarshal(p, &d)
			dropped += d.Bytes
		case api.FrameExit:
			exit = new(api.ExitStatus)
			json.Unmarshal(p, exit)
		}
	}
}

func TestBackgroundProcesses(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, api.CreateRequest{})
	base := "/v1/sandboxes/" + sb.ID + "/processes"

	p := e.startProc(t, sb.ID, "echo start; sleep 0.3; echo done >&2; exit 3")
	if p.State != api.ProcRunning || p.Pid <= 1 {
		t.Fatalf("started %+v", p)
	}
	// Following the logs replays from the start and ends with the exit.
	status, b := e.raw(t, "GET", base+"/"+p.ID+"/logs?follow=true", nil)
	out, errs, _, exit := logs(t, b)
	if status != 200 || out != "start\n" || errs != "done\n" || exit == nil || exit.ExitCode != 3 {
		t.Fatalf("logs -f: %d %q %q %+v", status, out, errs, exit)
	}
	// Finished: output and exit code are still served; wait answers at once.
	_, b = e.raw(t, "GET", base+"/"+p.ID+"/logs", nil)
	if out, _, _, exit := logs(t, b); out != "start\n" || exit == nil || exit.ExitCode != 3 {
		t.Fatalf("logs of a finished process: %q %+v", out, exit)
	}
	status, b = e.raw(t, "GET", base+"/"+p.ID+"/wait", nil)
	var st api.ExitStatus
	if status != 200 || json.Unmarshal(b, &st) != nil || st.ExitCode != 3 {
		t.Fatalf("wait: %d %s", status, b)
	}
	// Unknown processes: a clear 404.
	for _, bad := range []string{"p999", "nope", "p1x"} {
		if status, b := e.raw(t, "GET", base+"/"+bad+"/logs", nil); status != 404 || !bytes.Contains(b, []byte("no process")) {
			t.Fatalf("logs of %s: %d %s", bad, status, b)
		}
	}

	// stdin: write, then close; the process sees both.
	cat := e.startProc(t, sb.ID, "cat; echo eof")
	if status, b := e.raw(t, "POST", base+"/"+cat.ID+"/stdin", strings.NewReader("hello\n")); status != 204 {
		t.Fatalf("stdin: %d %s", status, b)
	}
	if status, b := e.raw(t, "POST", base+"/"+cat.ID+"/stdin?close=true", strings.NewReader("bye\n")); status != 204 {
		t.Fatalf("stdin close: %d %s", status, b)
	}
	_, b = e.raw(t, "GET", base+"/"+cat.ID+"/logs?follow=true", nil)
	if out, _, _, exit := logs(t, b); out != "hello\nbye\neof\n" || exit == nil || exit.ExitCode != 0 {
		t.Fatalf("cat: %q %+v", out, exit)
	}
	if status, _ := e.raw(t, "POST", base+"/"+cat.ID+"/stdin", strings.NewReader("late")); status != 409 {
		t.Fatalf("stdin after exit: %d, want 409", status)
	}

	// A client leaving mid-stream never kills the process; kill does, by
	// signal, to the whole group.
	sleeper := e.startProc(t, sb.ID, "trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.05; done")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", e.sock)
	}}}
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://den"+base+"/"+sleeper.ID+"/logs?follow=true", nil)
	if resp, err := hc.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	cancel()
	_, b = e.raw(t, "GET", base+"/"+sleeper.ID, nil)
	var info api.ProcessInfo
	json.Unmarshal(b, &info)
	if info.State != api.ProcRunning {
		t.Fatalf("process ended when its follower left: %+v", info)
	}
	if status, b := e.raw(t, "POST", base+"/"+sleeper.ID+"/kill", strings.NewReader(`{"signal":"TERM"}`)); status != 204 {
		t.Fatalf("kill: %d %s", status, b)
	}
	_, b = e.raw(t, "GET", base+"/"+sleeper.ID+"/wait", nil)
	json.Unmarshal(b, &st)
	if st.ExitCode != 7 {
		t.Fatalf("after TERM: %+v", st)
	}
	if status, _ := e.raw(t, "POST", base+"/"+sleeper.ID+"/kill", strings.NewReader(`{"signal":"BOGUS"}`)); status != 400 {
		t.Fatalf("bad signal: %d", status)
	}

	// tail and since.
	lines := e.startProc(t, sb.ID, "for i in 1 2 3 4 5; do echo $i; done")
	e.raw(t, "GET", base+"/"+lines.ID+"/wait", nil)
	_, b = e.raw(t, "GET", base+"/"+lines.ID+"/logs?tail=2", nil)
	if out, _, _, _ := logs(t, b); out != "4\n5\n" {
		t.Fatalf("tail=2: %q", out)
	}
	_, b = e.raw(t, "GET", base+"/"+lines.ID+"/logs?since=1h", nil)
	if out, _, _, _ := logs(t, b); out != "1\n2\n3\n4\n5\n" {
		t.Fatalf("since=1h: %q", out)
	}
	if status, _ := e.raw(t, "GET", base+"/"+lines.ID+"/logs?since=yesterday", nil); status != 400 {
		t.Fatalf("bad since accepted: %d", status)
	}

	// ps lists them all.
	_, b = e.raw(t, "GET", base, nil)
	var all []api.ProcessInfo
	if json.Unmarshal(b, &all) != nil || len(all) < 4 {
		t.Fatalf("ps: %s", b)
	}
}

// A process flooding output that nobody reads is not blocked and the
// agent keeps only the bounded tail, with a marker for what was dropped.
func TestUnreadFloodIsBounded(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, api.CreateRequest{})
	base := "/v1/sandboxes/" + sb.ID + "/processes"
	p := e.startProc(t, sb.ID, "head -c 100000000 /dev/zero; echo end")
	done := make(chan struct{})
	go func() { e.raw(t, "GET", base+"/"+p.ID+"/wait", nil); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("an unread flood blocked its process")
	}
	_, b := e.raw(t, "GET", base+"/"+p.ID+"/logs", nil)
	out, _, dropped, exit := logs(t, b)
	if exit == nil || exit.ExitCode != 0 || !strings.HasSuffix(out, "end\n") {
		t.Fatalf("flood result: exit %+v, tail %q", exit, out[max(0, len(out)-10):])
	}
	if len(out) > 10<<20 || dropped == 0 || int64(len(out))+dropped != 100000004 {
		t.Fatalf("kept %d bytes, dropped %d", len(out), dropped)
	}
}

func TestSessions(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	run := func(session, shell string) *api.ExecResult {
		t.Helper()
		r, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: shell, Session: session, Timeout: api.Duration(10 * time.Second)})
		if err != nil {
			t.Fatalf("%s: %v", shell, err)
		}
		return r
	}
	e.sh(t, sb.ID, "mkdir -p /src/deep")
	if r := run("s1", "cd /src && export X=1 && greet() { echo hello $1; }"); r.ExitCode != 0 {
		t.Fatalf("setup: %+v %q", r.ExitStatus, r.Stderr)
	}
	if r := run("s1", "pwd; echo $X; greet you"); string(r.Stdout) != "/src\n1\nhello you\n" {
		t.Fatalf("state not kept: %q %q", r.Stdout, r.Stderr)
	}
	if r := run("s1", "echo -n partial; echo err >&2; false"); string(r.Stdout) != "partial" || string(r.Stderr) != "err\n" || r.ExitCode != 1 {
		t.Fatalf("output framing: %q %q %+v", r.Stdout, r.Stderr, r.ExitStatus)
	}
	if r := run("s2", "pwd; echo ${X:-unset}"); string(r.Stdout) != "/root\nunset\n" && string(r.Stdout) != "/\nunset\n" {
		t.Fatalf("sessions share state: %q", r.Stdout)
	}
	// A command (cmd, not shell) runs in the session with each argument
	// as it is, whatever it looks like.
	for _, tc := range []struct {
		cmd  []string
		want string
	}{
		{[]string{"sh", "-c", `echo "a b"`}, "a b\n"},
		{[]string{"echo", "-c", "a  b"}, "-c a  b\n"},
		{[]string{"echo", "$X", "'q'", ";", "x"}, "$X 'q' ; x\n"},
	} {
		r, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: tc.cmd, Session: "s1", Timeout: api.Duration(10 * time.Second)})
		if err != nil || string(r.Stdout) != tc.want || r.ExitCode != 0 {
			t.Fatalf("session command %q: %+v %v, want %q", tc.cmd, r, err, tc.want)
		}
	}
	if r := run("s1", "pwd"); string(r.Stdout) != "/src\n" {
		t.Fatalf("a session command lost the session's state: %q", r.Stdout)
	}
	// A command reading stdin gets EOF, not the session's script.
	if r := run("s1", "cat; echo after"); string(r.Stdout) != "after\n" {
		t.Fatalf("stdin: %q", r.Stdout)
	}
	// Listed, then closed; closing twice is a clear 404.
	status, b := e.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/sessions", nil)
	var ss []api.Session
	if status != 200 || json.Unmarshal(b, &ss) != nil || len(ss) != 2 {
		t.Fatalf("sessions: %d %s", status, b)
	}
	if status, _ := e.raw(t, "DELETE", "/v1/sandboxes/"+sb.ID+"/sessions/s1", nil); status != 204 {
		t.Fatalf("close: %d", status)
	}
	if status, _ := e.raw(t, "DELETE", "/v1/sandboxes/"+sb.ID+"/sessions/s1", nil); status != 404 {
		t.Fatalf("close again: %d", status)
	}
	if r := run("s1", "pwd"); string(r.Stdout) == "/src\n" {
		t.Fatal("a closed session kept its state")
	}
	// exit ends the session with its status; a timeout ends it too.
	if r := run("s3", "exit 4"); r.ExitCode != 4 {
		t.Fatalf("exit in a session: %+v", r.ExitStatus)
	}
	r, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "sleep 30", Session: "s4", Timeout: api.Duration(300 * time.Millisecond)})
	if err != nil || r.Reason != api.ReasonTimeout {
		t.Fatalf("timeout in a session: %+v %v", r, err)
	}
	_, err = e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "true", Session: "bad name!"})
	wantKind(t, err, api.KindInvalid)
}

func TestServices(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	base := "/v1/sandboxes/" + sb.ID + "/processes"
	start := func(req api.ExecRequest) (int, api.ProcessInfo, []byte) {
		b, _ := json.Marshal(req)
		status, out := e.raw(t, "POST", base, bytes.NewReader(b))
		var info api.ProcessInfo
		json.Unmarshal(out, &info)
		return status, info, out
	}
	get := func(id string) api.ProcessInfo {
		_, b := e.raw(t, "GET", base+"/"+id, nil)
		var info api.ProcessInfo
		json.Unmarshal(b, &info)
		return info
	}
	status, crash, out := start(api.ExecRequest{Shell: "echo run; exit 1", Restart: "on-failure", Name: "crashy"})
	if status != 201 || crash.Restart != "on-failure" || crash.Name != "crashy" {
		t.Fatalf("start service: %d %s", status, out)
	}
	if status, _, _ := start(api.ExecRequest{Shell: "true", Name: "crashy"}); status != 409 {
		t.Fatalf("duplicate name: %d", status)
	}
	if status, _, _ := start(api.ExecRequest{Shell: "true", Restart: "sometimes"}); status != 400 {
		t.Fatalf("bad policy: %d", status)
	}
	if _, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: "true", Restart: "always"}); err == nil {
		t.Fatal("restart accepted on a foreground exec")
	}
	deadline := time.Now().Add(5 * time.Second)
	for get(crash.ID).Restarts < 3 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := get(crash.ID).Restarts; n < 3 {
		t.Fatalf("on-failure service restarted %d times in 5 s", n)
	}
	_, b := e.raw(t, "GET", base+"/"+crash.ID+"/logs", nil)
	if out, _, _, _ := logs(t, b); strings.Count(out, "run\n") < 4 {
		t.Fatalf("logs across restarts: %q", out)
	}
	// A signal through the API never ends a service's restart policy,
	// by name as by id: an always service killed with KILL, then with
	// TERM, runs again each time.
	_, svc, _ := start(api.ExecRequest{Shell: "sleep 1000", Restart: "always", Name: "steady"})
	for i, sig := range []string{"KILL", "TERM"} {
		b, _ := json.Marshal(api.SignalRequest{Signal: sig})
		if status, _ := e.raw(t, "POST", base+"/steady/kill", bytes.NewReader(b)); status != 204 {
			t.Fatalf("kill -s %s service: %d", sig, status)
		}
		deadline := time.Now().Add(10 * time.Second)
		for info := get(svc.ID); info.Restarts <= i || info.State != api.ProcRunning; info = get(svc.ID) {
			if time.Now().After(deadline) {
				t.Fatalf("service killed with %s did not run again: %+v", sig, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// on-failure does not restart a clean exit.
	_, ok, _ := start(api.ExecRequest{Shell: "exit 0", Restart: "on-failure"})
	time.Sleep(500 * time.Millisecond)
	if info := get(ok.ID); info.Restarts != 0 || info.State != api.ProcExited {
		t.Fatalf("clean exit restarted: %+v", info)
	}
	// A service comes back when the sandbox starts again.
	_, web, _ := start(api.ExecRequest{Shell: "echo serving; sleep 1000", Restart: "always", Name: "web"})
	if get(web.ID).State != api.ProcRunning {
		t.Fatal("web not running")
	}
	if _, err := e.c.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, b = e.raw(t, "GET", base, nil)
	var all []api.ProcessInfo
	json.Unmarshal(b, &all)
	// Services start again with the sandbox (like enabled units at boot),
	// the killed ones too.
	var web2, steady2 *api.ProcessInfo
	for i := range all {
		switch all[i].Name {
		case "web":
			web2 = &all[i]
		case "steady":
			steady2 = &all[i]
		}
	}
	if len(all) != 4 || web2 == nil || steady2 == nil || steady2.State != api.ProcRunning || web2.State != api.ProcRunning || web2.Restart != "always" {
		t.Fatalf("after start, processes: %s", b)
	}
}

// The daemon dies in the middle of 100 running execs: afterwards every one
// is accounted for, with its output, exit status and an exec.end event.
func TestCrashMidExecs(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	const n = 100
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func(i int) {
			_, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Shell: fmt.Sprintf("sleep 1; echo out-%d", i)})
			errs <- err
		}(i)
	}
	// Wait until all 100 are running, then cut the daemon off.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, b := e.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/processes", nil)
		var ps []api.ProcessInfo
		json.Unmarshal(b, &ps)
		if len(ps) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d execs started", len(ps))
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.stop() // in-flight exec streams break, as with kill -9
	failed := 0
	for i := 0; i < n; i++ {
		if <-errs != nil {
			failed++
		}
	}
	if failed == 0 {
		t.Fatal("the crash cut no exec short; the test did not test anything")
	}
	imgs, _ := image.NewStore(filepath.Join(e.data, "images"))
	e.start(t, imgs)
	_, b := e.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/processes", nil)
	var ps []api.ProcessInfo
	json.Unmarshal(b, &ps)
	if len(ps) != n {
		t.Fatalf("after the crash the agent lists %d processes, want %d", len(ps), n)
	}
	for _, p := range ps {
		_, lb := e.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/processes/"+p.ID+"/logs?follow=true", nil)
		out, _, _, exit := logs(t, lb)
		if !strings.HasPrefix(out, "out-") || exit == nil || exit.ExitCode != 0 {
			t.Fatalf("%s: output %q exit %+v", p.ID, out, exit)
		}
	}
	// Every exec has its end in the event log, the lost ones marked recovered.
	deadline = time.Now().Add(10 * time.Second)
	for {
		evs, _ := e.c.Events(ctx, client.EventFilter{Sandbox: sb.ID, Type: "exec.end"})
		if len(evs) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d exec.end events, want %d (%d execs were cut off)", len(evs), n, failed)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
