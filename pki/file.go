package pki

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/better-compute/bcd/internal/secretfile"
)

// WriteFileAtomic replaces path with data so that a reader, or a crash, sees
// either the old file or the whole new one, never a torn write. The data goes
// to a temporary file in the same directory (created 0600, so a secret is never
// readable by others even for an instant), which is given mode, fsynced and
// renamed over path; the directory is then fsynced so the rename survives a
// power loss.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if base == "" {
		return fmt.Errorf("write %q: not a file name", path)
	}
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("write %s: %w", path, err)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	// Chmod rather than relying on the create mode, which the umask narrows.
	if err = f.Chmod(mode.Perm()); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir makes a rename, create or remove in dir durable (fsync of the
// directory): the one home for it, beside WriteFileAtomic.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// readFile reads a regular file of at most limit bytes. When private is set it
// also refuses a file that group or others may access: a key that has been
// readable by others must be treated as leaked.
func readFile(path string, limit int64, private bool) ([]byte, error) {
	return secretfile.Read(path, secretfile.Options{Limit: limit, Private: private, What: "a private key"})
}

// isEmptyDir reports whether dir has no entries.
func isEmptyDir(dir string) (bool, error) {
	d, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer d.Close()
	_, err = d.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return false, nil
}

// exists reports whether anything, even a dangling symlink, is at path.
func exists(path string) (bool, error) {
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}
