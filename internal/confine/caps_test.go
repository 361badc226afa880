package confine

import (
	"slices"
	"testing"
)

func TestDefaultCaps(t *testing.T) {
	p := Default()
	if !p.NoNewPrivs || !p.Seccomp || p.Inheritable {
		t.Errorf("Default() = %+v, want NoNewPrivs and Seccomp on, Inheritable off", p)
	}
	want := []string{
		"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
		"CAP_KILL", "CAP_MKNOD", "CAP_NET_BIND_SERVICE", "CAP_SETFCAP", "CAP_SETGID",
		"CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT",
	}
	got := CapNames(p.Caps)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("Default caps = %v, want %v", got, want)
	}
	m, err := CapMask(p.Caps)
	if err != nil {
		t.Fatal(err)
	}
	// Docker's default set is 0xa80425fb; Default drops CAP_NET_RAW (bit 13).
	if want := uint64(0xa80425fb) &^ (1 << 13); m != want {
		t.Errorf("CapMask(Default) = %#x, want %#x", m, want)
	}
	// Default must return a fresh slice each time.
	p.Caps[0] = CapSysAdmin
	if slices.Contains(Default().Caps, CapSysAdmin) {
		t.Error("Default() shares its Caps slice between calls")
	}
}

func TestParseCap(t *testing.T) {
	for in, want := range map[string]Cap{
		"CAP_NET_RAW": CapNetRaw, "net_raw": CapNetRaw, " Sys_Admin ": CapSysAdmin,
		"cap_checkpoint_restore": CapCheckpointRestore, "12": CapNetAdmin, "CAP_63": 63,
	} {
		got, err := ParseCap(in)
		if err != nil || got != want {
			t.Errorf("ParseCap(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "CAP_", "NET_RAWR", "64", "-1", "CAP_SYS_ADMIN2"} {
		if c, err := ParseCap(in); err == nil {
			t.Errorf("ParseCap(%q) = %v, want an error", in, c)
		}
	}
	for c := CapChown; c <= CapCheckpointRestore; c++ {
		if back, err := ParseCap(c.String()); err != nil || back != c {
			t.Errorf("ParseCap(%q) = %v, %v; want %d", c.String(), back, err, int(c))
		}
	}
	if s := Cap(50).String(); s != "CAP_50" {
		t.Errorf("Cap(50).String() = %q", s)
	}
}

func TestCapMaskRejectsOutOfRange(t *testing.T) {
	for _, c := range []Cap{-1, 64, 1000} {
		if _, err := CapMask([]Cap{CapChown, c}); err == nil {
			t.Errorf("CapMask accepted %d", int(c))
		}
	}
	if m, err := CapMask([]Cap{0, 63}); err != nil || m != 1|1<<63 {
		t.Errorf("CapMask(0, 63) = %#x, %v", m, err)
	}
}
