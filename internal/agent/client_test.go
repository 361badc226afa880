package agent

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/den-dev/den/api"
)

// resetDial is an agent whose connection is reset as soon as a request
// arrives, as when its sandbox is killed under a request.
func resetDial(t *testing.T) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 1)
			c.Read(buf)
			c.(*net.TCPConn).SetLinger(0) // close with RST
			c.Close()
		}()
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	}
}

// TestGoneAgentIsAConflict: a request whose agent connection breaks is
// den's failure (internal) while the sandbox runs, and a conflict naming
// the stop once the daemon has marked the agent as going away.
func TestGoneAgentIsAConflict(t *testing.T) {
	ctx := context.Background()
	c := NewClient(resetDial(t))
	// The control: the same failure before the mark is internal.
	err := c.JSON(ctx, "POST", PathRename, nil, map[string]string{"from": "a", "to": "b"}, nil)
	if err == nil || api.KindOf(err) != api.KindInternal {
		t.Fatalf("reset before Gone: %v (kind %s), want an internal error", err, api.KindOf(err))
	}
	c.Gone(api.Errorf(api.KindConflict, "sandbox 0123456789ab stopped while the request ran"))
	err = c.JSON(ctx, "POST", PathRename, nil, map[string]string{"from": "a", "to": "b"}, nil)
	if !errors.Is(err, api.ErrConflict) || err.Error() != "sandbox 0123456789ab stopped while the request ran" {
		t.Errorf("reset after Gone: %v (kind %s), want the conflict", err, api.KindOf(err))
	}
	// Refused connections (the agent's socket gone) too.
	refused := NewClient(func(ctx context.Context) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: errors.New("connect: connection refused")}
	})
	refused.Gone(api.Errorf(api.KindConflict, "sandbox x removed while the request ran"))
	if err := refused.Ping(ctx); !errors.Is(err, api.ErrConflict) {
		t.Errorf("refused after Gone: %v, want conflict", err)
	}
}
