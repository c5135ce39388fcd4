package protocol

import (
	"fmt"
	"net"
	"strings"

	"github.com/better-compute/bcd/internal/human"
)

// ParseMAC is the one MAC grammar: a 48-bit Ethernet address written with
// colons or dashes between bytes (one kind throughout) or as Cisco's three dotted
// groups, in either case, surrounding spaces ignored, and nothing else (bare hex
// is refused: it reads as a name). A MAC crosses every hop (the operator's CLI,
// the api, the boot table, iPXE paths, events), so every hop accepts the same
// spellings. It is spelled out here rather than left to net.ParseMAC, whose
// grammar grows with Go releases (Go 1.26 takes bare hex).
func ParseMAC(s string) (net.HardwareAddr, error) {
	t := strings.TrimSpace(s)
	var hex string
	switch {
	case len(t) == 17 && (t[2] == ':' || t[2] == '-'):
		for i := 2; i < 17; i += 3 {
			if t[i] != t[2] {
				return nil, badMAC(s)
			}
			hex += t[i-2 : i]
		}
		hex += t[15:]
	case len(t) == 14 && t[4] == '.' && t[9] == '.':
		hex = t[0:4] + t[5:9] + t[10:14]
	default:
		return nil, badMAC(s)
	}
	hw := make(net.HardwareAddr, 6)
	for i := range hw {
		hi, ok1 := unhex(hex[2*i])
		lo, ok2 := unhex(hex[2*i+1])
		if !ok1 || !ok2 {
			return nil, badMAC(s)
		}
		hw[i] = hi<<4 | lo
	}
	return hw, nil
}

func badMAC(s string) error {
	return fmt.Errorf("%q is not a 48-bit MAC address (want like 52:54:00:12:34:56)", human.Short(s))
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// NormalizeMAC returns s in the form machines are keyed and sent by: lowercase,
// colon-separated (00:1a:2b:3c:4d:5e).
func NormalizeMAC(s string) (string, error) {
	hw, err := ParseMAC(s)
	if err != nil {
		return "", err
	}
	return hw.String(), nil
}
