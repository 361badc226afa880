package fuzztest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// recorder is a testing.TB that keeps the failures Check reports.
type recorder struct {
	testing.TB
	failures []string
}

func (r *recorder) Helper()                       {}
func (r *recorder) Errorf(f string, a ...any)     { r.failures = append(r.failures, fmt.Sprintf(f, a...)) }
func (r *recorder) Fatalf(f string, a ...any)     { r.Errorf(f, a...) }
func (r *recorder) Fatal(a ...any)                { r.failures = append(r.failures, fmt.Sprint(a...)) }
func (r *recorder) TempDir() string               { return r.TB.TempDir() }
func (r *recorder) Cleanup(f func())              { r.TB.Cleanup(f) }
func (r *recorder) Logf(format string, a ...any)  {}
func (r *recorder) Failed() bool                  { return len(r.failures) > 0 }
func (r *recorder) Skipf(format string, a ...any) {}

// TestJailCheck shows that Check passes an extraction that stays in the
// destination and catches each way one can escape: a file created beside
// the destination, a write through a symlink to the sentinel, a hard link
// to it, and a changed mode.
func TestJailCheck(t *testing.T) {
	for name, c := range map[string]struct {
		escape func(j *Jail) error
		fails  bool
	}{
		"inside": {func(j *Jail) error {
			os.MkdirAll(filepath.Join(j.Dest, "a/b"), 0o755)
			os.Symlink("../outside/sentinel", filepath.Join(j.Dest, "l"))
			return os.WriteFile(filepath.Join(j.Dest, "a/b/f"), []byte("x"), 0o644)
		}, false},
		"created beside": {func(j *Jail) error {
			return os.WriteFile(filepath.Join(j.Parent, "pwned"), nil, 0o644)
		}, true},
		"created in outside": {func(j *Jail) error {
			return os.WriteFile(filepath.Join(j.Outside, "pwned"), nil, 0o644)
		}, true},
		"written through a symlink": {func(j *Jail) error {
			l := filepath.Join(j.Dest, "l")
			os.Symlink(j.Sentinel, l)
			return os.WriteFile(l, []byte("overwritten"), 0o644)
		}, true},
		"hard linked": {func(j *Jail) error {
			return os.Link(j.Sentinel, filepath.Join(j.Dest, "h"))
		}, true},
		"chmod": {func(j *Jail) error { return os.Chmod(j.Sentinel, 0o777) }, true},
	} {
		t.Run(name, func(t *testing.T) {
			j := NewJail(t, "dest", true)
			if err := c.escape(j); err != nil {
				t.Fatal(err)
			}
			r := &recorder{TB: t}
			j.Check(r)
			if got := len(r.failures) > 0; got != c.fails {
				t.Fatalf("Check failed %v (%q), want %v", got, r.failures, c.fails)
			}
		})
	}
}

// TestEscapeTars checks the archive seeds are whole tar streams (a broken
// builder would leave the fuzzers only the garbage seeds).
func TestEscapeTars(t *testing.T) {
	seeds := EscapeTars(t, "d")
	if len(seeds) < 8 {
		t.Fatalf("%d seeds", len(seeds))
	}
	for i, s := range seeds[:8] {
		if len(s) < 1024 || len(s)%512 != 0 {
			t.Errorf("seed %d is %d bytes: not a tar stream", i, len(s))
		}
	}
}
