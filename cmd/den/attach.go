package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

var verbAttach = &verb{
	name:     "attach",
	summary:  "connect to a background process's input and output",
	synopsis: "[flags] ID PROC",
	details: `Copies den's standard input to the process's standard input as it comes,
closing it at end of file (Ctrl-D on a terminal), while printing the
process's output: what the daemon kept, then new output until the process
ends. den then exits with the process's exit code (128+N when killed by
signal N, 124 on timeout, 137 when out of memory). Ctrl-C detaches and
leaves the process running.`,
	example: `den exec -d web -- python3 -i
		den attach web p1`,
	run: cmdAttach,
}

// stdinChunk is the most den sends to a process's stdin in one request.
const stdinChunk = 32 << 10

func cmdAttach(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	id, proc, err := c.procArgs(f, v, args)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	cl := c.client(f)

	// The stdin copier may still be blocked reading den's stdin when the
	// process ends; once attach is over, what it would print is dropped.
	stderr := &gatedWriter{w: c.stderr}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	go c.copyStdin(actx, cl, id, proc, stderr)

	st, err := cl.Logs(actx, id, proc, client.LogsOptions{Follow: true}, c.stdout, stderr)
	cancel()
	stderr.shut()
	if err != nil {
		return c.detached(ctx, proc, err)
	}
	return c.statusExit(st, 0, false)
}

// copyStdin sends den's standard input to the process's, a chunk at a time
// as it comes, and closes it at end of file.
func (c *cli) copyStdin(ctx context.Context, cl *client.Client, id, proc string, stderr io.Writer) {
	buf := make([]byte, stdinChunk)
	for {
		n, rerr := c.stdin.Read(buf)
		eof := errors.Is(rerr, io.EOF)
		if n > 0 || eof {
			if err := cl.WriteStdin(ctx, id, proc, bytes.NewReader(buf[:n]), eof); err != nil {
				// A process that has ended takes no input; the output
				// stream reports how it ended.
				if ctx.Err() != nil {
					return
				}
				if p, perr := cl.Process(ctx, id, proc); perr != nil || p.State != api.ProcRunning {
					return
				}
				fmt.Fprintf(stderr, "den: write to the standard input of %s: %v\n", proc, err)
				return
			}
		}
		if rerr != nil {
			if !eof && ctx.Err() == nil {
				fmt.Fprintf(stderr, "den: read standard input: %v\n", rerr)
			}
			return
		}
	}
}

// gatedWriter serializes writes to w and drops them once shut.
type gatedWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return len(p), nil
	}
	return g.w.Write(p)
}

func (g *gatedWriter) shut() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}
