package machines

import (
	"fmt"
	"net"
	"strings"

	"github.com/better-compute/bcd/internal/human"
)

// NormalizeMAC returns an Ethernet MAC address in the form the control
// plane keys machines by: lowercase, colon-separated (00:1a:2b:3c:4d:5e).
// It accepts what net.ParseMAC does for 48-bit addresses (colons, dashes,
// or Cisco dots, in either case).
func NormalizeMAC(s string) (string, error) {
	hw, err := net.ParseMAC(strings.TrimSpace(s))
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("%q is not a 48-bit MAC address (want like 52:54:00:12:34:56)", human.Short(s))
	}
	return hw.String(), nil
}

// LooksLikeMAC reports whether s parses as a MAC address, so that a machine
// reference can tell a MAC from a name.
func LooksLikeMAC(s string) bool {
	_, err := NormalizeMAC(s)
	return err == nil
}

// ValidNonce reports whether s can be a boot nonce: one kernel command line
// word of printable ASCII, 16 to 256 bytes. The site agent chooses its
// alphabet; this only keeps what reaches the store and the logs small and
// free of spaces, quotes and control characters.
func ValidNonce(s string) bool {
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
