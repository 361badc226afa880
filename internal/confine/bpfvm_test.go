//go:build linux && amd64

package confine

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// seccompData mirrors struct seccomp_data, the input of a seccomp filter.
type seccompData struct {
	nr   uint32
	arch uint32
	ip   uint64
	args [6]uint64
}

func (d seccompData) bytes() []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint32(b[0:], d.nr)
	binary.LittleEndian.PutUint32(b[4:], d.arch)
	binary.LittleEndian.PutUint64(b[8:], d.ip)
	for i, a := range d.args {
		binary.LittleEndian.PutUint64(b[16+8*i:], a)
	}
	return b
}

// runBPF interprets a classic BPF program the way the kernel runs a seccomp
// filter over data. It implements the instructions seccomp accepts and fails
// on anything else, on reads outside data and on jumps outside the program.
func runBPF(prog []unix.SockFilter, data []byte) (uint32, error) {
	var a, x uint32
	var mem [16]uint32
	for pc := 0; ; pc++ {
		if pc < 0 || pc >= len(prog) {
			return 0, fmt.Errorf("pc %d outside program of %d instructions", pc, len(prog))
		}
		ins := prog[pc]
		k := ins.K
		switch ins.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			if k%4 != 0 || int(k)+4 > len(data) {
				return 0, fmt.Errorf("pc %d: bad load offset %d", pc, k)
			}
			a = binary.LittleEndian.Uint32(data[k:])
		case unix.BPF_LD | unix.BPF_W | unix.BPF_LEN:
			a = uint32(len(data))
		case unix.BPF_LD | unix.BPF_IMM:
			a = k
		case unix.BPF_LDX | unix.BPF_IMM:
			x = k
		case unix.BPF_LD | unix.BPF_MEM:
			if k >= 16 {
				return 0, fmt.Errorf("pc %d: bad scratch slot %d", pc, k)
			}
			a = mem[k]
		case unix.BPF_ST:
			if k >= 16 {
				return 0, fmt.Errorf("pc %d: bad scratch slot %d", pc, k)
			}
			mem[k] = a
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_K:
			a &= k
		case unix.BPF_ALU | unix.BPF_OR | unix.BPF_K:
			a |= k
		case unix.BPF_MISC | unix.BPF_TAX:
			x = a
		case unix.BPF_MISC | unix.BPF_TXA:
			a = x
		case unix.BPF_JMP | unix.BPF_JA:
			pc += int(k)
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			var cond bool
			switch ins.Code &^ (unix.BPF_JMP | unix.BPF_K) {
			case unix.BPF_JEQ:
				cond = a == k
			case unix.BPF_JGT:
				cond = a > k
			case unix.BPF_JGE:
				cond = a >= k
			case unix.BPF_JSET:
				cond = a&k != 0
			}
			if cond {
				pc += int(ins.Jt)
			} else {
				pc += int(ins.Jf)
			}
		case unix.BPF_RET | unix.BPF_K:
			return k, nil
		case unix.BPF_RET | unix.BPF_A:
			return a, nil
		default:
			return 0, fmt.Errorf("pc %d: unsupported opcode %#x", pc, ins.Code)
		}
	}
}
