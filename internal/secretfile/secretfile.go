// Package secretfile reads the small files that hold secrets (keys, tokens,
// passwords) and the files beside them, with one set of rules: the file must be
// regular (a FIFO or device is refused, and opening never waits on a FIFO), a
// private one must not be open to group or others (a secret that has been readable
// is treated as leaked, and failing loudly gets it fixed instead of used), and at
// most a limit is read, so a wrong path cannot make a daemon swallow a huge file.
//
// It is the one copy of these checks; callers prefix the error with what the file
// is for ("--token-file", "bmc hosts"). Regular and OneLink are the same checks for
// callers that open a file themselves: the boot server's TFTP and HTTP files, the
// control plane's downloads, self-update's staged binary.
package secretfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
)

// The refusals, for errors.Is.
var (
	ErrNotRegular = errors.New("not a regular file")
	ErrMode       = errors.New("group or others may access it")
	ErrTooLarge   = errors.New("too large")
	ErrLinks      = errors.New("more than one link")
	ErrNotDir     = errors.New("not a directory")
	ErrDirMode    = errors.New("group or others may write in it")
)

// Options says how a file is read. The zero value reads any regular file of any
// size; set Limit.
type Options struct {
	// Limit is the most bytes read; a larger file is refused ("larger than N bytes").
	Limit int64
	// Private refuses a file whose mode lets group or others access it.
	Private bool
	// What names the secret in the mode refusal ("the node key"); "it" when empty.
	What string
	// NoFollow refuses a symbolic link as the last component of the path: for files
	// a daemon writes itself in its own directory, where a link is never expected.
	NoFollow bool
	// Check, when set, replaces the regular-file and mode checks, for a caller with
	// stricter rules of its own (a join token: exactly 0600 or 0400).
	Check func(fi fs.FileInfo) error
}

// Read opens path and reads it under o.
func Read(path string, o Options) ([]byte, error) {
	flags := os.O_RDONLY | openFlags
	if o.NoFollow {
		flags |= noFollow
	}
	f, err := os.OpenFile(path, flags, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadFrom(f, path, o)
}

// ReadFrom reads an open file under o; path names it in errors. The checks stat
// the open file, not the path, so they apply to what is read.
func ReadFrom(f *os.File, path string, o Options) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if o.Check != nil {
		err = o.Check(fi)
	} else {
		err = check(path, fi, o)
	}
	if err != nil {
		return nil, err
	}
	if fi.Size() > o.Limit {
		return nil, refuse(ErrTooLarge, "%s: larger than %d bytes", path, o.Limit)
	}
	// Limit+1: a file that grew after the stat is still caught.
	data, err := io.ReadAll(io.LimitReader(f, o.Limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(data)) > o.Limit {
		return nil, refuse(ErrTooLarge, "%s: larger than %d bytes", path, o.Limit)
	}
	return data, nil
}

func check(path string, fi fs.FileInfo, o Options) error {
	if err := Regular(path, fi); err != nil {
		return err
	}
	// Windows has no such mode bits to check.
	if o.Private && runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
		what := o.What
		if what == "" {
			what = "it"
		}
		return refuse(ErrMode, "%s: mode %04o lets group or others access %s; it must be 0600 (chmod 600 %s)",
			path, fi.Mode().Perm(), what, path)
	}
	return nil
}

// Regular refuses anything but a regular file, naming path and what it is
// ("/etc/bcd/config.toml: not a regular file (a FIFO)"), as ErrNotRegular. For a
// caller that opens the file itself (a database, a file served to a client) and
// checks what it opened, or what Stat says before it opens.
func Regular(path string, fi fs.FileInfo) error {
	if fi.Mode().IsRegular() {
		return nil
	}
	return refuse(ErrNotRegular, "%s: not a regular file (%s)", path, Kind(fi.Mode()))
}

// OneLink refuses a file with more than one hard link, as ErrLinks. os.Root and a
// fixed directory confine names, not files: a hard link made inside a served
// directory to a file outside it (a key, /etc/shadow) is that file, and serving or
// copying it would hand out what the directory was meant to keep in, or bytes that
// change under the reader through the other name.
func OneLink(path string, fi fs.FileInfo) error {
	n, ok := links(fi)
	switch {
	case !ok:
		return nil // no link count on this platform
	case n != 1:
		return refuse(ErrLinks, "%s has %d links; it must have one (a hard link is another name for a file that may live anywhere)", path, n)
	}
	return nil
}

// CheckDir refuses a directory that group or others may write in, naming it and
// its mode, as ErrDirMode, and a path that is not a directory, as ErrNotDir. It is
// for a directory a daemon keeps its secrets or its state in (bcd's data_dir and
// socket directory, serve's --data and --pki, pki init's directory): whoever can
// write there can swap the files kept in it, plant the ones it will read, or
// replace a socket. A directory that exists is checked, never repaired: chmod on
// a directory someone else may have prepared does not undo what they put in it.
// A missing path is the Stat error (fs.ErrNotExist), for the caller that then
// creates it with a mode of its own.
func CheckDir(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return refuse(ErrNotDir, "%s: not a directory (%s)", path, Kind(fi.Mode()))
	}
	// Windows has no such mode bits to check.
	if perm := fi.Mode().Perm(); runtime.GOOS != "windows" && perm&0o022 != 0 {
		return refuse(ErrDirMode, "%s: mode %04o lets group or others write in it, so they could swap the files kept there; refusing it (chmod go-w %s)",
			path, unixMode(fi.Mode()), path)
	}
	return nil
}

// unixMode is m's permission bits as chmod writes them, with setuid, setgid and
// sticky (a /tmp is 1777, Debian's /usr/local/lib 2775).
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	for _, b := range []struct {
		flag fs.FileMode
		bit  uint32
	}{{fs.ModeSetuid, 0o4000}, {fs.ModeSetgid, 0o2000}, {fs.ModeSticky, 0o1000}} {
		if m&b.flag != 0 {
			u |= b.bit
		}
	}
	return u
}

// Kind says what a file of mode m is, in words for an error message: "a FIFO",
// "a directory", "a device", "a socket", "a symbolic link" or "a regular file".
func Kind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "type " + m.Type().String()
}

// refusal is a refusal's message, matching its kind under errors.Is without
// repeating the kind's text.
type refusal struct {
	msg  string
	kind error
}

func (r *refusal) Error() string { return r.msg }
func (r *refusal) Unwrap() error { return r.kind }

func refuse(kind error, format string, args ...any) error {
	return &refusal{msg: fmt.Sprintf(format, args...), kind: kind}
}
