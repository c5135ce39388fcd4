//go:build !linux

package sandbox

import (
	"errors"
	"os"
	"os/exec"
)

var errNotLinux = errors.New("sandbox: plugins run only on Linux")

// Spec is how one plugin process runs (see the Linux build).
type Spec struct {
	Name          string
	UID, GID      int
	Privileged    bool
	NoFile, NProc uint64
	Cgroup        *os.File
	NameLink      bool
}

// MainLeaf is where Prepare moves the processes of the parent cgroup.
const MainLeaf = "main"

// Command fails: plugins run only on Linux.
func Command([]string, Spec, *os.File) (*exec.Cmd, error) { return nil, errNotLinux }

// Exec fails: plugins run only on Linux.
func Exec([]string) error { return errNotLinux }

// Cgroup is [plugins] cgroup (see the Linux build).
type Cgroup struct {
	Path               string
	MemoryMax, PidsMax int64
}

// Prepare fails: plugins run only on Linux.
func (c *Cgroup) Prepare() ([]int, error) { return nil, errNotLinux }

// Plugin fails: plugins run only on Linux.
func (c *Cgroup) Plugin(string) (*os.File, error) { return nil, errNotLinux }

// Kill fails: plugins run only on Linux.
func (c *Cgroup) Kill(string) (bool, error) { return false, errNotLinux }

// Remove fails: plugins run only on Linux.
func (c *Cgroup) Remove(string) error { return errNotLinux }

// Dir is the plugin's cgroup directory.
func (c *Cgroup) Dir(name string) string { return c.Path + "/" + name }
