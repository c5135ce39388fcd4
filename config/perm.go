package config

import (
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
)

// PermReport is what bcd doctor needs to know about who can touch the file.
type PermReport struct {
	Mode     fs.FileMode // permission bits
	UID, GID uint32
	// Readable and Writable are true when anyone but the owner may read
	// or write the file through its group or other bits.
	Readable bool
	Writable bool
}

// OK reports whether only the owner can read or write the file.
func (r PermReport) OK() bool { return !r.Readable && !r.Writable }

func (r PermReport) String() string {
	var who []string
	for _, p := range []struct {
		bit  fs.FileMode
		what string
	}{{0o040, "readable by group"}, {0o020, "writable by group"}, {0o004, "readable by others"}, {0o002, "writable by others"}} {
		if r.Mode&p.bit != 0 {
			who = append(who, p.what)
		}
	}
	if len(who) == 0 {
		return fmt.Sprintf("mode %04o, owner uid %d", uint32(r.Mode), r.UID)
	}
	return fmt.Sprintf("mode %04o, owner uid %d: %s", uint32(r.Mode), r.UID, strings.Join(who, ", "))
}

// Permissions reports the mode and owner of the file at path, following
// symlinks: what matters is the file the daemons read.
func Permissions(path string) (PermReport, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return PermReport{}, fmt.Errorf("config: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return PermReport{}, fmt.Errorf("config: %s: no owner information", path)
	}
	mode := fi.Mode().Perm()
	return PermReport{
		Mode:     mode,
		UID:      st.Uid,
		GID:      st.Gid,
		Readable: mode&0o044 != 0,
		Writable: mode&0o022 != 0,
	}, nil
}
