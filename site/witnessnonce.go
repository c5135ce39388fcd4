package site

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/internal/secretfile"
)

// WitnessKeyFile, in data_dir, is the key the site agent authenticates its boot
// nonces with (32 random bytes, 0600, made on first use). A nonce carries its
// MAC and expiry under that key, so a site agent restarted between a machine's
// script and its join still witnesses that join: the table of live nonces is
// lost with the process, the key is not. Without it, every machine of a storm
// that had fetched its script when the agent restarted was refused until it
// PXE-booted again (the faults run's stuck machines).
const WitnessKeyFile = "witness.key"

const (
	witnessKeySize = 32
	nonceRandSize  = 16
	nonceTagSize   = 16
	nonceBodySize  = nonceRandSize + 6 + 8 // random, MAC, expiry (Unix seconds)
	nonceRawSize   = nonceBodySize + nonceTagSize
	nonceLabel     = "bcd boot nonce v1\x00"
)

// loadWitnessKey reads <dataDir>/witness.key, or makes it.
func loadWitnessKey(dataDir string) ([]byte, error) {
	path := filepath.Join(dataDir, WitnessKeyFile)
	b, err := secretfile.Read(path, secretfile.Options{Limit: 1024, Private: true, What: "the boot nonce key", NoFollow: true})
	if errors.Is(err, fs.ErrNotExist) {
		key := make([]byte, witnessKeySize)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("boot nonce key: %w", err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			return loadWitnessKey(dataDir) // another start made it meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("boot nonce key: %w", err)
		}
		_, werr := f.Write(key)
		if serr := f.Sync(); werr == nil {
			werr = serr
		}
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			os.Remove(path)
			return nil, fmt.Errorf("boot nonce key %s: %w", path, werr)
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("boot nonce key: %w", err)
	}
	if len(b) != witnessKeySize {
		return nil, fmt.Errorf("boot nonce key %s: %d bytes, want %d (remove it to make a new one; machines between their script and their join then PXE-boot again)", path, len(b), witnessKeySize)
	}
	return b, nil
}

// nonceTag authenticates a nonce's random part, MAC and expiry.
func nonceTag(key, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(nonceLabel))
	m.Write(body)
	return m.Sum(nil)[:nonceTagSize]
}

// newKeyedNonce mints a nonce for mac valid until expires: 128 random bits,
// the MAC, the expiry and a tag, base64url (62 characters).
func newKeyedNonce(key []byte, mac net.HardwareAddr, expires time.Time) (string, error) {
	if len(mac) != 6 {
		return "", fmt.Errorf("boot nonce: MAC %s is not 6 bytes", mac)
	}
	raw := make([]byte, nonceRawSize)
	if _, err := rand.Read(raw[:nonceRandSize]); err != nil {
		return "", fmt.Errorf("boot nonce: %w", err)
	}
	copy(raw[nonceRandSize:], mac)
	binary.BigEndian.PutUint64(raw[nonceRandSize+6:], uint64(expires.Unix()))
	copy(raw[nonceBodySize:], nonceTag(key, raw[:nonceBodySize]))
	return base64.RawURLEncoding.EncodeToString(raw), nil
}

// openKeyedNonce says whether nonce was minted under key, for which MAC and
// until when.
func openKeyedNonce(key []byte, nonce string) (net.HardwareAddr, time.Time, bool) {
	raw, err := base64.RawURLEncoding.DecodeString(nonce)
	if err != nil || len(raw) != nonceRawSize || !hmac.Equal(nonceTag(key, raw[:nonceBodySize]), raw[nonceBodySize:]) {
		return nil, time.Time{}, false
	}
	mac := net.HardwareAddr(append([]byte(nil), raw[nonceRandSize:nonceRandSize+6]...))
	return mac, time.Unix(int64(binary.BigEndian.Uint64(raw[nonceRandSize+6:nonceBodySize])), 0), true
}
