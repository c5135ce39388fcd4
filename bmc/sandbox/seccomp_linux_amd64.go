package sandbox

import "golang.org/x/sys/unix"

const (
	archAudit = unix.AUDIT_ARCH_X86_64
	archX32   = true
)

// allowArch adds amd64's older names for calls arm64 only has as *at variants.
var allowArch = []uint32{
	unix.SYS_ARCH_PRCTL, unix.SYS_OPEN, unix.SYS_STAT, unix.SYS_LSTAT, unix.SYS_ACCESS, unix.SYS_READLINK,
	unix.SYS_PIPE, unix.SYS_POLL, unix.SYS_SELECT, unix.SYS_EPOLL_WAIT, unix.SYS_EPOLL_CREATE,
	unix.SYS_GETDENTS, unix.SYS_MKDIR, unix.SYS_RMDIR, unix.SYS_UNLINK, unix.SYS_DUP2, unix.SYS_TIME,
}
