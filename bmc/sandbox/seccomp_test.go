//go:build linux && (amd64 || arm64)

package sandbox

import (
	"encoding/binary"
	"strings"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompData builds a struct seccomp_data for x/net/bpf's VM, which loads words
// big-endian where the kernel loads them in host order: each 32-bit word is put
// where the kernel would find it, with the value the kernel would read.
func seccompData(arch, nr uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[offNr:], nr)
	binary.BigEndian.PutUint32(b[offArch:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(b[argLow(i):], uint32(a))
		binary.BigEndian.PutUint32(b[argLow(i)+4:], uint32(a>>32))
	}
	return b
}

func runFilter(t *testing.T, vm *bpf.VM, arch, nr uint32, args ...uint64) uint32 {
	t.Helper()
	v, err := vm.Run(seccompData(arch, nr, args...))
	if err != nil {
		t.Fatalf("filter failed on syscall %d: %v", nr, err)
	}
	return uint32(v)
}

func TestFilterDecisions(t *testing.T) {
	pol, err := FilterPolicy()
	if err != nil {
		t.Fatal(err)
	}
	ins, err := Assemble(pol)
	if err != nil {
		t.Fatal(err)
	}
	if len(ins) > 4096 {
		t.Fatalf("%d instructions: the kernel takes at most 4096", len(ins))
	}
	vm, err := bpf.NewVM(ins)
	if err != nil {
		t.Fatalf("the VM refuses the program: %v", err)
	}
	if _, err := compile(pol); err != nil {
		t.Fatal(err)
	}
	arch := pol.Arch
	eperm := uint32(retErrno | errnoEPERM)

	allowed := map[string]uint32{"read": unix.SYS_READ, "futex": unix.SYS_FUTEX, "mmap": unix.SYS_MMAP,
		"connect": unix.SYS_CONNECT, "sendto": unix.SYS_SENDTO, "epoll_pwait": unix.SYS_EPOLL_PWAIT,
		"execve": unix.SYS_EXECVE, "exit_group": unix.SYS_EXIT_GROUP, "getrandom": unix.SYS_GETRANDOM}
	for name, nr := range allowed {
		if got := runFilter(t, vm, arch, nr); got != retAllow {
			t.Errorf("%s: %#x, want allow", name, got)
		}
	}
	refused := map[string]uint32{
		"ptrace": unix.SYS_PTRACE, "mount": unix.SYS_MOUNT, "umount2": unix.SYS_UMOUNT2,
		"kexec_load": unix.SYS_KEXEC_LOAD, "kexec_file_load": unix.SYS_KEXEC_FILE_LOAD, "bpf": unix.SYS_BPF,
		"init_module": unix.SYS_INIT_MODULE, "finit_module": unix.SYS_FINIT_MODULE,
		"delete_module": unix.SYS_DELETE_MODULE, "reboot": unix.SYS_REBOOT, "swapon": unix.SYS_SWAPON,
		"swapoff": unix.SYS_SWAPOFF, "pivot_root": unix.SYS_PIVOT_ROOT, "unshare": unix.SYS_UNSHARE,
		"setns": unix.SYS_SETNS, "keyctl": unix.SYS_KEYCTL, "add_key": unix.SYS_ADD_KEY,
		"perf_event_open": unix.SYS_PERF_EVENT_OPEN, "io_uring_setup": unix.SYS_IO_URING_SETUP,
		"userfaultfd": unix.SYS_USERFAULTFD, "process_vm_readv": unix.SYS_PROCESS_VM_READV,
		"chroot": unix.SYS_CHROOT, "setuid": unix.SYS_SETUID, "setresuid": unix.SYS_SETRESUID,
		"capset": unix.SYS_CAPSET, "personality": unix.SYS_PERSONALITY,
		"open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT, "settimeofday": unix.SYS_SETTIMEOFDAY,
		"mknodat": unix.SYS_MKNODAT, "acct": unix.SYS_ACCT, "syslog": unix.SYS_SYSLOG,
		"seccomp": unix.SYS_SECCOMP, "memfd_create": unix.SYS_MEMFD_CREATE, "execveat": unix.SYS_EXECVEAT,
		"fanotify_init": unix.SYS_FANOTIFY_INIT, "quotactl": unix.SYS_QUOTACTL,
	}
	for name, nr := range refused {
		if got := runFilter(t, vm, arch, nr); got != eperm {
			t.Errorf("%s: %#x, want EPERM", name, got)
		}
	}
	if got := runFilter(t, vm, arch, 999); got != eperm {
		t.Errorf("an unknown syscall: %#x, want EPERM", got)
	}

	// clone: threads yes, processes and namespaces no.
	thread := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_SYSVSEM | unix.CLONE_THREAD)
	for _, c := range []struct {
		name  string
		flags uint64
		want  uint32
	}{
		{"a Go thread", thread, retAllow},
		{"fork", uint64(unix.SIGCHLD), eperm},
		{"vfork-like", uint64(unix.CLONE_VM | unix.CLONE_VFORK | unix.SIGCHLD), eperm},
		{"a thread in a new net namespace", thread | unix.CLONE_NEWNET, eperm},
		{"a thread in a new user namespace", thread | unix.CLONE_NEWUSER, eperm},
		{"high bits do not matter", thread | 1<<40, retAllow},
	} {
		if got := runFilter(t, vm, arch, unix.SYS_CLONE, c.flags); got != c.want {
			t.Errorf("clone, %s: %#x, want %#x", c.name, got, c.want)
		}
	}
	if got := runFilter(t, vm, arch, unix.SYS_CLONE3); got != retErrno|errnoENOSYS {
		t.Errorf("clone3: %#x, want ENOSYS", got)
	}
	for _, c := range []struct {
		name   string
		domain uint64
		want   uint32
	}{
		{"unix", unix.AF_UNIX, retAllow}, {"inet", unix.AF_INET, retAllow}, {"inet6", unix.AF_INET6, retAllow},
		{"netlink", unix.AF_NETLINK, eperm}, {"packet", unix.AF_PACKET, eperm}, {"vsock", unix.AF_VSOCK, eperm},
	} {
		if got := runFilter(t, vm, arch, unix.SYS_SOCKET, c.domain, unix.SOCK_STREAM, 0); got != c.want {
			t.Errorf("socket(%s): %#x, want %#x", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		name   string
		option uint64
		want   uint32
	}{
		{"PR_SET_VMA", unix.PR_SET_VMA, retAllow}, {"PR_SET_NAME", unix.PR_SET_NAME, retAllow},
		{"PR_SET_DUMPABLE", unix.PR_SET_DUMPABLE, eperm}, {"PR_SET_SECUREBITS", unix.PR_SET_SECUREBITS, eperm},
		{"PR_SET_SECCOMP", unix.PR_SET_SECCOMP, eperm}, {"PR_CAP_AMBIENT", unix.PR_CAP_AMBIENT, eperm},
	} {
		if got := runFilter(t, vm, arch, unix.SYS_PRCTL, c.option); got != c.want {
			t.Errorf("prctl(%s): %#x, want %#x", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		name string
		req  uint64
		want uint32
	}{
		{"TCGETS", unix.TCGETS, retAllow}, {"FIONBIO", ioctlFIONBIO, retAllow},
		{"TIOCSTI", unix.TIOCSTI, eperm}, {"TIOCSCTTY", unix.TIOCSCTTY, eperm},
	} {
		if got := runFilter(t, vm, arch, unix.SYS_IOCTL, 1, c.req); got != c.want {
			t.Errorf("ioctl(%s): %#x, want %#x", c.name, got, c.want)
		}
	}

	// Another architecture's table, or x32 on amd64, kills the process.
	foreign := uint32(unix.AUDIT_ARCH_I386)
	if got := runFilter(t, vm, foreign, unix.SYS_READ); got != retKillProcess {
		t.Errorf("a foreign arch: %#x, want kill", got)
	}
	if pol.X32 {
		if got := runFilter(t, vm, arch, 0x40000000|unix.SYS_READ); got != retKillProcess {
			t.Errorf("x32 read: %#x, want kill", got)
		}
	}
}

func TestAssembleRefusesBadPolicies(t *testing.T) {
	for _, c := range []struct {
		name string
		pol  Policy
		want string
	}{
		{"both allowed and ruled", Policy{Arch: 1, Allow: []uint32{5}, Rules: map[uint32]Rule{5: {Errno: 1}}}, "both allowed and ruled"},
		{"an empty rule", Policy{Arch: 1, Rules: map[uint32]Rule{5: {}}}, "checks nothing"},
		{"too many to jump over", Policy{Arch: 1, Allow: seq(300)}, "out of range"},
	} {
		if _, err := Assemble(c.pol); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

func seq(n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(i)
	}
	return s
}
