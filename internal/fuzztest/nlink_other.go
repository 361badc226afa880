//go:build !unix

package fuzztest

import "os"

func nlink(os.FileInfo) uint64 { return 1 }
