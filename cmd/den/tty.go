package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// Default terminal size when den's own output is not a terminal.
const (
	defaultRows = 24
	defaultCols = 80
)

// terminalFd returns the file descriptor of x when it is a terminal.
func terminalFd(x any) (int, bool) {
	f, ok := x.(*os.File)
	if !ok || f == nil {
		return 0, false
	}
	fd := int(f.Fd())
	return fd, term.IsTerminal(fd)
}

// termSize returns the size of den's terminal (stdout's, else stdin's),
// 24x80 when there is none. Tests replace it.
var termSize = func(c *cli) (rows, cols uint16) {
	for _, x := range []any{c.stdout, c.stdin, c.stderr} {
		if fd, ok := terminalFd(x); ok {
			if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 && w < 1<<16 && h < 1<<16 {
				return uint16(h), uint16(w)
			}
		}
	}
	return defaultRows, defaultCols
}

// ttySignals are the signals den catches while attached to a terminal.
// SIGWINCH becomes a resize; the others are passed on to the process.
var ttySignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGWINCH}

// ttySignalName is the name a caught signal is passed on with.
func ttySignalName(s os.Signal) string {
	switch s {
	case os.Interrupt:
		return "INT"
	case syscall.SIGTERM:
		return "TERM"
	case syscall.SIGHUP:
		return "HUP"
	case syscall.SIGQUIT:
		return "QUIT"
	}
	return ""
}

// maxInterrupts is how many Ctrl-C (not in raw mode) den passes on before
// it gives up waiting and leaves the process running.
const maxInterrupts = 3

// runTTY starts req in sandbox id on a terminal the size of den's own and
// connects den to it: with input, den's standard input is typed on it (a
// terminal of den's own is put in raw mode for that, and restored however
// den leaves), and the terminal's output goes to den's standard output.
// Window size changes are passed on, as are INT, TERM, HUP and QUIT that
// den receives (in raw mode, Ctrl-C and Ctrl-\ are typed on the remote
// terminal instead). It returns the process's exit code as an exitError
// (nil for 0).
func (c *cli) runTTY(cl *client.Client, id string, req api.ExecRequest, input bool) (err error) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, ttySignals...)
	defer signal.Stop(sigs)

	rows, cols := termSize(c)
	req.TTY, req.Rows, req.Cols = true, rows, cols
	if !hasEnv(req.Env, "TERM") {
		t := os.Getenv("TERM")
		if t == "" || t == "dumb" {
			t = "xterm"
		}
		req.Env = append([]string{"TERM=" + t}, req.Env...)
	}

	// Until attached, a signal stops den.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu       sync.Mutex
		tty      *client.TTY
		hungUp   bool
		detached bool
	)
	// resize passes on a change of den's terminal size.
	resize := func() {
		mu.Lock()
		defer mu.Unlock()
		if tty == nil {
			return
		}
		if nr, nc := termSize(c); nr != rows || nc != cols {
			rows, cols = nr, nc
			tty.Resize(rows, cols)
		}
	}
	done, sigDone := make(chan struct{}), make(chan struct{})
	defer func() { close(done); <-sigDone }()
	go func() {
		defer close(sigDone)
		interrupts := 0
		for {
			var s os.Signal
			select {
			case <-done:
				return
			case s = <-sigs:
			}
			if s == syscall.SIGWINCH {
				resize()
				continue
			}
			mu.Lock()
			t := tty
			if t == nil {
				cancel() // under mu: the attach sees it
			}
			mu.Unlock()
			if t == nil {
				continue
			}
			t.Signal(ttySignalName(s))
			switch s {
			case syscall.SIGHUP:
				// den's terminal is gone: leave.
				mu.Lock()
				hungUp = true
				mu.Unlock()
				t.Close()
			case os.Interrupt:
				if interrupts++; interrupts >= maxInterrupts {
					mu.Lock()
					detached = true
					mu.Unlock()
					t.Close()
				}
			}
		}
	}()

	p, err := cl.StartProcess(ctx, id, req)
	if err != nil {
		return interrupted(ctx, err)
	}
	t, err := cl.AttachTTY(ctx, id, p.ID)
	// Nobody can use a terminal process den could not attach to.
	kill := func() {
		kctx, kcancel := context.WithTimeout(context.Background(), 10*time.Second)
		cl.Kill(kctx, id, p.ID, "KILL")
		kcancel()
	}
	if err == nil {
		defer t.Close()
		mu.Lock()
		tty = t
		if ctx.Err() != nil { // a signal came as den attached
			err = ctx.Err()
		}
		mu.Unlock()
	}
	if err != nil {
		kill()
		return interrupted(ctx, err)
	}
	resize() // a change while the process started

	// Raw mode, restored on every way out, a panic included.
	restore := func() {}
	if fd, isTerm := terminalFd(c.stdin); input && isTerm {
		state, err := term.MakeRaw(fd)
		if err != nil {
			kill()
			return fmt.Errorf("set the terminal to raw mode: %w", err)
		}
		var once sync.Once
		restore = func() { once.Do(func() { term.Restore(fd, state) }) }
		defer restore()
	}
	guard := func() {
		if r := recover(); r != nil {
			restore()
			panic(r)
		}
	}

	if input {
		_, raw := terminalFd(c.stdin)
		go func() {
			defer guard()
			c.typeInput(t, !raw)
		}()
	}

	_, rerr := io.Copy(c.stdout, t)
	var st *api.ExitStatus
	if rerr == nil {
		st, rerr = t.Wait()
	}
	restore()
	if rerr != nil {
		mu.Lock()
		h, d := hungUp, detached
		mu.Unlock()
		switch {
		case h:
			return exitError(129)
		case d:
			fmt.Fprintf(c.stderr, "den: interrupted; process %s keeps running (den kill %s %s stops it)\n", p.ID, id, p.ID)
			return exitError(130)
		}
		return fmt.Errorf("%w; process %s may still run (see den ps %s)", rerr, p.ID, id)
	}
	return c.statusExit(st, req.Timeout, false)
}

// typeInput copies den's standard input to the terminal. At the end of a
// non-terminal input (eof set), it types Ctrl-D, the terminal's end of file.
func (c *cli) typeInput(t *client.TTY, eof bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.stdin.Read(buf)
		if n > 0 {
			if _, werr := t.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && eof {
				t.Write([]byte{4})
			}
			return
		}
	}
}

// hasEnv reports whether env sets variable k.
func hasEnv(env []string, k string) bool {
	for _, e := range env {
		if name, _, _ := strings.Cut(e, "="); name == k {
			return true
		}
	}
	return false
}
