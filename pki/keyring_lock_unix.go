//go:build unix

package pki

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// LockSecretsKeyring takes the keyring's lock (<pkiDir>/secrets.key.lock, a
// flock) for as long as the process uses the keyring: each serve holds it
// shared while it runs, and a rotation (exclusive) refuses to start under a
// serve that would keep sealing under the key it retires.
func LockSecretsKeyring(pkiDir string, exclusive bool) (unlock func(), err error) {
	path := filepath.Join(pkiDir, SecretsKeyFile+".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, privateMode)
	if errors.Is(err, syscall.EROFS) {
		// On a read-only mount (a bundle from a Secret volume) the lock
		// file is used when it is there; without it there is nothing to
		// hold, since no rotation can write the keyring either.
		if f, err = os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0); errors.Is(err, os.ErrNotExist) && !exclusive {
			return func() {}, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("keyring lock: %w", err)
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("keyring lock: %s is held by another process (a better-compute serve, or a rotation, on this bundle): stop it first", path)
		}
		return nil, fmt.Errorf("keyring lock: %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
