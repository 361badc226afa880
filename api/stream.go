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

// ExecFrame is one frame of an exec or log output stream before its last,
// as ReadExecStream hands it on.
type ExecFrame struct {
	// Type is FrameStarted, FrameStdout, FrameStderr or FrameDropped.
	Type byte
	// Payload is the frame's payload as it came: output bytes, or the JSON
	// the fields below were decoded from. It is valid until the callback
	// returns.
	Payload []byte
	// Started is the process a FrameStarted frame names.
	Started Process
	// Dropped is how much output a FrameDropped frame says was dropped.
	Dropped DroppedOutput
}

// ReadExecStream reads a framed exec or log output stream (StreamContentType)
// to its last frame. It is the one decoder of that stream: the daemon reads
// an agent's with it and the Go SDK reads the daemon's. Each frame before the
// last goes to each as it is read, its JSON payload (started, dropped)
// decoded; the exit frame's status is returned.
//
// It fails with an error frame's *Error (an internal one when the frame
// names no kind); with io.EOF when the stream ends cleanly before a last
// frame (a log read without follow); with each's error, unchanged; and
// otherwise with an error, its message starting "output stream", saying how
// the stream broke: cut off, an over-long or unknown frame, or a frame whose
// JSON does not decode.
func ReadExecStream(r io.Reader, each func(*ExecFrame) error) (*ExitStatus, error) {
	fr := NewFrameReader(r)
	for {
		typ, p, err := fr.Next()
		if err == io.EOF {
			return nil, io.EOF
		}
		if err != nil {
			return nil, fmt.Errorf("output stream ended without an exit status: %w", err)
		}
		f := ExecFrame{Type: typ, Payload: p}
		switch typ {
		case FrameExit:
			var st ExitStatus
			if err := json.Unmarshal(p, &st); err != nil {
				return nil, fmt.Errorf("output stream: bad exit frame: %w", err)
			}
			return &st, nil
		case FrameError:
			var e Error
			if err := json.Unmarshal(p, &e); err != nil {
				return nil, fmt.Errorf("output stream: bad error frame: %w", err)
			}
			if e.Kind == "" {
				e.Kind = KindInternal
			}
			return nil, &e
		case FrameStarted:
			if err := json.Unmarshal(p, &f.Started); err != nil {
				return nil, fmt.Errorf("output stream: bad started frame: %w", err)
			}
		case FrameDropped:
			if err := json.Unmarshal(p, &f.Dropped); err != nil {
				return nil, fmt.Errorf("output stream: bad dropped-output frame: %w", err)
			}
		}
		if err := each(&f); err != nil {
			return nil, err
		}
	}
}
