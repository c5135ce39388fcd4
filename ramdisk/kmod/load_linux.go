package kmod

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/u-root/u-root/pkg/kmodule"
	"golang.org/x/sys/unix"
)

// maxModuleSize bounds a decompressed module: the largest in Debian's kernel are a
// few tens of MB (GPU drivers).
const maxModuleSize = 256 << 20

// FileLoader inserts modules with finit_module(2), which takes the file itself, or,
// for a module compressed as .ko.xz, .ko.zst or .ko.gz, decompresses it in memory
// and uses init_module(2). EEXIST (already loaded) is success.
type FileLoader struct{}

// Load inserts the module at path.
func (FileLoader) Load(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("insert %s: %w", filepath.Base(path), err)
	}
	defer f.Close()
	switch filepath.Ext(path) {
	case ".ko":
		err = unix.FinitModule(int(f.Fd()), "", 0)
		if !errors.Is(err, unix.ENOSYS) {
			return loadErr(path, err)
		}
		// A kernel without finit_module: read the file ourselves.
		img, rerr := io.ReadAll(io.LimitReader(f, maxModuleSize+1))
		if rerr != nil {
			return fmt.Errorf("insert %s: %w", filepath.Base(path), rerr)
		}
		return loadErr(path, unix.InitModule(img, ""))
	default:
		img, err := decompress(f)
		if err != nil {
			return fmt.Errorf("insert %s: %w", filepath.Base(path), err)
		}
		return loadErr(path, unix.InitModule(img, ""))
	}
}

// decompress reads a .ko.xz, .ko.zst or .ko.gz module into memory, bounded.
func decompress(f *os.File) ([]byte, error) {
	r, err := kmodule.CompressionReader(f)
	if err != nil {
		return nil, err
	}
	img, err := io.ReadAll(io.LimitReader(r, maxModuleSize+1))
	if err != nil {
		return nil, fmt.Errorf("decompress: %w", err)
	}
	if len(img) > maxModuleSize {
		return nil, fmt.Errorf("over %d bytes decompressed", maxModuleSize)
	}
	return img, nil
}

func loadErr(path string, err error) error {
	if err == nil || errors.Is(err, unix.EEXIST) {
		return nil
	}
	return fmt.Errorf("insert %s: %w", filepath.Base(path), err)
}

// Release is the running kernel's release (uname -r).
func Release() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}
