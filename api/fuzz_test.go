package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strconv"
	"testing"
)

// FuzzParseSize checks that every accepted size is a whole, non-negative
// number of bytes that survives its own String form and the JSON string and
// number forms unchanged.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"512m", "1g", "1.5GiB", "2048", "100", "0", " 2k ", "1t", "1kb", "1.5", "0.5k", "-1", "1e3", "nan", "inf", "9.3e18", "8191.9999999t", "0x10", "k", "", "1ib"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err != nil {
			return
		}
		if v < 0 {
			t.Fatalf("ParseSize(%q) = %d, negative", s, v)
		}
		back, err := ParseSize(v.String())
		if err != nil || back != v {
			t.Fatalf("ParseSize(%q) = %d, whose String %q parses to %d, %v", s, v, v.String(), back, err)
		}
		// A whole number of bytes: the same size written out in bytes.
		if bytesForm, err := ParseSize(strconv.FormatInt(int64(v), 10)); err != nil || bytesForm != v {
			t.Fatalf("ParseSize(%q) = %d, not a whole number of bytes (%d, %v)", s, v, bytesForm, err)
		}
		var js, jn Size
		q, _ := json.Marshal(s)
		if err := json.Unmarshal(q, &js); err != nil || js != v {
			t.Fatalf("JSON %s = %d, %v; ParseSize = %d", q, js, err, v)
		}
		if err := json.Unmarshal([]byte(strconv.FormatInt(int64(v), 10)), &jn); err != nil || jn != v {
			t.Fatalf("JSON number %d = %d, %v", v, jn, err)
		}
	})
}

// FuzzParseDuration checks that every accepted duration is non-negative and
// survives its String form and a JSON round trip unchanged.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"30s", "1h30m", "5m", "0", "1.5", "1e-10", "-1s", "-0", "9223372036", "2562047h47m16.854775807s", "2562047h47m16.854775808s", "1e309", "NaN", "+Inf", " 10 ", "1x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err != nil {
			return
		}
		if d < 0 {
			t.Fatalf("ParseDuration(%q) = %v, negative", s, d)
		}
		back, err := ParseDuration(d.String())
		if err != nil || back != d {
			t.Fatalf("ParseDuration(%q) = %v, whose String parses to %v, %v", s, d, back, err)
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		var j Duration
		if err := json.Unmarshal(b, &j); err != nil || j != d {
			t.Fatalf("JSON round trip of %v via %s = %v, %v", d, b, j, err)
		}
	})
}

// FuzzFrameReader reads arbitrary bytes as a framed stream and checks that
// every frame it accepts has a known type and a bounded payload, and that
// writing the accepted frames back gives exactly the bytes they were read
// from (nothing skipped, nothing invented).
func FuzzFrameReader(f *testing.F) {
	var good bytes.Buffer
	WriteFrame(&good, FrameStarted, []byte(`{"id":"p1","pid":7}`))
	WriteFrame(&good, FrameStdout, []byte("hello\n"))
	WriteFrame(&good, FrameStderr, nil)
	WriteJSONFrame(&good, FrameDropped, DroppedOutput{Bytes: 10})
	WriteJSONFrame(&good, FrameExit, ExitStatus{ExitCode: 3})
	f.Add(good.Bytes())
	f.Add([]byte{FrameStdout, 0, 0, 0, 5, 'a'})                   // truncated payload
	f.Add([]byte{FrameStdout, 0, 0x10, 0, 1})                     // over the limit
	f.Add([]byte{0, 0, 0, 0, 0})                                  // unknown type
	f.Add([]byte{FrameError, 0, 0, 0, 2, '{', '}', FrameExit, 0}) // truncated header
	f.Fuzz(func(t *testing.T, data []byte) {
		fr := NewFrameReader(bytes.NewReader(data))
		var again bytes.Buffer
		for {
			typ, p, err := fr.Next()
			if err != nil {
				if err == io.EOF && again.Len() != len(data) {
					t.Fatalf("clean EOF after %d of %d bytes", again.Len(), len(data))
				}
				break
			}
			if typ < FrameStdout || typ > FrameDropped || len(p) > MaxFramePayload {
				t.Fatalf("accepted frame type %d with %d bytes", typ, len(p))
			}
			if err := WriteFrame(&again, typ, p); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.HasPrefix(data, again.Bytes()) {
			t.Fatalf("re-encoded frames %x are not the prefix of the input %x", again.Bytes(), data)
		}
	})
}

// FuzzReadExecStream reads arbitrary bytes as an exec output stream with
// the one decoder the daemon and the Go SDK share. It checks that only
// started, stdout, stderr and dropped frames are handed on, with their JSON
// decoded from the payload; that the frames handed on re-encode to the
// start of the input, all of it at a clean end; and that the outcome is one
// of an exit status, an error frame's *Error with a kind, io.EOF, or an
// error saying how the stream broke.
func FuzzReadExecStream(f *testing.F) {
	var good bytes.Buffer
	WriteJSONFrame(&good, FrameStarted, Process{ID: "p1", Pid: 7})
	WriteFrame(&good, FrameStdout, []byte("hello\n"))
	WriteJSONFrame(&good, FrameDropped, DroppedOutput{Bytes: 10})
	WriteFrame(&good, FrameStderr, []byte("oops"))
	WriteJSONFrame(&good, FrameExit, ExitStatus{ExitCode: 3, Reason: ReasonExited})
	f.Add(good.Bytes())
	var failed bytes.Buffer
	WriteFrame(&failed, FrameStdout, []byte("x"))
	WriteJSONFrame(&failed, FrameError, Errorf(KindConflict, "stopped"))
	f.Add(failed.Bytes())
	f.Add([]byte{FrameStarted, 0, 0, 0, 1, '{'})                 // bad started JSON
	f.Add([]byte{FrameExit, 0, 0, 0, 2, '{', '}'})               // exit, no fields
	f.Add([]byte{FrameError, 0, 0, 0, 2, '{', '}'})              // error without a kind
	f.Add([]byte{FrameStdout, 0, 0, 0, 1, 'a'})                  // clean end, no exit
	f.Add([]byte{FrameDropped, 0, 0, 0, 4, 'n', 'u', 'l', 'l'})  // null dropped count
	f.Add([]byte{FrameStdout, 0, 0, 0, 5, 'a', FrameExit, 0, 0}) // truncated
	f.Fuzz(func(t *testing.T, data []byte) {
		var again bytes.Buffer
		st, err := ReadExecStream(bytes.NewReader(data), func(fr *ExecFrame) error {
			switch fr.Type {
			case FrameStarted:
				var p Process
				if json.Unmarshal(fr.Payload, &p) != nil || p != fr.Started {
					t.Fatalf("started frame %q handed on as %+v", fr.Payload, fr.Started)
				}
			case FrameDropped:
				var d DroppedOutput
				if json.Unmarshal(fr.Payload, &d) != nil || d != fr.Dropped {
					t.Fatalf("dropped frame %q handed on as %+v", fr.Payload, fr.Dropped)
				}
			case FrameStdout, FrameStderr:
			default:
				t.Fatalf("frame type %d handed on", fr.Type)
			}
			return WriteFrame(&again, fr.Type, fr.Payload)
		})
		if !bytes.HasPrefix(data, again.Bytes()) {
			t.Fatalf("frames handed on %x are not the start of the input %x", again.Bytes(), data)
		}
		var ae *Error
		switch {
		case err == nil:
			if st == nil {
				t.Fatal("no status and no error")
			}
			if rest := data[again.Len():]; len(rest) < 5 || rest[0] != FrameExit {
				t.Fatalf("status %+v without an exit frame next in %x", st, rest)
			}
		case st != nil:
			t.Fatalf("status %+v with error %v", st, err)
		case err == io.EOF:
			if again.Len() != len(data) {
				t.Fatalf("clean end after %d of %d bytes", again.Len(), len(data))
			}
		case errors.As(err, &ae):
			if ae.Kind == "" {
				t.Fatalf("error frame's error %+v has no kind", ae)
			}
			if rest := data[again.Len():]; len(rest) < 5 || rest[0] != FrameError {
				t.Fatalf("error %v without an error frame next in %x", err, rest)
			}
		case err.Error() == "":
			t.Fatal("an error without a message")
		}
	})
}

// FuzzSizeJSON decodes arbitrary JSON values as a Size: an accepted value
// is never negative and its byte count decodes back to itself.
func FuzzSizeJSON(f *testing.F) {
	for _, s := range []string{`"512m"`, `1024`, `-1`, `1.5`, `"x"`, `null`, `true`, `"-0"`, `1e30`, `"1e30"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Size
		if err := json.Unmarshal(b, &s); err != nil {
			return
		}
		if s < 0 || float64(s) >= math.MaxInt64 {
			t.Fatalf("JSON %s decoded to %d", b, s)
		}
		var back Size
		if err := json.Unmarshal([]byte(strconv.FormatInt(int64(s), 10)), &back); err != nil || back != s {
			t.Fatalf("JSON %s = %d, which decodes back to %d, %v", b, s, back, err)
		}
	})
}
