package token

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"errors"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/protocol"
)

// secretBytes is the entropy of every token.
const secretBytes = 32

// secretLen is the length of the encoded secret: 32 bytes in unpadded base32.
var secretLen = enc.EncodedLen(secretBytes)

// enc is base32 in lower case without padding: no _ (the separator), nothing
// a shell or URL would mangle.
var enc = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// ErrMalformed means a string is not a token of the kind asked for. It never
// carries the string: it may be a secret pasted in the wrong place.
var ErrMalformed = errors.New("not a well-formed token")

// Hash is the SHA-256 of a token's secret part, what the store keeps.
type Hash [sha256.Size]byte

// Equal compares two hashes in constant time.
func (h Hash) Equal(o Hash) bool { return subtle.ConstantTimeCompare(h[:], o[:]) == 1 }

// Join is a freshly minted join token.
type Join struct {
	// ID names the token's record; it is not secret.
	ID string
	// Token is the whole bcjt_ string, shown to the operator once.
	Token string
	// Hash is what the store keeps.
	Hash Hash
}

// NewJoin mints a join token.
func NewJoin(now time.Time) Join {
	id := ids.New(ids.PrefixToken, now)
	secret := newSecret()
	return Join{
		ID:    id,
		Token: protocol.TokenPrefix + id + "_" + secret,
		Hash:  sha256.Sum256([]byte(secret)),
	}
}

// ParseJoin splits a join token into its id and the hash of its secret.
func ParseJoin(s string) (id string, h Hash, err error) {
	rest, ok := strings.CutPrefix(s, protocol.TokenPrefix)
	idLen := len(ids.PrefixToken) + ids.ULIDLen
	if !ok || len(rest) != idLen+1+secretLen || rest[idLen] != '_' {
		return "", Hash{}, ErrMalformed
	}
	id, secret := rest[:idLen], rest[idLen+1:]
	if !ids.Valid(ids.PrefixToken, id) || !validSecret(secret) {
		return "", Hash{}, ErrMalformed
	}
	return id, sha256.Sum256([]byte(secret)), nil
}

// Operator is a freshly minted operator token.
type Operator struct {
	// Token is the whole bcop_ string, shown once.
	Token string
	// Hash is what the store keeps.
	Hash Hash
}

// NewOperator mints an operator token.
func NewOperator() Operator {
	secret := newSecret()
	return Operator{Token: protocol.OperatorTokenPrefix + secret, Hash: sha256.Sum256([]byte(secret))}
}

// ParseOperator returns the hash of an operator token's secret.
func ParseOperator(s string) (Hash, error) {
	secret, ok := strings.CutPrefix(s, protocol.OperatorTokenPrefix)
	if !ok || !validSecret(secret) {
		return Hash{}, ErrMalformed
	}
	return sha256.Sum256([]byte(secret)), nil
}

func newSecret() string {
	b := make([]byte, secretBytes)
	rand.Read(b) // never fails since Go 1.24
	return enc.EncodeToString(b)
}

func validSecret(s string) bool {
	if len(s) != secretLen {
		return false
	}
	b, err := enc.DecodeString(s)
	// Re-encoding refuses a spelling with stray low bits, so a token has one
	// spelling and one hash.
	return err == nil && enc.EncodeToString(b) == s
}
