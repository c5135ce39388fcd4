package pki

import (
	"crypto/ecdsa"
	"fmt"
)

// GenerateReleaseKey makes a P-256 release signing key and writes it to path
// as PKCS#8 PEM, mode 0600, atomically. It refuses to replace a file: a lost
// release key is one fewer signer, while an overwritten one cannot be
// recovered and its pin is still in every node's [update] release_pins.
// It returns the key's pin, the value for release_pins.
func GenerateReleaseKey(path string) (string, error) {
	if ok, err := exists(path); err != nil {
		return "", fmt.Errorf("release key: %w", err)
	} else if ok {
		return "", fmt.Errorf("release key: %s already exists; refusing to replace a signing key", path)
	}
	k, err := newKey()
	if err != nil {
		return "", fmt.Errorf("release key: %w", err)
	}
	pemBytes, err := MarshalPKCS8PEM(k)
	if err != nil {
		return "", fmt.Errorf("release key: %w", err)
	}
	if err := WriteFileAtomic(path, pemBytes, privateMode); err != nil {
		return "", fmt.Errorf("release key: %w", err)
	}
	return SPKIPin(&k.PublicKey)
}

// LoadReleaseKey reads a release signing key written by GenerateReleaseKey,
// refusing a file that group or others can access.
func LoadReleaseKey(path string) (*ecdsa.PrivateKey, error) {
	data, err := readFile(path, maxKeyFile, true)
	if err != nil {
		return nil, fmt.Errorf("release key: %w", err)
	}
	k, err := ParsePKCS8PEM(data)
	if err != nil {
		return nil, fmt.Errorf("release key %s: %w", path, err)
	}
	return k, nil
}
