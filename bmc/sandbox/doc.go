// Package sandbox confines a plugin process: its own uid and gid, no capabilities
// (bounding and ambient sets included), no_new_privs, a seccomp filter, resource
// limits, and a cgroup of its own with memory.max and pids.max.
//
// Most of it happens in the plugin's process between fork and exec, which Go's
// os/exec cannot do (it has no hook to install a seccomp filter), so bcd re-executes
// itself as a small launcher, the hidden command `bcd plugin-exec`, which Exec
// implements: it starts as root inside the plugin's cgroup (clone3 with
// CLONE_INTO_CGROUP, through SysProcAttr.CgroupFD), sets the resource limits, drops
// the capability bounding set and the ambient set, switches to the plugin's gid and
// uid (which empties the permitted and effective sets), re-arms the parent-death
// signal, sets no_new_privs, installs the seccomp filter, and execs the plugin
// binary through the file descriptor the host verified, so the bytes that run are
// the bytes whose SHA-256 was checked (by a symlink named after the plugin that
// points at /proc/self/fd/N, so ps shows the plugin's name). Its resource limits:
// RLIMIT_NOFILE 1024, RLIMIT_NPROC pids_max (per uid, and the uid is the plugin's
// own) and RLIMIT_CORE 0, since a core dump of a BMC driver would hold passwords.
//
// # The plugin's uid
//
// A plugin named N runs as the user bcx-N when /etc/passwd has one (an operator may
// create it, e.g. `useradd --system --no-create-home --shell /usr/sbin/nologin
// bcx-ipmi`). Otherwise it runs as a fixed uid and gid derived from its name in the
// range UIDBase to UIDBase+UIDRange-1 (0x70000000-0x70ffffff), far above the ranges
// distributions, systemd's dynamic users and the usual subuid allocations use; bcd
// refuses a derived uid that /etc/passwd gives to someone else. A plugin owns no
// files, so no account is needed. Root and bcd's own uid are never used.
//
// # The seccomp filter
//
// An allow list: what a Go program that serves gRPC on a unix socket and speaks UDP
// and TCP to BMCs calls. clone is allowed only to create threads (CLONE_THREAD, no
// namespace flags), so a plugin cannot fork; socket only for AF_UNIX, AF_INET and
// AF_INET6; ioctl only for the terminal and non-blocking queries Go's runtime makes.
// Everything else (ptrace, mount, umount2, kexec_load, kexec_file_load, bpf,
// init_module, finit_module, delete_module, reboot, swapon, pivot_root, unshare,
// setns, keyctl, perf_event_open, io_uring, userfaultfd, ...) fails with EPERM; a
// call from another architecture's syscall table (x32, a foreign audit arch) kills
// the process.
//
// # Privileged plugins
//
// A plugin named in [plugins] privileged keeps bcd's uid and capabilities and gets
// no seccomp filter, since a runtime plugin that runs VMs needs mounts, namespaces
// and device nodes; its resource limits and cgroup are the same as everyone's.
//
// # The cgroup
//
// Cgroup prepares [plugins] cgroup as the spec says: it is a child of bcd's
// delegated cgroup; bcd enables the memory and pids controllers in its parent and
// in it, first moving the parent's processes into a "main" leaf when the parent
// holds any (systemd older than 254 ignores DelegateSubgroup=main, and cgroup v2
// gives no controllers to the children of a cgroup that holds processes). Each
// plugin gets a child with memory.max, pids.max, memory.swap.max 0 and
// memory.oom.group 1. Only cgroup v2 is supported.
package sandbox
