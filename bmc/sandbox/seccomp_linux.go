//go:build linux && (amd64 || arm64)

package sandbox

import (
	"fmt"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// allowCommon is what a Go plugin that serves gRPC on a unix socket and talks UDP
// and TCP to BMCs calls, by its names on both amd64 and arm64: the runtime
// (memory, signals, threads, timers, the network poller), files for its socket
// directory, and sockets. Measured with strace on bcx-ipmi; see the package doc
// for what is left out on purpose.
var allowCommon = []uint32{
	// I/O on descriptors it has.
	unix.SYS_READ, unix.SYS_WRITE, unix.SYS_READV, unix.SYS_WRITEV, unix.SYS_PREAD64, unix.SYS_PWRITE64,
	unix.SYS_CLOSE, unix.SYS_LSEEK, unix.SYS_FCNTL, unix.SYS_DUP, unix.SYS_DUP3, unix.SYS_FSTAT,
	unix.SYS_FSYNC, unix.SYS_FDATASYNC,
	// Files: its socket directory, /proc/self, /etc/hosts and friends.
	unix.SYS_OPENAT, unix.SYS_NEWFSTATAT, unix.SYS_STATX, unix.SYS_READLINKAT, unix.SYS_GETDENTS64,
	unix.SYS_MKDIRAT, unix.SYS_UNLINKAT, unix.SYS_FCHMOD, unix.SYS_FCHMODAT, unix.SYS_FACCESSAT,
	unix.SYS_FACCESSAT2, unix.SYS_GETCWD, unix.SYS_UMASK,
	// Memory.
	unix.SYS_MMAP, unix.SYS_MUNMAP, unix.SYS_MPROTECT, unix.SYS_MADVISE, unix.SYS_BRK, unix.SYS_MINCORE,
	// Signals.
	unix.SYS_RT_SIGACTION, unix.SYS_RT_SIGPROCMASK, unix.SYS_RT_SIGRETURN, unix.SYS_SIGALTSTACK,
	unix.SYS_TGKILL, unix.SYS_TKILL, unix.SYS_KILL, unix.SYS_RESTART_SYSCALL,
	// Threads and scheduling (clone is ruled: threads only).
	unix.SYS_FUTEX, unix.SYS_GETTID, unix.SYS_SET_ROBUST_LIST, unix.SYS_SET_TID_ADDRESS, unix.SYS_RSEQ,
	unix.SYS_SCHED_YIELD, unix.SYS_SCHED_GETAFFINITY, unix.SYS_EXIT, unix.SYS_EXIT_GROUP,
	// Time.
	unix.SYS_NANOSLEEP, unix.SYS_CLOCK_NANOSLEEP, unix.SYS_CLOCK_GETTIME, unix.SYS_CLOCK_GETRES,
	unix.SYS_GETTIMEOFDAY, unix.SYS_TIMER_CREATE, unix.SYS_TIMER_SETTIME, unix.SYS_TIMER_DELETE,
	unix.SYS_SETITIMER, unix.SYS_GETITIMER,
	// The network poller and its wakeups.
	unix.SYS_EPOLL_CREATE1, unix.SYS_EPOLL_CTL, unix.SYS_EPOLL_PWAIT, unix.SYS_EPOLL_PWAIT2,
	unix.SYS_EVENTFD2, unix.SYS_PIPE2, unix.SYS_PPOLL, unix.SYS_PSELECT6,
	// Sockets (socket itself is ruled: unix, inet and inet6 only).
	unix.SYS_CONNECT, unix.SYS_BIND, unix.SYS_LISTEN, unix.SYS_ACCEPT4, unix.SYS_GETSOCKNAME,
	unix.SYS_GETPEERNAME, unix.SYS_SETSOCKOPT, unix.SYS_GETSOCKOPT, unix.SYS_SENDTO, unix.SYS_RECVFROM,
	unix.SYS_SENDMSG, unix.SYS_RECVMSG, unix.SYS_SENDMMSG, unix.SYS_RECVMMSG, unix.SYS_SHUTDOWN,
	// Who and where it is.
	unix.SYS_GETPID, unix.SYS_GETPPID, unix.SYS_GETUID, unix.SYS_GETEUID, unix.SYS_GETGID,
	unix.SYS_GETEGID, unix.SYS_GETGROUPS, unix.SYS_GETRESUID, unix.SYS_GETRESGID, unix.SYS_UNAME,
	unix.SYS_GETRANDOM, unix.SYS_PRLIMIT64, unix.SYS_GETRLIMIT, unix.SYS_SYSINFO, unix.SYS_CAPGET,
	// The launcher's own execve of the plugin happens under the filter.
	unix.SYS_EXECVE,
}

// Values the ruled syscalls are checked against. x/sys has no names for the three
// generic ioctls; their numbers are the same on amd64 and arm64 (asm-generic).
const (
	ioctlFIONBIO  = 0x5421
	ioctlFIONCLEX = 0x5450
	ioctlFIOCLEX  = 0x5451

	cloneNamespaces = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
		unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET
)

var rulesCommon = map[uint32]Rule{
	// Threads only: a thread shares the plugin's credentials and filter; a child
	// process is something a network client has no use for.
	unix.SYS_CLONE: {Arg: 0, Mask: unix.CLONE_THREAD | cloneNamespaces, Equal: unix.CLONE_THREAD},
	// clone3 passes its flags in memory a filter cannot read; ENOSYS makes callers
	// fall back to clone.
	unix.SYS_CLONE3:     {Errno: errnoENOSYS},
	unix.SYS_SOCKET:     {Arg: 0, OneOf: []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6}},
	unix.SYS_SOCKETPAIR: {Arg: 0, OneOf: []uint32{unix.AF_UNIX}},
	// Naming its own memory mappings and threads (Go labels its heap), nothing of
	// the rest of prctl: no dumpable, no securebits, no seccomp changes.
	unix.SYS_PRCTL: {Arg: 0, OneOf: []uint32{unix.PR_SET_VMA, unix.PR_SET_NAME, unix.PR_GET_NAME}},
	// Terminal queries (isatty) and non-blocking mode; not TIOCSTI and the like.
	unix.SYS_IOCTL: {Arg: 1, OneOf: []uint32{unix.TCGETS, unix.TIOCGWINSZ, unix.TIOCINQ, ioctlFIONBIO, ioctlFIOCLEX, ioctlFIONCLEX}},
}

// FilterPolicy is the confined plugins' policy for the running architecture.
func FilterPolicy() (Policy, error) {
	return Policy{Arch: archAudit, X32: archX32, Allow: append(append([]uint32(nil), allowCommon...), allowArch...), Rules: rulesCommon}, nil
}

// compile assembles a policy into the kernel's struct sock_filter form.
func compile(pol Policy) ([]unix.SockFilter, error) {
	ins, err := Assemble(pol)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(ins)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}
