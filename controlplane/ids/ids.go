package ids

import (
	"crypto/rand"
	"encoding/binary"
	"time"

	"github.com/better-compute/bcd/controlplane/refusal"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// Prefixes of the kinds of id.
const (
	PrefixNode    = "n_"
	PrefixToken   = "jt_"
	PrefixCommand = "cmd_"
	PrefixMachine = "m_"
	// PrefixDeployment names a machine's deployment (the lifecycle).
	PrefixDeployment = "dep_"
	// PrefixRollout names a rollout of a release.
	PrefixRollout = "ro_"
)

// ULIDLen is the length of the part after the prefix.
const ULIDLen = 26

// crockford is Crockford's base32 alphabet in lower case: no i, l, o or u, so
// an id read aloud or copied by hand is not misread.
const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

// New returns prefix followed by a fresh ULID for time now.
func New(prefix string, now time.Time) string {
	var b [16]byte
	ms := uint64(now.UnixMilli())
	binary.BigEndian.PutUint16(b[0:2], uint16(ms>>32))
	binary.BigEndian.PutUint32(b[2:6], uint32(ms))
	// crypto/rand.Read never fails (Go 1.24+): it crashes the program rather
	// than return predictable bytes.
	rand.Read(b[6:])
	return prefix + encode(b)
}

// encode writes 128 bits as 26 base32 digits, the first carrying 3 bits.
func encode(b [16]byte) string {
	var out [ULIDLen]byte
	hi := binary.BigEndian.Uint64(b[0:8])
	lo := binary.BigEndian.Uint64(b[8:16])
	for i := ULIDLen - 1; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}

// Valid reports whether s is prefix followed by a well-formed ULID.
func Valid(prefix, s string) bool {
	if len(s) != len(prefix)+ULIDLen || s[:len(prefix)] != prefix {
		return false
	}
	u := s[len(prefix):]
	// 128 bits in 26 digits leave the first digit 3 bits: 0-7.
	if u[0] > '7' {
		return false
	}
	for i := 0; i < len(u); i++ {
		if !isDigit(u[i]) {
			return false
		}
	}
	return true
}

func isDigit(c byte) bool {
	for i := 0; i < len(crockford); i++ {
		if crockford[i] == c {
			return true
		}
	}
	return false
}

// CheckName refuses (INVALID_INPUT) a name that is not protocol.ValidName, quoting
// it cut short and naming what it is for.
func CheckName(what, v string) error {
	if !protocol.ValidName(v) {
		return refusal.New(protocol.CodeInvalidInput, "%s %q: %s", what, human.ShortN(v, 80), protocol.NameRule)
	}
	return nil
}
