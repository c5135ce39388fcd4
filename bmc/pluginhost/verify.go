package pluginhost

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/better-compute/bcd/bmc/pins"
)

// errRefused marks a start that cannot succeed until an operator changes something
// (a pin, a binary, an account): calls fail at once instead of waiting for it.
var errRefused = errors.New("refused")

type refusal struct{ err error }

func (r refusal) Error() string            { return r.err.Error() }
func (r refusal) Unwrap() []error          { return []error{r.err, errRefused} }
func refuse(format string, a ...any) error { return refusal{fmt.Errorf(format, a...)} }

// trusted checks that a file bcd acts on cannot have been changed by anyone but
// root (or bcd's own uid): owned by one of them, writable by no one else.
func trusted(path string, fi fs.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return refuse("%s: cannot read its owner", path)
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return refuse("%s is owned by uid %d: it must be root's", path, st.Uid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return refuse("%s has mode %04o: group or others may change it", path, fi.Mode().Perm())
	}
	return nil
}

// openVerified opens the plugin's binary and checks it against its line in the
// pins file. The returned file is what the launcher executes, so the bytes that
// run are the bytes hashed here.
func openVerified(dir, name string) (*os.File, [32]byte, error) {
	var zero [32]byte
	if !pins.ValidName(name) {
		return nil, zero, refuse("%q is not a plugin name (letters, digits, ., _ and -)", name)
	}
	dfi, err := os.Stat(dir)
	if err != nil {
		return nil, zero, refuse("plugin directory: %w", err)
	}
	if !dfi.IsDir() {
		return nil, zero, refuse("plugin directory %s is not a directory", dir)
	}
	if err := trusted(dir, dfi); err != nil {
		return nil, zero, err
	}
	pinsPath := filepath.Join(dir, pins.FileName)
	data, err := readTrusted(pinsPath, pins.MaxSize)
	if err != nil {
		return nil, zero, err
	}
	ps, err := pins.Parse(data)
	if err != nil {
		return nil, zero, refuse("%s: %w", pinsPath, err)
	}
	pin, ok := ps.Lookup(name)
	if !ok {
		return nil, zero, refuse("%s has no line for %s: refusing to start it (add \"<sha256>  %s\")", pinsPath, name, name)
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, zero, refuse("plugin %s: %w", name, err)
	}
	fail := func(err error) (*os.File, [32]byte, error) {
		f.Close()
		return nil, zero, err
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(fmt.Errorf("plugin %s: %w", name, err))
	}
	if !fi.Mode().IsRegular() {
		return fail(refuse("plugin %s is not a regular file", path))
	}
	if fi.Mode().Perm()&0o111 == 0 {
		return fail(refuse("plugin %s is not executable (mode %04o)", path, fi.Mode().Perm()))
	}
	if err := trusted(path, fi); err != nil {
		return fail(err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, fi.Size())); err != nil {
		return fail(fmt.Errorf("plugin %s: read: %w", path, err))
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	if sum != pin.SHA256 {
		return fail(refuse("sha256 of %s is %s, but line %d of %s pins %s: refusing to start it",
			path, hex.EncodeToString(sum[:]), pin.Line, pinsPath, hex.EncodeToString(pin.SHA256[:])))
	}
	return f, sum, nil
}

func readTrusted(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, refuse("pins file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("pins file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, refuse("pins file %s is not a regular file", path)
	}
	if err := trusted(path, fi); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("pins file %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, refuse("pins file %s is larger than %d bytes", path, limit)
	}
	return data, nil
}
