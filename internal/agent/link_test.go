package agent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// swapReader reads from whichever stream is current, as an agent reading a
// FIFO or a virtio port does across daemon restarts and restores.
type swapReader struct {
	mu  sync.Mutex
	cur io.Reader
	chg chan struct{}
}

func (s *swapReader) set(r io.Reader) {
	s.mu.Lock()
	s.cur = r
	close(s.chg)
	s.chg = make(chan struct{})
	s.mu.Unlock()
}

func (s *swapReader) Read(p []byte) (int, error) {
	s.mu.Lock()
	r := s.cur
	s.mu.Unlock()
	n, err := r.Read(p)
	if err == io.ErrClosedPipe {
		err = io.EOF
	}
	return n, err
}

type swapWriter struct {
	mu  sync.Mutex
	cur io.Writer
}

func (s *swapWriter) set(w io.Writer) { s.mu.Lock(); s.cur = w; s.mu.Unlock() }
func (s *swapWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	w := s.cur
	s.mu.Unlock()
	return w.Write(p)
}

// stream is the daemon's end of one opened stream.
type stream struct {
	io.Reader
	io.Writer
	closers []io.Closer
}

func (s *stream) Close() error {
	for _, c := range s.closers {
		c.Close()
	}
	return nil
}

// newStream connects a fresh pair of pipes to the agent's swappable ends.
// pre is written to the agent ahead of the daemon's first frame (what a
// restored agent may find: a frame cut in half, stale bytes).
func newStream(ar *swapReader, aw *swapWriter, pre []byte) *stream {
	toAgentR, toAgentW := io.Pipe()
	fromAgentR, fromAgentW := io.Pipe()
	ar.set(io.MultiReader(bytes.NewReader(pre), toAgentR))
	aw.set(fromAgentW)
	return &stream{Reader: fromAgentR, Writer: toAgentW, closers: []io.Closer{toAgentW, fromAgentR}}
}

func echoServer() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, r.Body)
	})
	return mux
}

func startLinkAgent(t *testing.T) (*swapReader, *swapWriter) {
	ar := &swapReader{cur: bytes.NewReader(nil), chg: make(chan struct{})}
	aw := &swapWriter{cur: io.Discard}
	go serveLink(ar, aw, func(ln net.Listener) error { return (&http.Server{Handler: echoServer()}).Serve(ln) })
	return ar, aw
}

func echo(t *testing.T, c *Client, ctx context.Context, body []byte) {
	t.Helper()
	resp, err := c.Do(ctx, "POST", "/echo", nil, bytes.NewReader(body), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("echo of %d bytes came back as %d bytes (equal prefix: %v)", len(body), len(got), bytes.HasPrefix(body, got))
	}
}

func TestLink(t *testing.T) {
	ar, aw := startLinkAgent(t)
	l := NewLink()
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Attach(ctx, newStream(ar, aw, nil)); err != nil {
		t.Fatal(err)
	}
	// Many requests at once, small and large (several frames each way).
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	var wg sync.WaitGroup
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			body := []byte(fmt.Sprintf("request %d", i))
			if i%4 == 0 {
				body = big
			}
			echo(t, l.Client(), ctx, body)
		}(i)
	}
	wg.Wait()

	// Detached (a checkpoint): a request waits for the next session.
	l.Detach()
	done := make(chan struct{})
	go func() { defer close(done); echo(t, l.Client(), ctx, []byte("waited")) }()
	select {
	case <-done:
		t.Fatal("a request went through while the link was detached")
	case <-time.After(200 * time.Millisecond):
	}
	// The restored agent reads a fresh stream that starts with half a
	// frame and junk, and its old session's frames still in flight.
	half := []byte{linkSync, linkData, 0, 0, 0, 0, 0, 9, 0, 0, 1, 0, 'x', 'y'}
	junk := append(half, bytes.Repeat([]byte{linkSync, linkReset}, 100)...)
	if err := l.Attach(ctx, newStream(ar, aw, junk)); err != nil {
		t.Fatal(err)
	}
	<-done
	echo(t, l.Client(), ctx, big)
}

func TestLinkNoAgent(t *testing.T) {
	// The other end never answers: Attach gives up with the context.
	r, w := io.Pipe()
	defer w.Close()
	go io.Copy(io.Discard, r)
	silent, _ := io.Pipe()
	l := NewLink()
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	err := l.Attach(ctx, &stream{Reader: silent, Writer: w, closers: []io.Closer{w, silent}})
	if err == nil {
		t.Fatal("attach to a silent stream succeeded")
	}
	l.Close()
	if _, err := l.Client().Do(context.Background(), "GET", "/x", nil, nil, nil); err == nil {
		t.Fatal("a request on a closed link succeeded")
	}
}

func FuzzReadFrame(f *testing.F) {
	var good bytes.Buffer
	fw := &frameWriter{w: &good}
	fw.write(linkReset, 7, linkMagic)
	fw.write(linkData, 7, []byte("hello"))
	f.Add(good.Bytes())
	f.Add([]byte{linkSync, linkData, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReader(bytes.NewReader(b))
		for {
			typ, epoch, p, err := readFrame(br)
			if err != nil {
				return
			}
			if epoch == 0 || len(p) > linkMaxData || (typ != linkData && !bytes.Equal(p, linkMagic)) {
				t.Fatalf("bad frame accepted: type %d epoch %d len %d", typ, epoch, len(p))
			}
		}
	})
}
