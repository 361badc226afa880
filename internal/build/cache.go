package build

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"sort"
	"strings"
)

// CacheKey is the key of a build step: the parent image's id, the
// instruction (after substitution) and its inputs (for COPY and ADD, the
// ContextDigest). It is a sha256 in hex. Line numbers, the raw text and
// predefined proxy arguments do not take part, so moving an instruction,
// reformatting it or changing proxies keeps the key.
func CacheKey(parent string, ins *Instruction, inputs string) string {
	if ins == nil {
		ins = &Instruction{}
	}
	h := sha256.New()
	put(h, "den build step v1")
	put(h, parent)
	put(h, ins.Cmd)
	if ins.Shell {
		put(h, "shell")
	} else {
		put(h, "exec")
	}
	putList(h, ins.Args)
	kv := make([]string, 0, 2*len(ins.KV))
	for _, p := range ins.KV {
		kv = append(kv, p[0], p[1])
	}
	putList(h, kv)
	keys := make([]string, 0, len(ins.Flags))
	for k := range ins.Flags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	flags := make([]string, 0, 2*len(keys))
	for _, k := range keys {
		flags = append(flags, k, ins.Flags[k])
	}
	putList(h, flags)
	var args []string
	for _, a := range ins.BuildArgs {
		if name, _, _ := strings.Cut(a, "="); !proxyArgs[name] {
			args = append(args, a)
		}
	}
	sort.Strings(args)
	putList(h, args)
	put(h, inputs)
	return hex.EncodeToString(h.Sum(nil))
}

// put writes s length-prefixed, so that no two sequences of fields encode
// alike.
func put(h hash.Hash, s string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s))
}

func putList(h hash.Hash, l []string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(l)))])
	for _, s := range l {
		put(h, s)
	}
}
