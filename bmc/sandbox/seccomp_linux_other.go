//go:build linux && !amd64 && !arm64

package sandbox

import (
	"errors"

	"golang.org/x/sys/unix"
)

const (
	archAudit = 0
	archX32   = false
)

var allowArch []uint32

// FilterPolicy has no syscall table to work from on this architecture.
func FilterPolicy() (Policy, error) {
	return Policy{}, errors.New("seccomp: no syscall table for this architecture: confined plugins cannot run here")
}

func compile(Policy) ([]unix.SockFilter, error) {
	return nil, errors.New("seccomp: no syscall table for this architecture")
}
