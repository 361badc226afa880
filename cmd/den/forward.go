package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/den-dev/den/client"
)

var verbForward = &verb{
	name:     "forward",
	summary:  "forward local TCP ports to ports inside a sandbox",
	synopsis: "[flags] ID [LOCALADDR:]LOCALPORT:PORT...",
	details: `Listens on LOCALPORT (on 127.0.0.1 unless LOCALADDR is given; 0 picks a
free port) and carries every connection to PORT on the sandbox's loopback,
until Ctrl-C. Any TCP protocol works (databases, debuggers, HTTP), servers
bound only to the sandbox's 127.0.0.1 included, and the port need not be
shared with den port. A lone PORT forwards the same local port. Prints
"forwarding LOCALADDR:LOCALPORT -> ID:PORT" for each. Closing either end of
a connection closes both (there is no half-close).`,
	example: `den forward web 8000:8000
		den forward web 15432:5432 9229
		den forward web 0.0.0.0:8080:80`,
	run: cmdForward,
}

// forwardContext ends den forward: Ctrl-C (tests replace it).
var forwardContext = signalContext

// forwardSpec is one [LOCALADDR:]LOCALPORT:PORT.
type forwardSpec struct {
	local string // host:port to listen on
	port  int    // inside the sandbox
}

func parseForward(v *verb, s string) (forwardSpec, error) {
	bad := func(why string) (forwardSpec, error) {
		return forwardSpec{}, usagef(v, "bad forward %q: %s (want [LOCALADDR:]LOCALPORT:PORT, like 8000:8000)", s, why)
	}
	rest, remote := "", s
	if i := strings.LastIndex(s, ":"); i >= 0 {
		rest, remote = s[:i], s[i+1:]
	}
	port, err := strconv.Atoi(remote)
	if err != nil || port < 1 || port > 65535 {
		return bad(fmt.Sprintf("%q is not a TCP port (1-65535)", remote))
	}
	host, lport := "127.0.0.1", rest
	switch {
	case rest == "":
		lport = remote
	case strings.Contains(rest, ":"):
		h, p, err := net.SplitHostPort(rest)
		if err != nil {
			return bad(err.Error())
		}
		host, lport = h, p
	}
	if n, err := strconv.Atoi(lport); err != nil || n < 0 || n > 65535 {
		return bad(fmt.Sprintf("%q is not a local port (0-65535)", lport))
	}
	return forwardSpec{local: net.JoinHostPort(host, lport), port: port}, nil
}

func cmdForward(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usagef(v, "forward needs a sandbox ID and [LOCALADDR:]LOCALPORT:PORT, like: den forward web 8000:8000")
	}
	id := pos[0]
	var specs []forwardSpec
	for _, s := range pos[1:] {
		sp, err := parseForward(v, s)
		if err != nil {
			return err
		}
		specs = append(specs, sp)
	}
	ctx, stop := forwardContext()
	defer stop()
	cl := c.client(f)
	// A sandbox that does not exist is an error now rather than at the
	// first connection.
	if _, err := cl.Get(ctx, id); err != nil {
		return err
	}
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for _, sp := range specs {
		l, err := net.Listen("tcp", sp.local)
		if err != nil {
			return err
		}
		listeners = append(listeners, l)
		fmt.Fprintf(c.stdout, "forwarding %s -> %s:%d\n", l.Addr(), id, sp.port)
	}
	var wg sync.WaitGroup
	var outMu sync.Mutex
	for i, l := range listeners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				conn, err := l.Accept()
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
						outMu.Lock()
						fmt.Fprintf(c.stderr, "den: forward %s: %v\n", l.Addr(), err)
						outMu.Unlock()
					}
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := forwardConn(ctx, cl, id, specs[i].port, conn); err != nil && ctx.Err() == nil {
						outMu.Lock()
						c.report(v, fmt.Errorf("forward %s -> %s:%d: %w", l.Addr(), id, specs[i].port, err))
						outMu.Unlock()
					}
				}()
			}
		}()
	}
	<-ctx.Done()
	for _, l := range listeners {
		l.Close()
	}
	wg.Wait()
	return exitError(130)
}

// forwardConn carries one local connection to port inside the sandbox,
// until either end closes or ctx ends.
func forwardConn(ctx context.Context, cl *client.Client, id string, port int, local net.Conn) error {
	defer local.Close()
	remote, err := cl.DialPort(ctx, id, port)
	if err != nil {
		return err
	}
	defer remote.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(remote, local); done <- struct{}{} }()
	go func() { io.Copy(local, remote); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	// Closing both ends (deferred) stops the other copy.
	return nil
}
