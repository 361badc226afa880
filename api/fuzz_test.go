package api

import (
	"bytes"
	"encoding/json"
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
