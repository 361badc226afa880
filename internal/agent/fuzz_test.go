package agent

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"reflect"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/fuzztest"
)

// FuzzExtractTar feeds arbitrary tar streams to the agent's archive upload
// (and the daemon's build-context unpacking) and checks that nothing is
// created or changed outside the target directory: no "..", absolute
// name, symlink or hard link reaches the sibling directory or the host.
func FuzzExtractTar(f *testing.F) {
	for _, s := range fuzztest.EscapeTars(f, "d") {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		j := fuzztest.NewJail(t, "dest", false)
		extractTar(bytes.NewReader(data), j.Dest, nil)
		j.Check(t)
	})
}

// FuzzParseSignal checks that an accepted signal is a real signal number
// (1..64) and that its name parses back to the same number.
func FuzzParseSignal(f *testing.F) {
	for _, s := range []string{"", "TERM", "SIGTERM", "sigterm", "kill", "15", "0", "65", "-9", "+9", "SIG", "sig", "SIGRTMIN", "RTMIN+1", "SIGRTMAX-2", "Int", "9x", "999999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sig, err := ParseSignal(s)
		if err != nil {
			if api.KindOf(err) != api.KindInvalid {
				t.Fatalf("ParseSignal(%q): %v is not an invalid-request error", s, err)
			}
			return
		}
		if sig < 1 || sig > 64 {
			t.Fatalf("ParseSignal(%q) = %d, not a signal", s, sig)
		}
		if back, err := ParseSignal(strconv.Itoa(int(sig))); err != nil || back != sig {
			t.Fatalf("ParseSignal(%q) = %d, whose number parses to %d, %v", s, sig, back, err)
		}
		if name := unix.SignalName(sig); name != "" {
			if back, err := ParseSignal(name); err != nil || back != sig {
				t.Fatalf("ParseSignal(%q) = %d, whose name %s parses to %d, %v", s, sig, name, back, err)
			}
		}
	})
}

// FuzzParseMode checks that an accepted file mode is a permission mode
// (at most 07777) that its octal form parses back to.
func FuzzParseMode(f *testing.F) {
	for _, s := range []string{"", "0644", "644", "7777", "17777", "0o644", "-1", "8", "00000000000000000000000755", "+7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseMode(s)
		if err != nil {
			if api.KindOf(err) != api.KindInvalid {
				t.Fatalf("parseMode(%q): %v is not an invalid-request error", s, err)
			}
			return
		}
		if m > 0o7777 {
			t.Fatalf("parseMode(%q) = %o, beyond 07777", s, m)
		}
		if back, err := parseMode(strconv.FormatUint(uint64(m), 8)); err != nil || back != m {
			t.Fatalf("parseMode(%q) = %o, whose octal form parses to %o, %v", s, m, back, err)
		}
		if fm := modeBits(m); fm&^(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
			t.Fatalf("modeBits(%o) = %v", m, fm)
		}
	})
}

// FuzzTTYControl decodes a terminal WebSocket's text message the way the
// agent does (handleTTY): garbage is ignored, and what is acted on is a
// positive window size or a signal ParseSignal accepts. A decoded control
// message re-encodes to one that decodes equal.
func FuzzTTYControl(f *testing.F) {
	for _, s := range []string{`{"resize":{"rows":24,"cols":80}}`, `{"signal":"INT"}`, `{"signal":"99"}`, `{"resize":{"rows":0,"cols":0}}`, `{"resize":{"rows":70000}}`, `{"exit":{"exit_code":1}}`, `not json`, `{"resize":null,"signal":""}`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		var ctl api.TTYControl
		if json.Unmarshal(msg, &ctl) != nil {
			return
		}
		if ctl.Signal != "" {
			if sig, err := ParseSignal(ctl.Signal); err == nil && (sig < 1 || sig > syscall.Signal(64)) {
				t.Fatalf("signal %q accepted as %d", ctl.Signal, sig)
			}
		}
		b, err := json.Marshal(ctl)
		if err != nil {
			t.Fatal(err)
		}
		var back api.TTYControl
		if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, ctl) {
			t.Fatalf("%s decoded to %+v, re-encoded as %s, decoded again to %+v, %v", msg, ctl, b, back, err)
		}
	})
}
