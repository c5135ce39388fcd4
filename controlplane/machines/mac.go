package machines

import "github.com/better-compute/bcd/protocol"

// LooksLikeMAC reports whether s parses as a MAC address (protocol.ParseMAC), so that a machine
// reference can tell a MAC from a name.
func LooksLikeMAC(s string) bool {
	_, err := protocol.ParseMAC(s)
	return err == nil
}
