package agent

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

func TestRingKeepsNewestAndReportsDrops(t *testing.T) {
	r := newRing(8)
	r.Write([]byte("abcdef"))
	r.Write([]byte("ghijk"))
	r.Close()
	c := r.Attach(0, false)
	buf := make([]byte, 100)
	n, dropped, _, err := r.Read(c, buf)
	if err != nil || dropped != 3 || string(buf[:n]) != "defghijk" {
		t.Fatalf("read %q dropped %d err %v; want defghijk after 3 dropped", buf[:n], dropped, err)
	}
	if _, _, done, _ := r.Read(c, buf); !done {
		t.Fatal("want done after the end of a closed ring")
	}
	c2 := &cursor{off: 1}
	n, dropped, _, _ = r.Read(c2, buf)
	if dropped != 2 || string(buf[:n]) != "defghijk" {
		t.Fatalf("got %q dropped %d; want 2 dropped", buf[:n], dropped)
	}
}

func TestRingBlockingReaderGetsEverything(t *testing.T) {
	r := newRing(16)
	c := r.Attach(0, true)
	var want bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 1000; i++ {
			line := []byte(time.Duration(i).String() + "\n")
			want.Write(line)
			r.Write(line)
		}
		r.Close()
	}()
	var got bytes.Buffer
	buf := make([]byte, 7)
	for {
		n, dropped, done, err := r.Read(c, buf)
		if err != nil || dropped != 0 {
			t.Fatalf("err %v dropped %d", err, dropped)
		}
		got.Write(buf[:n])
		if done {
			break
		}
	}
	wg.Wait()
	if got.String() != want.String() {
		t.Fatalf("blocking reader lost data: got %d bytes want %d", got.Len(), want.Len())
	}
}

func TestRingDetachUnblocksWriterAndReader(t *testing.T) {
	r := newRing(4)
	c := r.Attach(0, true)
	done := make(chan struct{})
	go func() { r.Write([]byte("0123456789")); close(done) }()
	select {
	case <-done:
		t.Fatal("writer should wait for the blocking reader")
	case <-time.After(50 * time.Millisecond):
	}
	r.Detach(c)
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("writer still blocked after detach")
	}
	if ret, total := r.Len(); ret != 4 || total != 10 {
		t.Fatalf("retained %d total %d", ret, total)
	}
	if _, _, _, err := r.Read(c, make([]byte, 4)); err != errDetached {
		t.Fatalf("read on detached cursor: %v", err)
	}
}

func TestRingTailAndSince(t *testing.T) {
	r := newRing(64)
	r.Write([]byte("one\ntwo\n"))
	time.Sleep(60 * time.Millisecond)
	mid := time.Now()
	r.Write([]byte("three\nfour\n"))
	read := func(off int64) string {
		c := &cursor{off: off}
		buf := make([]byte, 100)
		n, _, _, _ := r.Read(c, buf)
		return string(buf[:n])
	}
	if got := read(r.OffsetTail(1)); got != "four\n" {
		t.Fatalf("tail 1: %q", got)
	}
	if got := read(r.OffsetTail(3)); got != "two\nthree\nfour\n" {
		t.Fatalf("tail 3: %q", got)
	}
	if got := read(r.OffsetTail(10)); got != "one\ntwo\nthree\nfour\n" {
		t.Fatalf("tail 10: %q", got)
	}
	if got := read(r.OffsetSince(mid)); got != "three\nfour\n" {
		t.Fatalf("since: %q", got)
	}
	if off := r.OffsetSince(time.Now().Add(time.Hour)); off != r.End() {
		t.Fatalf("since the future: %d", off)
	}
}
