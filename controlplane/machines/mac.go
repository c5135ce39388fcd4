package machines

import "github.com/better-compute/bcd/protocol"

// LooksLikeMAC reports whether s parses as a MAC address (protocol.ParseMAC), so that a machine
// reference can tell a MAC from a name.
func LooksLikeMAC(s string) bool {
	_, err := protocol.ParseMAC(s)
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
