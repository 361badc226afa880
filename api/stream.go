package api

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// StreamContentType is the media type of a framed output stream. A client
// asks for it with an Accept header on exec; otherwise exec answers JSON.
const StreamContentType = "application/vnd.den.stream"

// Frame types of a framed stream. Each frame is one type byte, a 4-byte
// big-endian payload length and the payload.
const (
	FrameStdout  byte = 1 // payload: bytes the command wrote to stdout
	FrameStderr  byte = 2 // payload: bytes written to stderr
	FrameExit    byte = 3 // payload: ExitStatus as JSON; the last frame
	FrameError   byte = 4 // payload: Error as JSON; the last frame
	FrameStarted byte = 5 // payload: Process as JSON
	FrameDropped byte = 6 // payload: DroppedOutput as JSON
)

// MaxFramePayload bounds a frame's payload; readers refuse larger frames.
const MaxFramePayload = 1 << 20

// Process identifies a started command inside a sandbox.
type Process struct {
	ID  string `json:"id"`
	Pid int    `json:"pid"`
}

// DroppedOutput reports output that was discarded because a reader fell
// behind the bounded buffer.
type DroppedOutput struct {
	Bytes int64 `json:"bytes"`
}

// WriteFrame writes one frame. Payloads longer than MaxFramePayload are split.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	for {
		n := len(payload)
		if n > MaxFramePayload {
			n = MaxFramePayload
		}
		var hdr [5]byte
		hdr[0] = typ
		binary.BigEndian.PutUint32(hdr[1:], uint32(n))
		if _, err := w.Write(hdr[:]); err != nil {
			return err
		}
		if _, err := w.Write(payload[:n]); err != nil {
			return err
		}
		payload = payload[n:]
		if len(payload) == 0 {
			return nil
		}
	}
}

// WriteJSONFrame writes v as the JSON payload of one frame.
func WriteJSONFrame(w io.Writer, typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFrame(w, typ, b)
}

// FrameReader reads frames from a stream.
type FrameReader struct {
	r   io.Reader
	buf []byte
}

// NewFrameReader returns a reader of the frames in r.
func NewFrameReader(r io.Reader) *FrameReader { return &FrameReader{r: r} }

// Next returns the next frame. The payload is valid until the next call.
// At a clean end of stream it returns io.EOF.
func (f *FrameReader) Next() (typ byte, payload []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(f.r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, fmt.Errorf("read frame header: %w", err)
		}
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFramePayload {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds the %d byte limit", n, MaxFramePayload)
	}
	if hdr[0] < FrameStdout || hdr[0] > FrameDropped {
		return 0, nil, fmt.Errorf("unknown frame type %d", hdr[0])
	}
	if cap(f.buf) < int(n) {
		f.buf = make([]byte, n)
	}
	f.buf = f.buf[:n]
	if _, err := io.ReadFull(f.r, f.buf); err != nil {
		return 0, nil, fmt.Errorf("read frame payload: %w", err)
	}
	return hdr[0], f.buf, nil
}
