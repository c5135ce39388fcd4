package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Cgroup is [plugins] cgroup: a cgroup v2 directory below bcd's delegated cgroup
// that holds one child per plugin.
type Cgroup struct {
	// Path is the cgroup, e.g. /sys/fs/cgroup/system.slice/bcd.service/plugins.
	Path string
	// MemoryMax and PidsMax are each plugin's memory.max (bytes) and pids.max.
	MemoryMax, PidsMax int64

	// fake: a plain directory tree stands in for cgroupfs (tests), so the
	// filesystem type is not checked.
	fake bool
}

// controllers a plugin's cgroup limits.
var controllers = []string{"memory", "pids"}

// MainLeaf is where Prepare moves the processes of the parent cgroup.
const MainLeaf = "main"

// Prepare creates the cgroup and enables the memory and pids controllers in its
// parent and in it. When the parent holds processes (bcd itself, under systemd
// before 254, which ignores DelegateSubgroup=main) it first moves them into a
// "main" leaf beside the plugins cgroup, since cgroup v2 enables no controller for
// the children of a cgroup with processes of its own. It returns the pids it moved.
// An error says why no plugin can run.
func (c *Cgroup) Prepare() (moved []int, err error) {
	if c.Path == "" || !filepath.IsAbs(c.Path) {
		return nil, fmt.Errorf("cgroup %q is not an absolute path", c.Path)
	}
	parent := filepath.Dir(c.Path)
	if !c.fake {
		var st unix.Statfs_t
		if err := unix.Statfs(parent, &st); err != nil {
			return nil, fmt.Errorf("cgroup parent %s: %w", parent, err)
		}
		if st.Type != unix.CGROUP2_SUPER_MAGIC {
			return nil, fmt.Errorf("cgroup parent %s is not on a cgroup v2 filesystem (cgroup v1 or a hybrid hierarchy): plugins need cgroup v2 with the memory and pids controllers", parent)
		}
	}
	// Refuse before changing anything when the controllers are not there to enable.
	avail, err := readList(filepath.Join(parent, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("cgroup parent %s: %w", parent, err)
	}
	for _, ctl := range controllers {
		if !slices.Contains(avail, ctl) {
			return nil, fmt.Errorf("the %s controller is not available in %s (cgroup.controllers: %q): bcd's cgroup must be delegated to it with memory and pids (systemd: Delegate=yes)", ctl, parent, strings.Join(avail, " "))
		}
	}
	enabled, err := readList(filepath.Join(parent, "cgroup.subtree_control"))
	if err != nil {
		return nil, fmt.Errorf("cgroup parent %s: %w", parent, err)
	}
	if !containsAll(enabled, controllers) {
		if moved, err = c.moveIntoLeaf(parent); err != nil {
			return moved, err
		}
		if err := enable(parent); err != nil {
			return moved, err
		}
	}
	if err := os.Mkdir(c.Path, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return moved, fmt.Errorf("create cgroup %s: %w", c.Path, err)
	}
	if procs, err := readPids(filepath.Join(c.Path, "cgroup.procs")); err != nil {
		return moved, fmt.Errorf("cgroup %s: %w", c.Path, err)
	} else if len(procs) > 0 {
		return moved, fmt.Errorf("cgroup %s holds processes %v itself: it must only hold the plugins' cgroups", c.Path, procs)
	}
	return moved, enable(c.Path)
}

func (c *Cgroup) moveIntoLeaf(parent string) ([]int, error) {
	procs, err := readPids(filepath.Join(parent, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("cgroup parent %s: %w", parent, err)
	}
	if len(procs) == 0 {
		return nil, nil
	}
	leaf := filepath.Join(parent, MainLeaf)
	if leaf == c.Path {
		return nil, fmt.Errorf("cgroup %s: the plugins cgroup cannot be named %q, the leaf bcd moves itself into", c.Path, MainLeaf)
	}
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("create cgroup %s: %w", leaf, err)
	}
	var moved []int
	for _, pid := range procs {
		err := appendLine(filepath.Join(leaf, "cgroup.procs"), strconv.Itoa(pid))
		if errors.Is(err, unix.ESRCH) {
			continue // it exited meanwhile
		}
		if err != nil {
			return moved, fmt.Errorf("move process %d from %s into %s: %w", pid, parent, leaf, err)
		}
		moved = append(moved, pid)
	}
	return moved, nil
}

func enable(dir string) error {
	var b strings.Builder
	for i, ctl := range controllers {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("+" + ctl)
	}
	if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), b.String()); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("enable %s in %s: processes remain in it (%w)", b.String(), dir, err)
		}
		return fmt.Errorf("enable %s in %s: %w", b.String(), dir, err)
	}
	return nil
}

// Plugin creates (or reuses) the plugin's own cgroup, sets its limits, and opens it
// for SysProcAttr.CgroupFD. The caller closes the file once the plugin started.
func (c *Cgroup) Plugin(name string) (*os.File, error) {
	dir := c.Dir(name)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("create cgroup %s: %w", dir, err)
	}
	settings := []struct {
		file, value string
		optional    bool
	}{
		{"memory.max", strconv.FormatInt(c.MemoryMax, 10), false},
		{"pids.max", strconv.FormatInt(c.PidsMax, 10), false},
		// Swap would let a plugin past memory.max; OOM kills the whole plugin.
		{"memory.swap.max", "0", true},
		{"memory.oom.group", "1", true},
	}
	for _, s := range settings {
		err := writeFile(filepath.Join(dir, s.file), s.value)
		if s.optional && errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cgroup %s: set %s to %s: %w", dir, s.file, s.value, err)
		}
	}
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", dir, err)
	}
	return f, nil
}

// Kill kills every process in the plugin's cgroup at once (cgroup.kill, Linux 5.14).
// It reports false when the kernel has no cgroup.kill.
func (c *Cgroup) Kill(name string) (bool, error) {
	err := writeFile(filepath.Join(c.Dir(name), "cgroup.kill"), "1")
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("kill cgroup %s: %w", c.Dir(name), err)
	}
	return true, nil
}

// Remove removes the plugin's cgroup; it fails while a process is still in it.
func (c *Cgroup) Remove(name string) error {
	if err := unix.Rmdir(c.Dir(name)); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove cgroup %s: %w", c.Dir(name), err)
	}
	return nil
}

// Dir is the plugin's cgroup directory.
func (c *Cgroup) Dir(name string) string { return filepath.Join(c.Path, name) }

func readList(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

func readPids(path string) ([]int, error) {
	fields, err := readList(path)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range fields {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a pid", path, f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// writeFile writes one value to an existing cgroup file: cgroupfs takes each
// write(2) as one command, and creates no files.
func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// appendLine writes one line to cgroup.procs; appending keeps every pid when a
// plain directory stands in for cgroupfs.
func appendLine(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
