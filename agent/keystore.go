package agent

import (
	"crypto"
	"errors"
	"fmt"

	"github.com/better-compute/bcd/pki"
)

// KeyStore makes and loads node keys. Every use of the node key (the join's CSR,
// the session's mutual TLS, a renewal) goes through the crypto.Signer it returns,
// so a key that never leaves a TPM works wherever a key in memory does. The bytes
// are node.key's content: the key itself, or only a record the store can load it
// from again.
type KeyStore interface {
	// New makes a node key and the content of the node.key that holds it.
	New() (crypto.Signer, []byte, error)
	// Load reads node.key's content back into a key.
	Load(nodeKeyFile []byte) (crypto.Signer, error)
}

// PKCS8Keys is the default KeyStore: a P-256 key in memory whose node.key is a
// PKCS#8 "PRIVATE KEY" PEM file.
var PKCS8Keys KeyStore = pkcs8Keys{}

type pkcs8Keys struct{}

func (pkcs8Keys) New() (crypto.Signer, []byte, error) {
	key, err := pki.NewP256Key()
	if err != nil {
		return nil, nil, err
	}
	file, err := pki.MarshalPKCS8PEM(key)
	if err != nil {
		return nil, nil, err
	}
	return key, file, nil
}

func (pkcs8Keys) Load(nodeKeyFile []byte) (crypto.Signer, error) {
	return pki.ParsePKCS8PEM(nodeKeyFile)
}

// keysOr is ks, or PKCS8Keys for nil.
func keysOr(ks KeyStore) KeyStore {
	if ks == nil {
		return PKCS8Keys
	}
	return ks
}

// NodeKey is a node key and the content of the node.key that holds it.
type NodeKey struct {
	Signer crypto.Signer
	File   []byte
}

// NewNodeKey makes a node key with ks (nil: PKCS8Keys).
func NewNodeKey(ks KeyStore) (*NodeKey, error) {
	signer, file, err := keysOr(ks).New()
	if err != nil {
		return nil, fmt.Errorf("make the node key: %w", err)
	}
	if signer == nil || len(file) == 0 {
		return nil, errors.New("make the node key: the key store returned no key")
	}
	return &NodeKey{Signer: signer, File: file}, nil
}

// SamePublicKey reports whether a and b are the same public key.
func SamePublicKey(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && b != nil && k.Equal(b)
}
