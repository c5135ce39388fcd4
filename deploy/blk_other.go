//go:build !linux

package deploy

import (
	"errors"
	"os"
)

// errUnsupported: deploying needs Linux block device ioctls and kexec.
var errUnsupported = errors.New("deploy: only supported on Linux")

func blockSize(*os.File) (int64, int, error)                   { return 0, 0, errUnsupported }
func zeroOut(*os.File, int64, int64) error                     { return errUnsupported }
func rereadPartitions(*os.File) error                          { return errUnsupported }
func writeZeroesOffloaded(*os.File) bool                       { return false }
func blockDiskName(string) (string, bool, error)               { return "", false, errUnsupported }
func openBlock(string) (*os.File, *os.File, error)             { return nil, nil, errUnsupported }
func openFileTarget(string, int64) (*os.File, *os.File, error) { return nil, nil, errUnsupported }
func isDirect(*os.File) bool                                   { return false }

// HostMachine is the running kernel; off Linux it can do nothing.
type HostMachine struct{}

// KexecLoad is not supported off Linux.
func (HostMachine) KexecLoad(kernel, initrd *os.File, cmdline string) error { return errUnsupported }

// KexecExec is not supported off Linux.
func (HostMachine) KexecExec() error { return errUnsupported }

// Reboot is not supported off Linux.
func (HostMachine) Reboot() error { return errUnsupported }

// PowerOff is not supported off Linux.
func (HostMachine) PowerOff() error { return errUnsupported }
