package selfupdate

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/better-compute/bcd/pki"
)

// tempCopy is a binary being written: the bytes go to a temporary file
// beside their final name, hashed as they go, and reach that name only by
// commit (fsync, rename, fsync of the directory), so a refused or torn copy
// never replaces anything.
type tempCopy struct {
	f *os.File
	// n and sha256 are what was written.
	n      int64
	sha256 string
}

// copyToTemp copies at most limit+1 bytes of src into a new temporary file in
// dir: one byte more than a caller expects is caught, not cut off. On an
// error nothing is left behind; the error is src's or the file's, unwrapped,
// for the caller to name.
func copyToTemp(dir, name string, src io.Reader, limit int64) (*tempCopy, error) {
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(src, limit+1))
	c := &tempCopy{f: f, n: n, sha256: hex.EncodeToString(h.Sum(nil))}
	if err != nil {
		c.abort()
		return nil, err
	}
	return c, nil
}

// commit gives the file mode and renames it to dir/name durably.
func (c *tempCopy) commit(name string, mode fs.FileMode) error {
	err := c.f.Chmod(mode)
	if err == nil {
		err = c.f.Sync()
	}
	if cerr := c.f.Close(); err == nil {
		err = cerr
	}
	dir := filepath.Dir(c.f.Name())
	if err == nil {
		err = os.Rename(c.f.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(c.f.Name())
		return fmt.Errorf("selfupdate: write %s: %w", filepath.Join(dir, name), err)
	}
	return pki.SyncDir(dir)
}

// abort removes the temporary file.
func (c *tempCopy) abort() {
	c.f.Close()
	os.Remove(c.f.Name())
}
