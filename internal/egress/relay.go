package egress

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// relay copies between client and upstream until both directions have
// ended, first sending pre (bytes already read from the client) upstream.
// A direction that ends cleanly half-closes its destination; an error in
// either direction ends both. out counts client → upstream bytes including
// pre, in upstream → client. The client → upstream bytes are accounted to
// m: added at the end without a limit (the copy keeps the splice fast
// path), reserved chunk by chunk with one, the connection ending at the
// limit (limited is then true).
func (s *Server) relay(client, up net.Conn, pre []byte, m *meter) (out, in int64, limited bool) {
	var src [2]io.Reader
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	if d := s.cfg.IdleTimeout; d > 0 {
		src[0] = &idleReader{c: client, d: d, last: &last}
		src[1] = &idleReader{c: up, d: d, last: &last}
	} else {
		src[0], src[1] = client, up
	}
	var once sync.Once
	abort := func() {
		once.Do(func() {
			client.Close()
			up.Close()
		})
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		n, err := copyBuf(client, src[1])
		in = n
		if err != nil {
			abort()
			return
		}
		closeWrite(client)
	}()
	defer func() {
		if !m.limited() {
			m.add(out)
		}
	}()
	if len(pre) > 0 {
		p := pre
		if m.limited() {
			p = pre[:m.reserve(int64(len(pre)))]
		}
		n, err := up.Write(p)
		out += int64(n)
		if err == nil && len(p) < len(pre) {
			err, limited = errByteLimit, true
		}
		if err != nil {
			abort()
			wg.Wait()
			return out, in, limited
		}
	}
	var n int64
	var err error
	if m.limited() {
		n, err = copyMetered(up, src[0], m)
		limited = err == errByteLimit
	} else {
		n, err = copyBuf(up, src[0])
	}
	out += n
	if err != nil {
		abort()
	} else {
		closeWrite(up)
	}
	wg.Wait()
	abort()
	return out, in, limited
}

func copyBuf(dst io.Writer, src io.Reader) (int64, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	if _, ok := src.(*idleReader); ok {
		dst = writerOnly{dst} // use our buffer, not a fresh one
	}
	return io.CopyBuffer(dst, src, *bp)
}

type writerOnly struct{ io.Writer }

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			return
		}
	}
	c.Close()
}

// idleReader reads with a deadline that is extended while either direction
// of the connection (sharing last) moves bytes.
type idleReader struct {
	c    net.Conn
	d    time.Duration
	last *atomic.Int64
}

func (r *idleReader) Read(p []byte) (int, error) {
	for {
		r.c.SetReadDeadline(time.Now().Add(r.d))
		n, err := r.c.Read(p)
		if n > 0 {
			r.last.Store(time.Now().UnixNano())
		}
		if n == 0 && err != nil && errors.Is(err, os.ErrDeadlineExceeded) &&
			time.Since(time.Unix(0, r.last.Load())) < r.d {
			continue
		}
		return n, err
	}
}
