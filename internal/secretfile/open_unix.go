//go:build unix

package secretfile

import (
	"io/fs"
	"syscall"
)

// O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; it
// changes nothing for a regular file. O_NOCTTY: a terminal device never becomes
// the controlling one.
const (
	openFlags = syscall.O_NONBLOCK | syscall.O_NOCTTY
	noFollow  = syscall.O_NOFOLLOW
)

// links is fi's hard link count; false when fi carries no stat.
func links(fi fs.FileInfo) (uint64, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return uint64(st.Nlink), true
}
