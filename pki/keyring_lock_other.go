//go:build !unix

package pki

import "errors"

// LockSecretsKeyring is not implemented outside unix.
func LockSecretsKeyring(pkiDir string, exclusive bool) (unlock func(), err error) {
	return nil, errors.New("keyring lock: not implemented on this system")
}
