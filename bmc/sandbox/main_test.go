//go:build linux

package sandbox

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// probeName is the argv[0] under which the test binary runs as a sandboxed probe.
const probeName = "sandbox-probe"

// hogName is the argv[0] under which the test binary touches hogTouch bytes, more
// than the hogLimit its cgroup allows.
const (
	hogName  = "sandbox-hog"
	hogLimit = 16 << 20
	hogTouch = 64 << 20
)

// TestMain lets the test binary be the launcher (`<test> plugin-exec …`, as bcd
// is) and the plugin it launches (argv[0] sandbox-probe), so the tests run the
// real code paths in real processes.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "plugin-exec" {
		err := Exec(os.Args[2:])
		fmt.Fprintln(os.Stderr, err)
		os.Exit(126)
	}
	if filepath.Base(os.Args[0]) == probeName {
		json.NewEncoder(os.Stdout).Encode(probe())
		os.Exit(0)
	}
	if filepath.Base(os.Args[0]) == hogName {
		hog()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// probeReport is what a probe finds out about the process it runs in.
type probeReport struct {
	UID, GID, EUID int
	Groups         []int
	Status         map[string]string // /proc/self/status lines of interest
	Cgroup         string            // /proc/self/cgroup
	NoFile, Core   uint64
	Calls          map[string]string // syscall → "ok" or its errno
	UDPLoopback    string
}

func probe() probeReport {
	r := probeReport{UID: os.Getuid(), GID: os.Getgid(), EUID: os.Geteuid(), Status: map[string]string{}, Calls: map[string]string{}}
	r.Groups, _ = os.Getgroups()
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if ok && (strings.HasPrefix(k, "Cap") || k == "Name" || k == "NoNewPrivs" || k == "Seccomp" || k == "Seccomp_filters") {
				r.Status[k] = strings.TrimSpace(v)
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		r.Cgroup = strings.TrimSpace(string(b))
	}
	var lim syscall.Rlimit
	syscall.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	r.NoFile = lim.Cur
	syscall.Getrlimit(unix.RLIMIT_CORE, &lim)
	r.Core = lim.Cur

	result := func(name string, err error) {
		if err == nil {
			r.Calls[name] = "ok"
		} else {
			r.Calls[name] = err.Error()
		}
	}
	// Calls an unprivileged process may normally make, which the filter refuses:
	// an EPERM here is the filter's, not a missing capability's.
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err == nil {
		unix.Close(fd)
	}
	result("socket(AF_NETLINK)", err)
	_, err = unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	result("keyctl", err)
	_, _, errno := unix.RawSyscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
	result("personality", errnoErr(errno))
	// unshare on a locked thread that is then thrown away: if it did succeed, the
	// namespace dies with the thread.
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		done <- unix.Unshare(unix.CLONE_NEWUSER)
	}()
	result("unshare(CLONE_NEWUSER)", <-done)
	// Starting a child process, as Go does it (clone3, then clone with CLONE_VFORK).
	result("fork", exec.Command("/bin/true").Run())
	if os.Getuid() != 0 {
		// Only where they cannot succeed: outside the sandbox a root probe would
		// mount, and PTRACE_TRACEME would hand it to its parent as a tracee.
		result("mount", unix.Mount("none", "/mnt", "tmpfs", 0, ""))
		_, _, errno = unix.RawSyscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0)
		result("ptrace", errnoErr(errno))
	}

	// What a network client needs still works.
	r.UDPLoopback = udpLoopback()
	return r
}

// hog touches every page of hogTouch bytes, kept reachable so no collection frees
// them, and says how far it got; under its cgroup's memory.max it never finishes.
func hog() {
	const chunk = 1 << 20
	var keep [][]byte
	for len(keep)*chunk < hogTouch {
		b := make([]byte, chunk)
		for i := 0; i < len(b); i += os.Getpagesize() {
			b[i] = 1
		}
		keep = append(keep, b)
	}
	fmt.Printf("touched %d MiB and was not killed\n", len(keep)*chunk>>20)
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func udpLoopback() string {
	a, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return "listen: " + err.Error()
	}
	defer a.Close()
	b, err := net.Dial("udp", a.LocalAddr().String())
	if err != nil {
		return "dial: " + err.Error()
	}
	defer b.Close()
	if _, err := b.Write([]byte("ping")); err != nil {
		return "write: " + err.Error()
	}
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	n, _, err := a.ReadFrom(buf)
	if err != nil {
		return "read: " + err.Error()
	}
	return string(buf[:n])
}
