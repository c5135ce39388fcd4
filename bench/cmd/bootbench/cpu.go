package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU time is the figure a shared machine does not distort: another engineer's
// compile steals a server's turns on the cores, and steals more of them from a
// single-threaded server than from one with a thread per core, but it does not
// change how much CPU the server spends on each answer or each MiB.

// clockTick is USER_HZ, the unit of /proc/PID/stat's times: 100 on every Linux
// architecture Go supports.
const clockTick = time.Second / 100

// selfCPU is the user and system time of this process so far: bcd's servers, plus
// the coordinator, which sleeps while a client runs.
func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// treeCPU is the user and system time of pid, of its children it has reaped
// (tftp-hpa's, one per transfer) and of its living descendants (nginx's workers).
func treeCPU(pid int) (time.Duration, error) {
	ticks, err := treeTicks(pid)
	if err != nil {
		return 0, err
	}
	return time.Duration(ticks) * clockTick, nil
}

func treeTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	total, err := parseStatTicks(string(b))
	if err != nil {
		return 0, err
	}
	for _, child := range children(pid) {
		// A child that exits meanwhile is counted once its parent reaps it.
		if t, err := treeTicks(child); err == nil {
			total += t
		}
	}
	return total, nil
}

// parseStatTicks reads utime + stime + cutime + cstime, in clock ticks, out of a
// /proc/PID/stat line. The command name in parentheses may hold spaces and
// parentheses: the fields start after the last ')'.
func parseStatTicks(stat string) (int64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no command name")
	}
	// f[0] is field 3 (state), so utime (field 14) is f[11], cstime (17) f[14].
	f := strings.Fields(stat[i+1:])
	if len(f) < 15 {
		return 0, errors.New("/proc stat: too few fields")
	}
	var total int64
	for _, s := range f[11:15] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("/proc stat: time %q", s)
		}
		total += n
	}
	return total, nil
}

// children lists pid's child processes, from every thread's children file.
func children(pid int) []int {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// cgroup is a cgroup v2 directory a peer runs in from its first instruction
// (clone3 CLONE_INTO_CGROUP), so that its cpu.stat counts every process it forks,
// also those that have exited and were never waited for (in.tftpd ignores
// SIGCHLD, so its transfers never reach its cutime).
type cgroup struct {
	dir string
	fd  *os.File
}

// newCgroup creates name under the cgroup v2 hierarchy (/sys/fs/cgroup on a
// unified system, /sys/fs/cgroup/unified on a hybrid one).
func newCgroup(name string) (*cgroup, error) {
	root, err := cgroup2Mount()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	fd, err := os.Open(dir)
	if err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	return &cgroup{dir: dir, fd: fd}, nil
}

func cgroup2Mount() (string, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "", fmt.Errorf("cgroup: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[2] == "cgroup2" {
			return f[1], nil
		}
	}
	return "", errors.New("cgroup: no cgroup v2 hierarchy mounted")
}

// usage is the CPU time of every process that has run in the cgroup.
func (c *cgroup) usage() (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, "cpu.stat"))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cgroup cpu.stat: %q", line)
			}
			return time.Duration(n) * time.Microsecond, nil
		}
	}
	return 0, errors.New("cgroup cpu.stat: no usage_usec")
}

// remove deletes the cgroup once its processes have ended.
func (c *cgroup) remove() error {
	c.fd.Close()
	var err error
	for range 50 {
		if err = os.Remove(c.dir); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("cgroup: %w", err)
}
