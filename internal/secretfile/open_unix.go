//go:build unix

package secretfile

import "syscall"

// O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; it
// changes nothing for a regular file. O_NOCTTY: a terminal device never becomes
// the controlling one.
const (
	openFlags = syscall.O_NONBLOCK | syscall.O_NOCTTY
	noFollow  = syscall.O_NOFOLLOW
)
