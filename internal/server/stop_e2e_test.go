package server_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/den-dev/den/api"
)

// A stop is graceful, as docker stop's: every process gets the stop
// signal and the stop timeout to end before it is killed; den rm -f kills
// at once. The processes trap TERM and write a marker into a host
// directory bound into the sandbox, so the markers outlive the sandbox.
func TestGracefulStop(t *testing.T) {
	host := t.TempDir()
	os.Chmod(host, 0o777)
	e := newEnvWith(t, 0, func(e *env) { e.allow = []string{host} })
	ctx := context.Background()
	mounts := []api.BindMount{{Source: host, Target: "/out"}}

	// Bad stop settings are refused, naming the field (a negative duration
	// fails as the body is decoded, naming the value); good ones pass.
	for _, bad := range []struct {
		req   api.CreateRequest
		field string
	}{
		{api.CreateRequest{StopSignal: "BOGUS"}, "stop_signal"},
		{api.CreateRequest{StopTimeout: ptr(api.Duration(-time.Second))}, `"-1s": negative`},
		{api.CreateRequest{StopTimeout: ptr(api.Duration(time.Hour))}, "stop_timeout"},
	} {
		_, err := e.c.Create(ctx, bad.req)
		if ae := wantKind(t, err, api.KindInvalid); ae.Field != bad.field && !strings.Contains(ae.Message, bad.field) {
			t.Fatalf("%+v: %q does not name %s", bad.req, ae.Message, bad.field)
		}
	}
	sb := e.create(t, api.CreateRequest{Mounts: mounts, StopSignal: "SIGTERM", StopTimeout: ptr(api.Duration(10 * time.Second))})
	if sb.StopSignal != "SIGTERM" || sb.StopTimeout == nil || sb.StopTimeout.D() != 10*time.Second {
		t.Fatalf("stop settings not kept: %q %v", sb.StopSignal, sb.StopTimeout)
	}
	for _, v := range []string{"-1s", "1h", "soon"} {
		status, body := e.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/stop?timeout="+v, nil)
		if status != 400 || !strings.Contains(string(body), `"field":"timeout"`) {
			t.Fatalf("stop ?timeout=%s: %d %s", v, status, body)
		}
	}

	// ready waits for process NAME's file NAME.ready: its trap is set.
	ready := func(name string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(host, name+".ready")); err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("process %s never set its trap", name)
			}
		}
	}
	// trap starts a background process that writes TERM's marker NAME when
	// TERM comes, and then exits or, with ignore, goes on; it returns once
	// the trap is set.
	trap := func(id, name string, ignore bool) {
		t.Helper()
		after := "exit 0"
		if ignore {
			after = ":"
		}
		script := fmt.Sprintf("trap 'echo term > /out/%[1]s; %[2]s' TERM; touch /out/%[1]s.ready; while :; do sleep 1; done", name, after)
		if _, err := e.c.StartProcess(ctx, id, api.ExecRequest{Shell: script}); err != nil {
			t.Fatal(err)
		}
		ready(name)
	}
	marker := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(host, name))
		return strings.TrimSpace(string(b))
	}
	state := func(id string) string {
		got, err := e.c.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return got.State
	}

	// den stop: the process gets TERM, writes its marker and exits.
	trap(sb.ID, "stop", false)
	if _, err := e.c.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := marker("stop"); got != "term" {
		t.Fatalf("den stop: the TERM marker is %q: the process was killed without TERM", got)
	}
	if _, err := e.c.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if out := e.sh(t, sb.ID, "cat /out/stop").Stdout; strings.TrimSpace(string(out)) != "term" {
		t.Fatalf("after start, marker: %q", out)
	}

	// A process that ignores TERM: it saw TERM, and the stop still ended
	// (it was killed when the timeout, here 1 s, passed).
	// An interactive shell on a terminal ignores TERM: it is hung up.
	trap(sb.ID, "deaf", true)
	tty := "trap 'echo hup > /out/tty; exit' HUP; touch /out/tty.ready; while :; do sleep 1; done"
	if _, err := e.c.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"/bin/bash", "--norc", "--noprofile", "-i", "-c", tty}, TTY: true, Rows: 24, Cols: 80}); err != nil {
		t.Fatal(err)
	}
	ready("tty")
	if _, err := e.c.StopWithin(ctx, sb.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	if got, st := marker("deaf"), state(sb.ID); got != "term" || st != api.StateStopped {
		t.Fatalf("stop of a process that ignores TERM: marker %q, state %s", got, st)
	}
	if got := marker("tty"); got != "hup" {
		t.Fatalf("stop of a shell on a terminal: HUP marker %q", got)
	}

	// Hibernation without a memory checkpoint (the linux tier, this env's)
	// stops the same way.
	if _, err := e.c.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	trap(sb.ID, "sleep", false)
	if _, err := e.c.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err := e.c.Resume(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if m := marker("sleep"); got.Resumed != "restarted" || m != "term" {
		t.Fatalf("hibernate on linux (resumed %s): the TERM marker is %q", got.Resumed, m)
	}

	// den rm -f kills at once: the same process, given a stop timeout of
	// 5 minutes, never sees TERM.
	rm := e.create(t, api.CreateRequest{Mounts: mounts, StopTimeout: ptr(api.Duration(5 * time.Minute))})
	trap(rm.ID, "rm", false)
	if err := e.c.Remove(ctx, rm.ID, true); err != nil {
		t.Fatal(err)
	}
	if got := marker("rm"); got != "" {
		t.Fatalf("den rm -f sent TERM first: marker %q", got)
	}
}

func ptr[T any](v T) *T { return &v }

// The same agent path stops the gvisor and microvm tiers gracefully: a
// process that traps TERM leaves its marker in the sandbox's files.
func TestGracefulStopTiers(t *testing.T) {
	for _, tier := range []string{"gvisor", "microvm"} {
		t.Run(tier, func(t *testing.T) {
			e := newTierEnv(t)
			e.need(t, tier)
			ctx := context.Background()
			sb := e.createOn(t, tier)
			script := "mkdir -p /root; trap 'echo term > /root/marker; exit 0' TERM; touch /root/ready; while :; do sleep 1; done"
			if _, err := e.c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: script}); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(60 * time.Second); e.sh(t, sb.ID, "test -e /root/ready").ExitCode != 0; time.Sleep(100 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the process never set its trap")
				}
			}
			if _, err := e.c.Stop(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.Start(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			if out := strings.TrimSpace(string(e.sh(t, sb.ID, "cat /root/marker").Stdout)); out != "term" {
				t.Fatalf("%s: after stop and start, the TERM marker is %q: the process was killed without TERM", tier, out)
			}
		})
	}
}

// Postgres stopped with den stop shuts down cleanly: started again, its
// log shows no crash recovery, and its data is there. It runs from the
// host image (the host's postgres), as user postgres.
func TestPostgresStopsCleanly(t *testing.T) {
	if _, err := os.Stat("/usr/lib/postgresql/15/bin/postgres"); err != nil {
		t.Skip("postgres 15 is not installed on this host")
	}
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{})
	bin := "/usr/lib/postgresql/15/bin/"
	if r := e.sh(t, sb.ID, "mkdir -p /var/pg && chown postgres: /var/pg && su postgres -s /bin/sh -c '"+bin+"initdb -D /var/pg/data -A trust' >/dev/null"); r.ExitCode != 0 {
		t.Fatalf("initdb: %s", r.Stderr)
	}
	start := func(log string) {
		t.Helper()
		script := "exec " + bin + "postgres -D /var/pg/data -k /var/pg -c listen_addresses= >/var/pg/" + log + " 2>&1"
		if _, err := e.c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: script, User: "postgres"}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(60 * time.Second); e.sh(t, sb.ID, bin+"pg_isready -q -U postgres -h /var/pg").ExitCode != 0; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("postgres did not start: %s", e.sh(t, sb.ID, "cat /var/pg/"+log).Stdout)
			}
		}
	}
	psql := func(sql string) string {
		t.Helper()
		r, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{bin + "psql", "-h", "/var/pg", "-d", "postgres", "-At", "-c", sql}, User: "postgres", Workdir: "/var/pg"})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("psql %s: %v %+v", sql, err, r)
		}
		return strings.TrimSpace(string(r.Stdout))
	}
	start("log1")
	psql("create table kept (v text); insert into kept values ('before stop')")
	if _, err := e.c.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	start("log2")
	log := string(e.sh(t, sb.ID, "cat /var/pg/log1 /var/pg/log2").Stdout)
	if !strings.Contains(log, "database system is shut down") || strings.Contains(log, "not properly shut down") || strings.Contains(log, "automatic recovery") {
		t.Fatalf("postgres did not shut down cleanly:\n%s", log)
	}
	if testing.Verbose() {
		t.Log(log)
	}
	if got := psql("select v from kept"); got != "before stop" {
		t.Fatalf("data after stop and start: %q", got)
	}
}

// Redis stopped with den stop saves its data (it writes its RDB file on
// TERM) and has it after den start. It runs the host's redis-server, or
// the one unpacked from Debian's packages (dpkg -x) under $DEN_REDIS_ROOT,
// bound into the sandbox.
func TestRedisKeepsData(t *testing.T) {
	req := api.CreateRequest{}
	bin, libs := "redis-", []string(nil)
	if root := os.Getenv("DEN_REDIS_ROOT"); root != "" {
		bin, libs = "/opt/redis/usr/bin/redis-", []string{"LD_LIBRARY_PATH=/opt/redis/usr/lib/x86_64-linux-gnu"}
		req.Mounts = []api.BindMount{{Source: root, Target: "/opt/redis", ReadOnly: true}}
		if _, err := os.Stat(filepath.Join(root, "usr/bin/redis-server")); err != nil {
			t.Fatalf("DEN_REDIS_ROOT: %v", err)
		}
	} else if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed on this host (or set DEN_REDIS_ROOT to a dpkg -x of Debian's redis-server, redis-tools, libjemalloc2 and liblzf1)")
	}
	e := newEnvWith(t, 0, func(e *env) {
		if len(req.Mounts) > 0 {
			e.allow = []string{req.Mounts[0].Source}
		}
	})
	ctx := context.Background()
	sb := e.create(t, req)
	cli := func(args ...string) string {
		t.Helper()
		r, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: append([]string{bin + "cli", "-p", "6399"}, args...), Env: libs})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("redis-cli %v: %v %+v", args, err, r)
		}
		return strings.TrimSpace(string(r.Stdout))
	}
	start := func() {
		t.Helper()
		argv := []string{bin + "server", "--port", "6399", "--dir", "/var/redis", "--save", "3600 1"}
		if _, err := e.c.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: argv, Env: libs}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			r, err := e.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{bin + "cli", "-p", "6399", "ping"}, Env: libs})
			if err == nil && strings.TrimSpace(string(r.Stdout)) == "PONG" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("redis did not start: %v %+v", err, r)
			}
		}
	}
	e.sh(t, sb.ID, "mkdir -p /var/redis")
	start()
	if got := cli("set", "kept", "before stop"); got != "OK" {
		t.Fatalf("set: %q", got)
	}
	if _, err := e.c.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	start()
	if got := cli("get", "kept"); got != "before stop" {
		t.Fatalf("after stop and start, redis has %q: its data was not saved", got)
	}
}

// The idle timeout's graceful stop of one sandbox, waiting out its stop
// timeout, does not hold up another's: the second sandbox goes idle while
// the first one's stop waits, and stops before it.
func TestIdleStopsDoNotWaitInLine(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	slow := e.create(t, api.CreateRequest{IdleTimeout: api.Duration(time.Second), StopTimeout: ptr(api.Duration(20 * time.Second))})
	quick := e.create(t, api.CreateRequest{IdleTimeout: api.Duration(time.Second)})
	if _, err := e.c.StartProcess(ctx, slow.ID, api.ExecRequest{Shell: "trap '' TERM; while :; do sleep 1; done"}); err != nil {
		t.Fatal(err)
	}
	// An exec keeps quick busy past its idle timeout, while slow goes idle
	// and its stop begins to wait out its 20 s.
	if r := e.sh(t, quick.ID, "sleep 4; echo done"); string(r.Stdout) != "done\n" {
		t.Fatalf("long exec: %q", r.Stdout)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		q, err := e.c.Get(ctx, quick.ID)
		if err != nil {
			t.Fatal(err)
		}
		s, err := e.c.Get(ctx, slow.ID)
		if err != nil {
			t.Fatal(err)
		}
		if s.State == api.StateStopped {
			t.Fatalf("the idle stop of %s (quick: %s) waited for the stop of %s", quick.ID[:12], q.State, slow.ID[:12])
		}
		if q.State == api.StateStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("quick never stopped as idle (%s)", q.State)
		}
	}
	// slow's stop ends when its timeout has passed.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if s, _ := e.c.Get(ctx, slow.ID); s != nil && s.State == api.StateStopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("slow never stopped")
		}
	}
}

// den rm -f while a stop waits out a long stop timeout cuts the wait
// short: the removal (and the stop) end without waiting 5 minutes.
func TestForceRemoveCutsStopWait(t *testing.T) {
	host := t.TempDir()
	os.Chmod(host, 0o777)
	e := newEnvWith(t, 0, func(e *env) { e.allow = []string{host} })
	ctx := context.Background()
	sb := e.create(t, api.CreateRequest{Mounts: []api.BindMount{{Source: host, Target: "/out"}}, StopTimeout: ptr(api.Duration(5 * time.Minute))})
	if _, err := e.c.StartProcess(ctx, sb.ID, api.ExecRequest{Shell: "trap 'echo term > /out/term' TERM; while :; do sleep 1; done"}); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { _, err := e.c.Stop(ctx, sb.ID); stopped <- err }()
	// The stop has sent TERM and waits.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(host, "term")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stop never sent TERM")
		}
	}
	removed := make(chan error, 1)
	go func() { removed <- e.c.Remove(ctx, sb.ID, true) }()
	for _, ch := range []chan error{removed, stopped} {
		select {
		case err := <-ch:
			if err != nil && api.KindOf(err) != api.KindNotFound {
				t.Fatal(err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("den rm -f waited for the stop's 5-minute timeout")
		}
	}
	if _, err := e.c.Get(ctx, sb.ID); api.KindOf(err) != api.KindNotFound {
		t.Fatalf("after rm -f: %v", err)
	}
}
