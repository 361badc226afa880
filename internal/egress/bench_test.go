package egress

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// benchServer answers every connection with a short HTTP response once it
// has read the request head (or the first bytes of anything else), then
// closes; in sink mode it reads to EOF and answers with the byte count.
func benchServer(b *testing.B, ip string, sink bool) netip.AddrPort {
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if sink {
					n, _ := io.Copy(io.Discard, c)
					binary.Write(c, binary.BigEndian, n)
					return
				}
				br := bufio.NewReader(c)
				for {
					l, err := br.ReadSlice('\n')
					if err != nil || len(bytes.TrimSpace(l)) == 0 {
						break
					}
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			}()
		}
	}()
	return addrPortOf(ln.Addr())
}

func benchHarness(b *testing.B, pol Policy, dst netip.AddrPort) *harness {
	h := newHarness(b, pol, func(c *Config) {
		c.Log = func(Event) {}
		c.OriginalDst = func(net.Conn) (netip.AddrPort, error) { return dst, nil }
	})
	h.res.set("bench.example.com", []netip.Addr{dst.Addr()})
	return h
}

// connectVia opens a connection to dst the way a sandbox would in each
// mode: directly, redirected to the transparent proxy, or by CONNECT.
func connectVia(mode string, h *harness, dst netip.AddrPort) (net.Conn, error) {
	switch mode {
	case "direct":
		return net.Dial("tcp", dst.String())
	case "transparent":
		return net.Dial("tcp", h.tproxy.Addr().String())
	case "connect":
		c, err := net.Dial("tcp", h.eproxy.Addr().String())
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(c, "CONNECT bench.example.com:%d HTTP/1.1\r\nHost: bench.example.com\r\n\r\n", dst.Port())
		// Read the 200 byte by byte so nothing of the tunnel is buffered.
		var head []byte
		one := make([]byte, 1)
		for !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
			if _, err := c.Read(one); err != nil {
				c.Close()
				return nil, err
			}
			head = append(head, one[0])
		}
		if !bytes.HasPrefix(head, []byte("HTTP/1.1 200")) {
			c.Close()
			return nil, fmt.Errorf("CONNECT: %q", head)
		}
		return c, nil
	}
	panic(mode)
}

// BenchmarkProxyConnect measures connection setup: connect, send a small
// HTTP request naming bench.example.com, read the response, close.
func BenchmarkProxyConnect(b *testing.B) {
	dst := benchServer(b, "127.0.0.2", false)
	pol := Policy{Mode: ModeAllow, Allow: []string{"bench.example.com"}}
	h := benchHarness(b, pol, dst)
	req := []byte("GET / HTTP/1.1\r\nHost: bench.example.com\r\nUser-Agent: bench\r\n\r\n")
	for _, mode := range []string{"direct", "transparent", "connect"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				c, err := connectVia(mode, h, dst)
				if err != nil {
					b.Fatal(err)
				}
				c.Write(req)
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}
		})
	}
}

// BenchmarkProxyThroughput measures bulk transfer on one connection (64 KiB
// per op, sandbox → upstream), direct and through each proxy.
func BenchmarkProxyThroughput(b *testing.B) {
	dst := benchServer(b, "127.0.0.2", true)
	pol := Policy{Mode: ModeAllow, Allow: []string{"bench.example.com"}, AllowCIDR: []netip.Prefix{netip.PrefixFrom(dst.Addr(), 32)}}
	h := benchHarness(b, pol, dst)
	chunk := make([]byte, 64<<10)
	for _, mode := range []string{"direct", "transparent", "connect"} {
		b.Run(mode, func(b *testing.B) {
			c, err := connectVia(mode, h, dst)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.SetBytes(int64(len(chunk)))
			var sent int64
			for b.Loop() {
				n, err := c.Write(chunk)
				sent += int64(n)
				if err != nil {
					b.Fatal(err)
				}
			}
			c.(*net.TCPConn).CloseWrite()
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			var got int64
			if err := binary.Read(c, binary.BigEndian, &got); err != nil || got != sent {
				b.Fatalf("sink got %d of %d bytes: %v", got, sent, err)
			}
		})
	}
}

// BenchmarkSync is what an exec's end pays to see its denials: one Sync
// of an idle event queue.
func BenchmarkSync(b *testing.B) {
	s := New(Config{Log: func(Event) {}})
	defer s.Close()
	for b.Loop() {
		s.Sync(time.Second)
	}
}
