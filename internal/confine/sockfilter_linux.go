//go:build linux

package confine

import "golang.org/x/sys/unix"

// SockFilter is one classic BPF instruction (struct sock_filter).
type SockFilter = unix.SockFilter
