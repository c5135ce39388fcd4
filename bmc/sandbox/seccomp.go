package sandbox

import (
	"fmt"
	"maps"
	"slices"

	"golang.org/x/net/bpf"
)

// Offsets into struct seccomp_data, which a filter reads with 32-bit loads in the
// host's byte order: nr, arch, instruction_pointer, then args[6] of 64 bits each.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// argLow is the offset of the low 32 bits of argument i (little-endian hosts:
// amd64 and arm64, the only ones with a syscall table here).
func argLow(i int) uint32 { return uint32(offArgs + 8*i) }

// Seccomp return values.
const (
	retAllow       = 0x7fff0000 // SECCOMP_RET_ALLOW
	retErrno       = 0x00050000 // SECCOMP_RET_ERRNO | errno
	retKillProcess = 0x80000000 // SECCOMP_RET_KILL_PROCESS
	errnoEPERM     = 1
	errnoENOSYS    = 38
)

// Rule is what the filter does with one syscall beyond allowing it outright.
type Rule struct {
	// Arg is the argument whose low 32 bits are checked.
	Arg int
	// Mask, when non-zero, is applied before comparing: the call is allowed when
	// arg&Mask == Equal.
	Mask, Equal uint32
	// OneOf allows the call when the argument is one of these values (Mask zero).
	OneOf []uint32
	// Errno, when non-zero, refuses the call outright with this errno instead of
	// looking at its arguments (clone3 answers ENOSYS, so callers fall back to
	// clone, whose flags a filter can read).
	Errno uint32
}

// Policy is a filter before assembly: the audit arch it is for, the syscalls it
// allows, and the ones it checks.
type Policy struct {
	Arch uint32
	// X32 marks amd64, whose x32 syscalls (numbers with bit 30 set) are killed.
	X32   bool
	Allow []uint32
	Rules map[uint32]Rule
}

// prog is a program under construction: instructions with symbolic jumps.
type prog struct {
	ins    []bpf.Instruction
	labels map[string]int
	fixups []fixup
}

type fixup struct {
	at            int
	ifTrue, ifNot string // label names; "" means the next instruction
}

func (p *prog) emit(i bpf.Instruction) { p.ins = append(p.ins, i) }

func (p *prog) label(name string) { p.labels[name] = len(p.ins) }

// jump emits a conditional jump to labels resolved at assembly.
func (p *prog) jump(cond bpf.JumpTest, val uint32, ifTrue, ifNot string) {
	p.fixups = append(p.fixups, fixup{at: len(p.ins), ifTrue: ifTrue, ifNot: ifNot})
	p.emit(bpf.JumpIf{Cond: cond, Val: val})
}

func (p *prog) resolve() ([]bpf.Instruction, error) {
	for _, f := range p.fixups {
		j := p.ins[f.at].(bpf.JumpIf)
		skip := func(label string) (uint8, error) {
			if label == "" {
				return 0, nil
			}
			to, ok := p.labels[label]
			if !ok {
				return 0, fmt.Errorf("seccomp: no label %q", label)
			}
			d := to - f.at - 1
			if d < 0 || d > 255 {
				return 0, fmt.Errorf("seccomp: jump from %d to %s (%d) is out of range", f.at, label, to)
			}
			return uint8(d), nil
		}
		var err error
		if j.SkipTrue, err = skip(f.ifTrue); err != nil {
			return nil, err
		}
		if j.SkipFalse, err = skip(f.ifNot); err != nil {
			return nil, err
		}
		p.ins[f.at] = j
	}
	return p.ins, nil
}

// Assemble turns the policy into a classic BPF program for seccomp:
//
//	arch != Arch                     → kill the process
//	nr & 0x40000000 (x32, on amd64)  → kill the process
//	nr has a Rule                    → its checks: allow, or EPERM (or its Errno)
//	nr in Allow                      → allow
//	anything else                    → EPERM
func Assemble(pol Policy) ([]bpf.Instruction, error) {
	p := &prog{labels: map[string]int{}}
	// BPF jumps only forward, so every refusal at the top has its return right
	// after its test.
	p.emit(bpf.LoadAbsolute{Off: offArch, Size: 4})
	p.jump(bpf.JumpEqual, pol.Arch, "arch-ok", "")
	p.emit(bpf.RetConstant{Val: retKillProcess})
	p.label("arch-ok")
	p.emit(bpf.LoadAbsolute{Off: offNr, Size: 4})
	if pol.X32 {
		p.jump(bpf.JumpBitsSet, 0x40000000, "", "nr-ok")
		p.emit(bpf.RetConstant{Val: retKillProcess})
		p.label("nr-ok")
	}
	ruled := slices.Sorted(maps.Keys(pol.Rules))
	for _, nr := range ruled {
		p.jump(bpf.JumpEqual, nr, fmt.Sprintf("rule%d", nr), "")
	}
	allow := slices.Clone(pol.Allow)
	slices.Sort(allow)
	allow = slices.Compact(allow)
	for _, nr := range allow {
		if _, ok := pol.Rules[nr]; ok {
			return nil, fmt.Errorf("seccomp: syscall %d is both allowed and ruled", nr)
		}
		p.jump(bpf.JumpEqual, nr, "allow", "")
	}
	p.emit(bpf.RetConstant{Val: retErrno | errnoEPERM})
	p.label("allow")
	p.emit(bpf.RetConstant{Val: retAllow})
	for _, nr := range ruled {
		r := pol.Rules[nr]
		ok := fmt.Sprintf("rule%d-allow", nr)
		p.label(fmt.Sprintf("rule%d", nr))
		switch {
		case r.Errno != 0:
			p.emit(bpf.RetConstant{Val: retErrno | r.Errno})
			continue
		case r.Mask != 0:
			p.emit(bpf.LoadAbsolute{Off: argLow(r.Arg), Size: 4})
			p.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: r.Mask})
			p.jump(bpf.JumpEqual, r.Equal, ok, "")
		case len(r.OneOf) > 0:
			p.emit(bpf.LoadAbsolute{Off: argLow(r.Arg), Size: 4})
			for _, v := range r.OneOf {
				p.jump(bpf.JumpEqual, v, ok, "")
			}
		default:
			return nil, fmt.Errorf("seccomp: rule for syscall %d checks nothing", nr)
		}
		p.emit(bpf.RetConstant{Val: retErrno | errnoEPERM})
		p.label(ok)
		p.emit(bpf.RetConstant{Val: retAllow})
	}
	return p.resolve()
}
