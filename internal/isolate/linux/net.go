package linux

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strconv"

	"github.com/vishvananda/netns"
)

// DialInside connects to 127.0.0.1:port in the box's network namespace:
// the socket is made on a thread that has entered that namespace, so it
// reaches servers bound to the box's loopback, with or without a network.
func (b *box) DialInside(ctx context.Context, port int) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is left locked (and so discarded when this goroutine
		// ends) if it could not go back to the daemon's namespace.
		orig, err := netns.Get()
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPid(b.pid)
		if err != nil {
			ch <- result{nil, fmt.Errorf("sandbox network namespace: %w", err)}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			ch <- result{nil, err}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// AllowUDP sets the UDP destinations the box may reach (see
// host.Network.SetUDPAllow).
func (b *box) AllowUDP(cidrs []netip.Prefix) error {
	if b.rt.net == nil || !b.spec.Net {
		if len(cidrs) == 0 {
			return nil
		}
		return errors.New("the sandbox has no network interface")
	}
	return b.rt.net.SetUDPAllow(b.spec.NetSlot, cidrs)
}
