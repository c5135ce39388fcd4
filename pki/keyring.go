package pki

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"github.com/better-compute/bcd/internal/secretfile"
)

// SecretsKeyFile is the keyring in the PKI bundle's directory under which the
// control plane seals the secrets it stores (BMC passwords, join tokens in
// command params, credential-bearing image URLs). It is kept beside the bundle,
// not in the database, so that a copy of the database or a backup of it holds
// no secret.
const SecretsKeyFile = "secrets.key"

// SealedPrefix starts every sealed value: "sealed:v1:<key id>:<base64>". A
// value without it is plaintext (from a database older than sealing).
const SealedPrefix = "sealed:v1:"

// maxKeyringSize bounds a keyring file.
const maxKeyringSize = 64 << 10

// keyringVersion is the format of a keyring file.
const keyringVersion = 1

// Keyring holds AES-256-GCM keys by id: Primary seals, every key opens what it
// sealed. Rotation adds a new primary, reseals, then retires the old keys, so
// a keyring written at any step opens every stored value.
type Keyring struct {
	path    string
	primary string
	keys    map[string]cipher.AEAD
	raw     map[string][]byte
}

type keyringFile struct {
	Version int          `json:"version"`
	Primary string       `json:"primary"`
	Keys    []keyringKey `json:"keys"`
}

type keyringKey struct {
	ID  string `json:"id"`
	Key string `json:"key"` // base64, 32 bytes
}

// OpenKeyring reads the keyring at path, creating it (mode 0600, one new key)
// when create is set and there is none. A keyring that group or others may
// read is refused: it opens every sealed value.
// A symbolic link at path is refused: a daemon's own keyring is never one.
func OpenKeyring(path string, create bool) (*Keyring, error) {
	return openKeyring(path, create, true)
}

func openKeyring(path string, create, noFollow bool) (*Keyring, error) {
	b, err := secretfile.Read(path, secretfile.Options{Limit: maxKeyringSize, Private: true, What: "the secrets keyring", NoFollow: noFollow})
	if errors.Is(err, fs.ErrNotExist) && create {
		k := &Keyring{path: path, keys: map[string]cipher.AEAD{}, raw: map[string][]byte{}}
		if _, err := k.addKey(); err != nil {
			return nil, err
		}
		if err := k.Save(); err != nil {
			return nil, err
		}
		return k, nil
	}
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	var f keyringFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("keyring %s: %w", path, err)
	}
	if f.Version != keyringVersion {
		return nil, fmt.Errorf("keyring %s has version %d, this build reads version %d", path, f.Version, keyringVersion)
	}
	k := &Keyring{path: path, primary: f.Primary, keys: map[string]cipher.AEAD{}, raw: map[string][]byte{}}
	for _, e := range f.Keys {
		key, err := base64.StdEncoding.DecodeString(e.Key)
		if err != nil || len(key) != 32 || !validKeyID(e.ID) {
			return nil, fmt.Errorf("keyring %s: key %q: want an id of 16 hex digits and 32 bytes in base64", path, e.ID)
		}
		if err := k.put(e.ID, key); err != nil {
			return nil, err
		}
	}
	if _, ok := k.keys[f.Primary]; !ok {
		return nil, fmt.Errorf("keyring %s: primary key %q is not in the keyring", path, f.Primary)
	}
	return k, nil
}

// OpenSecretsKeyring opens <pkiDir>/secrets.key, creating it for a bundle made
// before there was one. Like the bundle's keys it may be a symbolic link (a
// Secret volume's).
func OpenSecretsKeyring(pkiDir string) (*Keyring, error) {
	return openKeyring(filepath.Join(pkiDir, SecretsKeyFile), true, false)
}

func validKeyID(id string) bool {
	_, err := hex.DecodeString(id)
	return len(id) == 16 && err == nil
}

func (k *Keyring) put(id string, key []byte) error {
	block, err := aes.NewCipher(key)
	if err != nil {
		return err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return err
	}
	k.keys[id], k.raw[id] = aead, key
	return nil
}

// addKey makes a new random key the primary one.
func (k *Keyring) addKey() (string, error) {
	var id [8]byte
	key := make([]byte, 32)
	if _, err := rand.Read(id[:]); err != nil {
		return "", err
	}
	if _, err := rand.Read(key); err != nil {
		return "", err
	}
	kid := hex.EncodeToString(id[:])
	if err := k.put(kid, key); err != nil {
		return "", err
	}
	k.primary = kid
	return kid, nil
}

// Rotate adds a new primary key and writes the keyring; the old keys stay
// until Retire, so values sealed under them still open.
func (k *Keyring) Rotate() (string, error) {
	prev := k.primary
	kid, err := k.addKey()
	if err != nil {
		return "", err
	}
	if err := k.Save(); err != nil {
		// Nothing may be sealed under a key the file does not hold.
		delete(k.keys, kid)
		delete(k.raw, kid)
		k.primary = prev
		return "", err
	}
	return kid, nil
}

// Retire removes every key but the primary and writes the keyring. Call it
// only once every value is sealed under the primary.
func (k *Keyring) Retire() error {
	for id := range k.keys {
		if id != k.primary {
			delete(k.keys, id)
			delete(k.raw, id)
		}
	}
	return k.Save()
}

// Primary is the id of the key that seals.
func (k *Keyring) Primary() string { return k.primary }

// KeyIDs are the ids of the keys held, sorted.
func (k *Keyring) KeyIDs() []string {
	ids := make([]string, 0, len(k.keys))
	for id := range k.keys {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Save writes the keyring to its file, 0600, atomically.
func (k *Keyring) Save() error {
	b, err := k.marshal()
	if err != nil {
		return err
	}
	return WriteFileAtomic(k.path, b, privateMode)
}

func (k *Keyring) marshal() ([]byte, error) {
	f := keyringFile{Version: keyringVersion, Primary: k.primary}
	for _, id := range k.KeyIDs() {
		f.Keys = append(f.Keys, keyringKey{ID: id, Key: base64.StdEncoding.EncodeToString(k.raw[id])})
	}
	b, err := json.MarshalIndent(f, "", "  ")
	return append(b, '\n'), err
}

// newKeyringFile is a new keyring with one key, as pki init writes it.
func newKeyringFile() (bundleFile, error) {
	k := &Keyring{keys: map[string]cipher.AEAD{}, raw: map[string][]byte{}}
	if _, err := k.addKey(); err != nil {
		return bundleFile{}, err
	}
	b, err := k.marshal()
	return bundleFile{SecretsKeyFile, b, privateMode}, err
}

// Seal encrypts plaintext under the primary key, with label as additional
// data (what the value is: a sealed password cannot be passed off as another
// field), and returns "sealed:v1:<key id>:<base64 nonce+ciphertext>".
func (k *Keyring) Seal(label, plaintext string) (string, error) {
	aead := k.keys[k.primary]
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plaintext)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	out := aead.Seal(nonce, nonce, []byte(plaintext), []byte(label))
	return SealedPrefix + k.primary + ":" + base64.RawStdEncoding.EncodeToString(out), nil
}

// Sealed reports whether v is a sealed value, and the id of its key.
func Sealed(v string) (kid string, ok bool) {
	rest, ok := strings.CutPrefix(v, SealedPrefix)
	if !ok {
		return "", false
	}
	kid, _, ok = strings.Cut(rest, ":")
	return kid, ok
}

// Open decrypts a value Seal made under label. Its errors name the key, never
// the value.
func (k *Keyring) Open(label, v string) (string, error) {
	rest, ok := strings.CutPrefix(v, SealedPrefix)
	if !ok {
		return "", errors.New("keyring: not a sealed value")
	}
	kid, b64, ok := strings.Cut(rest, ":")
	if !ok {
		return "", errors.New("keyring: malformed sealed value")
	}
	aead, ok := k.keys[kid]
	if !ok {
		return "", fmt.Errorf("keyring %s: no key %q for a sealed %s (was the keyring replaced?)", k.path, kid, label)
	}
	b, err := base64.RawStdEncoding.DecodeString(b64)
	if err != nil || len(b) < aead.NonceSize() {
		return "", fmt.Errorf("keyring: malformed sealed %s", label)
	}
	pt, err := aead.Open(nil, b[:aead.NonceSize()], b[aead.NonceSize():], []byte(label))
	if err != nil {
		return "", fmt.Errorf("keyring: sealed %s does not open under key %s", label, kid)
	}
	return string(pt), nil
}

// NeedsReseal reports whether v is plaintext or sealed under a key other
// than the primary.
func (k *Keyring) NeedsReseal(v string) bool {
	kid, ok := Sealed(v)
	return !ok || kid != k.primary
}
