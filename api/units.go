package api

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Size is a number of bytes. In JSON it is a number of bytes or a string with
// an optional binary unit suffix: "512m", "1.5GiB", "2048k", "100".
type Size int64

// ParseSize parses "512m", "1g", "1.5GiB", "2048" (bytes). Units are binary
// (k = 1024). Negative, fractional-byte and overflowing values are errors.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(strings.ToLower(s))
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	t = strings.TrimSuffix(strings.TrimSuffix(t, "b"), "i")
	mult := float64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k':
			mult, t = 1<<10, t[:n-1]
		case 'm':
			mult, t = 1<<20, t[:n-1]
		case 'g':
			mult, t = 1<<30, t[:n-1]
		case 't':
			mult, t = 1<<40, t[:n-1]
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("bad size %q: want a number of bytes with an optional k, m, g or t suffix, like 512m", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("bad size %q: negative", s)
	}
	v := f * mult
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("bad size %q: too large", s)
	}
	return Size(v), nil
}

func (s Size) String() string {
	switch {
	case s >= 1<<30 && s%(1<<30) == 0:
		return fmt.Sprintf("%dg", s>>30)
	case s >= 1<<20 && s%(1<<20) == 0:
		return fmt.Sprintf("%dm", s>>20)
	case s >= 1<<10 && s%(1<<10) == 0:
		return fmt.Sprintf("%dk", s>>10)
	}
	return strconv.FormatInt(int64(s), 10)
}

// UnmarshalJSON accepts a number of bytes or a size string.
func (s *Size) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		v, err := ParseSize(str)
		if err != nil {
			return err
		}
		*s = v
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("bad size %s: want bytes or a string like \"512m\"", b)
	}
	if n < 0 {
		return fmt.Errorf("bad size %d: negative", n)
	}
	*s = Size(n)
	return nil
}

// Duration is a time.Duration that is a string like "30s" or "1h30m" in JSON.
// A bare JSON number is taken as seconds.
type Duration time.Duration

// ParseDuration parses a Go duration ("30s", "1h") or a bare number of
// seconds. Negative durations are errors.
func ParseDuration(s string) (Duration, error) {
	t := strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(t, 64); err == nil {
		// f*1e9 must stay below 2^63 (float64(MaxInt64)): converting a
		// larger float to an integer overflows to a negative duration.
		if f < 0 || math.IsNaN(f) || f*1e9 >= math.MaxInt64 {
			return 0, fmt.Errorf("bad duration %q: want a non-negative number of seconds below 9223372036", s)
		}
		return Duration(f * 1e9), nil
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return 0, fmt.Errorf("bad duration %q: want a number with a unit, like 30s, 5m or 1h", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("bad duration %q: negative", s)
	}
	return Duration(d), nil
}

func (d Duration) String() string { return time.Duration(d).String() }

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var str string
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
	} else {
		str = string(b)
	}
	v, err := ParseDuration(str)
	if err != nil {
		return err
	}
	*d = v
	return nil
}
