package protocol

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
)

// NewBootNonce returns a boot nonce: 128 random bits, base64url without padding
// (22 bytes), one word fit for a kernel command line. The site agent mints one per
// ramdisk script and the ramdisk hands it back in its discovery join; tests mint
// theirs here too, so every nonce has this one form.
func NewBootNonce() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("boot nonce: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// ValidBootNonce reports whether s can be a boot nonce: one kernel command line
// word of printable ASCII, 16 to 256 bytes. It is looser than NewBootNonce's form
// on purpose, so a site agent of another release is not refused; it only keeps
// what reaches the store and the logs small and free of spaces, quotes and
// control characters.
func ValidBootNonce(s string) bool {
	if len(s) < 16 || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == '"' || c == '\'' || c == '\\' {
			return false
		}
	}
	return true
}
