//go:build !amd64

package microvm

func hostTSCkHz() int64 { return 0 }
