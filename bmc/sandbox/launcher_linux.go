package sandbox

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Spec is how one plugin process runs.
type Spec struct {
	// Name is the plugin's name, its argv[0].
	Name string
	// UID and GID are its identity (PluginIDs); unused when Privileged.
	UID, GID int
	// Privileged keeps bcd's uid and capabilities and installs no seccomp filter.
	Privileged bool
	// NoFile is RLIMIT_NOFILE; 0 means 1024.
	NoFile uint64
	// NProc is RLIMIT_NPROC, counted per uid by the kernel (threads included); 0
	// leaves it alone. Only meaningful for a confined plugin, whose uid is its own.
	NProc uint64
	// Cgroup is the plugin's cgroup directory, opened; the process starts inside it.
	// Nil leaves the plugin in bcd's cgroup.
	Cgroup *os.File
	// NameLink execs the binary through a symlink named after the plugin, made in
	// the working directory, so the process's name (comm, what ps and top show) is
	// the plugin's rather than the descriptor's number. The working directory must
	// be the plugin's own.
	NameLink bool
}

// launcherFD is the descriptor the plugin binary has in the launcher.
const launcherFD = 3

// Command returns the command that starts the launcher (launcher[0] with
// launcher[1:] and the spec as its arguments) on the plugin binary bin, which
// becomes the launcher's descriptor 3. The caller sets Env, Dir and the standard
// descriptors.
func Command(launcher []string, spec Spec, bin *os.File) (*exec.Cmd, error) {
	if len(launcher) == 0 || launcher[0] == "" {
		return nil, errors.New("sandbox: no launcher command")
	}
	if spec.Name == "" || bin == nil {
		return nil, errors.New("sandbox: a plugin needs a name and an open binary")
	}
	if !spec.Privileged && (spec.UID <= 0 || spec.GID <= 0) {
		return nil, fmt.Errorf("sandbox: plugin %s: uid %d gid %d: a confined plugin never runs as root", spec.Name, spec.UID, spec.GID)
	}
	path := launcher[0]
	if !strings.Contains(path, "/") {
		p, err := exec.LookPath(path)
		if err != nil {
			return nil, fmt.Errorf("sandbox: launcher: %w", err)
		}
		path = p
	}
	args := append([]string(nil), launcher...)
	args = append(args, "--name", spec.Name, "--fd", strconv.Itoa(launcherFD),
		"--nofile", strconv.FormatUint(spec.NoFile, 10), "--nproc", strconv.FormatUint(spec.NProc, 10))
	if spec.NameLink {
		args = append(args, "--name-link")
	}
	if spec.Privileged {
		args = append(args, "--privileged")
	} else {
		args = append(args, "--uid", strconv.Itoa(spec.UID), "--gid", strconv.Itoa(spec.GID))
	}
	cmd := &exec.Cmd{Path: path, Args: args, ExtraFiles: []*os.File{bin}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own session: a terminal's Ctrl-C reaches bcd, which stops its plugins
		// in order, not the plugins directly.
		Setsid: true,
		// If bcd dies, so does the launcher; the launcher re-arms this after its
		// uid switch, which clears it.
		Pdeathsig: syscall.SIGKILL,
	}
	if spec.Cgroup != nil {
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(spec.Cgroup.Fd())
	}
	return cmd, nil
}

// Exec is the launcher, `bcd plugin-exec`: it confines itself as its arguments say
// and execs the plugin binary open at --fd. It returns only on failure; the
// caller prints the error and exits non-zero, and the plugin host reports it.
func Exec(args []string) error {
	// Every per-thread setting below (no_new_privs, the seccomp filter, the
	// bounding set) must be on the thread that calls execve.
	runtime.LockOSThread()
	fs := flag.NewFlagSet("plugin-exec", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	name := fs.String("name", "", "the plugin's name, its argv[0]")
	fd := fs.Int("fd", launcherFD, "descriptor of the plugin binary")
	uid := fs.Int("uid", -1, "uid to run as")
	gid := fs.Int("gid", -1, "gid to run as")
	nofile := fs.Uint64("nofile", 0, "RLIMIT_NOFILE")
	nproc := fs.Uint64("nproc", 0, "RLIMIT_NPROC")
	privileged := fs.Bool("privileged", false, "keep bcd's uid and capabilities, no seccomp")
	nameLink := fs.Bool("name-link", false, "exec through a symlink named after the plugin in the working directory")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("plugin-exec: %w", err)
	}
	if fs.NArg() > 0 || *name == "" || *fd < 3 {
		return errors.New("plugin-exec: bcd starts this itself; it takes --name and --fd, and --uid and --gid or --privileged")
	}
	if !*privileged && (*uid <= 0 || *gid <= 0) {
		return fmt.Errorf("plugin-exec: %s: a confined plugin needs a uid and gid other than root's", *name)
	}
	ppid := os.Getppid()
	// The kernel names a process after the last element of the path it was
	// executed by; /proc/self/fd/3 would make it "3".
	exe := "/proc/self/fd/" + strconv.Itoa(*fd)
	if *nameLink {
		if err := os.Symlink(exe, *name); err != nil {
			return fmt.Errorf("plugin-exec: %s: %w", *name, err)
		}
		exe = "./" + *name
	}
	if err := setLimits(*nofile, *nproc); err != nil {
		return fmt.Errorf("plugin-exec: %s: %w", *name, err)
	}
	var filter []unix.SockFilter
	if !*privileged {
		// Assemble before dropping anything, so a broken table fails loudly as root.
		pol, err := FilterPolicy()
		if err == nil {
			filter, err = compile(pol)
		}
		if err != nil {
			return fmt.Errorf("plugin-exec: %s: %w", *name, err)
		}
		if err := dropPrivileges(*uid, *gid); err != nil {
			return fmt.Errorf("plugin-exec: %s: %w", *name, err)
		}
	}
	// The uid switch cleared the parent-death signal; if bcd died before it is set
	// again, the parent is already someone else.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("plugin-exec: %s: set the parent-death signal: %w", *name, err)
	}
	if os.Getppid() != ppid {
		return fmt.Errorf("plugin-exec: %s: bcd exited while the plugin was starting", *name)
	}
	if !*privileged {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("plugin-exec: %s: no_new_privs: %w", *name, err)
		}
		if err := installFilter(filter); err != nil {
			return fmt.Errorf("plugin-exec: %s: %w", *name, err)
		}
	}
	unix.CloseOnExec(*fd)
	// The descriptor is the file the host hashed; executing it by path could run
	// whatever the path names by then.
	err := syscall.Exec(exe, []string{*name}, os.Environ())
	return fmt.Errorf("plugin-exec: %s: exec: %w", *name, err)
}

func setLimits(nofile, nproc uint64) error {
	if nofile == 0 {
		nofile = 1024
	}
	limits := []struct {
		res  int
		name string
		val  uint64
	}{
		// A core dump of a BMC driver would hold BMC passwords.
		{unix.RLIMIT_CORE, "RLIMIT_CORE", 0},
		{unix.RLIMIT_NOFILE, "RLIMIT_NOFILE", nofile},
	}
	if nproc > 0 {
		limits = append(limits, struct {
			res  int
			name string
			val  uint64
		}{unix.RLIMIT_NPROC, "RLIMIT_NPROC", nproc})
	}
	for _, l := range limits {
		// syscall.Setrlimit, not unix's: it also stops Go restoring its saved
		// RLIMIT_NOFILE at exec.
		if err := syscall.Setrlimit(l.res, &syscall.Rlimit{Cur: l.val, Max: l.val}); err != nil {
			return fmt.Errorf("set %s to %d: %w", l.name, l.val, err)
		}
	}
	return nil
}

func installFilter(filter []unix.SockFilter) error {
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return fmt.Errorf("install the seccomp filter: %w", errno)
	}
	return nil
}
