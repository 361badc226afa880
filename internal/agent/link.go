package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// An agent link carries the agent protocol over one byte stream where the
// tier offers no sockets: gVisor's stdio (FIFOs the daemon can reopen) or
// a microVM's virtio-serial port. The stream is cut into frames; a yamux
// session inside them gives each request its own connection. The stream
// outlives any one session: the daemon starts a new session after it
// restarts, and after a checkpoint is restored (the agent then reads from
// descriptors it never saw before, possibly mid-frame). Every session has
// an epoch; the daemon opens one with a RESET frame and the agent answers
// ACK; frames of another epoch are dropped, and a reader that meets bytes
// that are not a frame scans forward for the next RESET or ACK.
//
//	header: sync 0xD3 | type | 2 bytes zero | epoch uint32 | length uint32
//	RESET, ACK: payload linkMagic; DATA: payload ≤ linkMaxData bytes
const (
	linkSync     = 0xD3
	linkReset    = 1
	linkAck      = 2
	linkData     = 3
	linkHdr      = 12
	linkMaxData  = 64 << 10
	linkMagicLen = 16
)

var linkMagic = []byte("den-agent-link/1")

// readFrame returns the next well-formed frame, skipping bytes that are
// not one.
func readFrame(br *bufio.Reader) (typ byte, epoch uint32, payload []byte, err error) {
	for {
		h, err := br.Peek(linkHdr)
		if err != nil {
			return 0, 0, nil, err
		}
		typ, epoch, n := h[1], binary.BigEndian.Uint32(h[4:8]), binary.BigEndian.Uint32(h[8:12])
		ok := h[0] == linkSync && h[2] == 0 && h[3] == 0 && epoch != 0
		switch {
		case !ok:
		case typ == linkReset || typ == linkAck:
			if n != linkMagicLen {
				ok = false
				break
			}
			full, err := br.Peek(linkHdr + linkMagicLen)
			if err != nil {
				return 0, 0, nil, err
			}
			ok = bytes.Equal(full[linkHdr:], linkMagic)
		case typ == linkData:
			ok = n > 0 && n <= linkMaxData
		default:
			ok = false
		}
		if !ok {
			br.Discard(1)
			continue
		}
		br.Discard(linkHdr)
		payload = make([]byte, n)
		if _, err := io.ReadFull(br, payload); err != nil {
			return 0, 0, nil, err
		}
		return typ, epoch, payload, nil
	}
}

// frameWriter writes whole frames to the stream, one at a time.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (fw *frameWriter) write(typ byte, epoch uint32, p []byte) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	buf := make([]byte, linkHdr+len(p))
	buf[0], buf[1] = linkSync, typ
	binary.BigEndian.PutUint32(buf[4:8], epoch)
	binary.BigEndian.PutUint32(buf[8:12], uint32(len(p)))
	copy(buf[linkHdr:], p)
	_, err := fw.w.Write(buf)
	return err
}

// epochConn is one session's view of the stream, what yamux runs on: reads
// come from the frames of its epoch, writes leave as DATA frames.
type epochConn struct {
	epoch uint32
	fw    *frameWriter
	pr    *io.PipeReader
	pw    *io.PipeWriter
}

func newEpochConn(fw *frameWriter, epoch uint32) *epochConn {
	pr, pw := io.Pipe()
	return &epochConn{epoch: epoch, fw: fw, pr: pr, pw: pw}
}

func (c *epochConn) Read(p []byte) (int, error) { return c.pr.Read(p) }

func (c *epochConn) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p
		if len(chunk) > linkMaxData {
			chunk = chunk[:linkMaxData]
		}
		if err := c.fw.write(linkData, c.epoch, chunk); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// feed hands a DATA payload to the session; it fails once the session is
// closed.
func (c *epochConn) feed(p []byte) error {
	_, err := c.pw.Write(p)
	return err
}

func (c *epochConn) Close() error {
	c.pr.Close()
	c.pw.Close()
	return nil
}

func yamuxConfig() *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.AcceptBacklog = 1024
	// No keepalives: an idle sandbox's agent should not wake up, and a
	// paused or checkpointed one cannot answer them.
	cfg.EnableKeepAlive = false
	cfg.ConnectionWriteTimeout = 24 * time.Hour
	cfg.MaxStreamWindowSize = 1 << 20
	cfg.LogOutput = io.Discard
	return cfg
}

// ServeLink answers the agent protocol over a byte stream (r, w) for as
// long as r can be read: each RESET from the daemon starts a fresh session
// and ends the one before. An end of file on r (the daemon went away) is
// waited out: a new daemon opens the stream again.
func (a *Agent) ServeLink(r io.Reader, w io.Writer) error { return serveLink(r, w, a.Serve) }

func serveLink(r io.Reader, w io.Writer, serve func(net.Listener) error) error {
	fw := &frameWriter{w: w}
	br := bufio.NewReaderSize(r, 2*linkMaxData)
	var cur *epochConn
	var sess *yamux.Session
	end := func() {
		if sess != nil {
			sess.Close()
			sess = nil
		}
		if cur != nil {
			cur.Close()
			cur = nil
		}
	}
	for {
		typ, epoch, payload, err := readFrame(br)
		if err != nil {
			end()
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				time.Sleep(100 * time.Millisecond)
				br.Reset(r)
				continue
			}
			return fmt.Errorf("agent link: %w", err)
		}
		switch typ {
		case linkReset:
			if cur != nil && cur.epoch == epoch {
				// A repeated RESET of the session we run: answer again.
				fw.write(linkAck, epoch, linkMagic)
				continue
			}
			end()
			cur = newEpochConn(fw, epoch)
			s, err := yamux.Server(cur, yamuxConfig())
			if err != nil {
				return err
			}
			sess = s
			go serve(s)
			if err := fw.write(linkAck, epoch, linkMagic); err != nil {
				end()
			}
		case linkData:
			if cur != nil && cur.epoch == epoch {
				if cur.feed(payload) != nil {
					end()
				}
			}
		}
	}
}

// Link is the daemon's end of an agent reached over a byte stream. Its
// Client works across sessions: requests made while no session is open
// wait for the next Attach (or their context).
type Link struct {
	client *Client

	mu    sync.Mutex
	sess  *yamux.Session
	conn  *epochConn
	rw    io.ReadWriteCloser
	ready chan struct{} // closed while a session is open
	done  chan struct{} // closed by Close
}

// NewLink returns a link with no session yet.
func NewLink() *Link {
	l := &Link{ready: make(chan struct{}), done: make(chan struct{})}
	l.client = NewClient(l.open)
	return l
}

// Client is the agent client whose connections are the link's streams.
func (l *Link) Client() *Client { return l.client }

// Attach opens a new session over rw (the stream, freshly opened after a
// start, a daemon restart or a restore) and ends any earlier one. It
// returns once the agent has answered, resending its RESET until then.
func (l *Link) Attach(ctx context.Context, rw io.ReadWriteCloser) error {
	l.Detach()
	var eb [4]byte
	var epoch uint32
	for epoch == 0 {
		rand.Read(eb[:])
		epoch = binary.BigEndian.Uint32(eb[:])
	}
	fw := &frameWriter{w: rw}
	conn := newEpochConn(fw, epoch)
	acked := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		br := bufio.NewReaderSize(rw, 2*linkMaxData)
		gotAck := false
		for {
			typ, e, payload, err := readFrame(br)
			if err != nil {
				conn.Close()
				readErr <- err
				return
			}
			if e != epoch {
				continue
			}
			switch typ {
			case linkAck:
				if !gotAck {
					gotAck = true
					close(acked)
				}
			case linkData:
				if gotAck && conn.feed(payload) != nil {
					return
				}
			}
		}
	}()
	fail := func(err error) error {
		rw.Close()
		conn.Close()
		return err
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for waiting := true; waiting; {
		if err := fw.write(linkReset, epoch, linkMagic); err != nil {
			return fail(fmt.Errorf("agent link: send reset: %w", err))
		}
		select {
		case <-acked:
			waiting = false
		case err := <-readErr:
			return fail(fmt.Errorf("agent link: the agent's stream ended: %w", err))
		case <-ctx.Done():
			return fail(fmt.Errorf("agent link: the agent did not answer: %w", ctx.Err()))
		case <-tick.C:
		}
	}
	sess, err := yamux.Client(conn, yamuxConfig())
	if err != nil {
		return fail(err)
	}
	l.mu.Lock()
	l.sess, l.conn, l.rw = sess, conn, rw
	close(l.ready)
	l.mu.Unlock()
	return nil
}

// Detach ends the current session (before a checkpoint, or when the
// stream is about to go away); requests wait for the next Attach.
func (l *Link) Detach() {
	l.mu.Lock()
	sess, conn, rw := l.sess, l.conn, l.rw
	if sess != nil {
		l.sess, l.conn, l.rw = nil, nil, nil
		l.ready = make(chan struct{})
	}
	l.mu.Unlock()
	if sess == nil {
		return
	}
	sess.Close()
	conn.Close()
	rw.Close()
	l.client.Close()
}

// Close ends the session for good: waiting and later requests fail.
func (l *Link) Close() {
	l.Detach()
	l.mu.Lock()
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	l.mu.Unlock()
}

// ErrLinkClosed is the answer of a link whose box is gone.
var ErrLinkClosed = errors.New("agent link closed")

func (l *Link) open(ctx context.Context) (net.Conn, error) {
	for {
		l.mu.Lock()
		sess, ready := l.sess, l.ready
		l.mu.Unlock()
		if sess != nil {
			s, err := sess.OpenStream()
			if err == nil {
				return s, nil
			}
			if !errors.Is(err, yamux.ErrSessionShutdown) {
				return nil, err
			}
			l.mu.Lock()
			if l.sess == sess {
				l.mu.Unlock()
				return nil, fmt.Errorf("agent link: %w", err)
			}
			l.mu.Unlock()
			continue
		}
		select {
		case <-ready:
		case <-l.done:
			return nil, ErrLinkClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
