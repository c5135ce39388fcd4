package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
)

// MaxJWKSize bounds a JWK before it is parsed. A P-256 public JWK is about 200
// bytes; the limit leaves room for optional members and nothing more, since
// the JWK comes from a file or a network document bcd does not yet trust.
const MaxJWKSize = 4 << 10

// p256CoordSize is the length RFC 7518 §6.2.1.2 requires of x and y.
const p256CoordSize = 32

// publicJWK is the JSON of the keys bcd publishes, members in the order of
// RFC 7638 so the output is stable and easy to compare by eye.
type publicJWK struct {
	Crv string `json:"crv"`
	Kty string `json:"kty"`
	X   string `json:"x"`
	Y   string `json:"y"`
	// Kid is the key's SPKI pin, so an operator can see which config.toml pin
	// a JWK answers to. It is a label only: readers recompute the pin.
	Kid string `json:"kid"`
}

// PublicJWK encodes a P-256 public key as a JWK (RFC 7517).
func PublicJWK(pub *ecdsa.PublicKey) ([]byte, error) {
	ec, err := asP256(pub)
	if err != nil {
		return nil, fmt.Errorf("JWK: %w", err)
	}
	point, err := ec.Bytes() // 0x04 || x || y
	if err != nil {
		return nil, fmt.Errorf("JWK: %w", err)
	}
	pin, err := SPKIPin(ec)
	if err != nil {
		return nil, err
	}
	enc := base64.RawURLEncoding
	return json.Marshal(publicJWK{
		Crv: "P-256",
		Kty: "EC",
		X:   enc.EncodeToString(point[1 : 1+p256CoordSize]),
		Y:   enc.EncodeToString(point[1+p256CoordSize:]),
		Kid: pin,
	})
}

// ParsePublicJWK decodes a public P-256 JWK. It refuses a JWK carrying a
// private part ("d"): a private key pasted where a public one belongs must be
// noticed, not quietly stripped. Members other than kty, crv, x and y are
// ignored as RFC 7517 asks; the point must lie on the curve.
func ParsePublicJWK(data []byte) (*ecdsa.PublicKey, error) {
	if len(data) > MaxJWKSize {
		return nil, fmt.Errorf("JWK is %d bytes, over the %d-byte limit", len(data), MaxJWKSize)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil || m == nil {
		return nil, errors.New("JWK is not a JSON object")
	}
	if _, ok := m["d"]; ok {
		// Say no more than that: the value is a secret.
		return nil, errors.New("JWK holds a private key; want the public key only")
	}
	var f struct{ kty, crv, x, y string }
	for _, mem := range []struct {
		name string
		dst  *string
	}{{"kty", &f.kty}, {"crv", &f.crv}, {"x", &f.x}, {"y", &f.y}} {
		raw, ok := m[mem.name]
		if !ok {
			return nil, fmt.Errorf("JWK has no %q", mem.name)
		}
		if err := json.Unmarshal(raw, mem.dst); err != nil {
			return nil, fmt.Errorf("JWK %q is not a string", mem.name)
		}
	}
	if f.kty != "EC" {
		return nil, fmt.Errorf("JWK kty is %q, want \"EC\"", f.kty)
	}
	if f.crv != "P-256" {
		return nil, fmt.Errorf("JWK crv is %q, want \"P-256\"", f.crv)
	}
	x, err := decodeCoord("x", f.x)
	if err != nil {
		return nil, err
	}
	y, err := decodeCoord("y", f.y)
	if err != nil {
		return nil, err
	}
	point := append(append([]byte{4}, x...), y...)
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), point)
	if err != nil {
		return nil, fmt.Errorf("JWK: not a point on P-256: %w", err)
	}
	return pub, nil
}

func decodeCoord(name, s string) ([]byte, error) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || base64.RawURLEncoding.EncodeToString(b) != s {
		return nil, fmt.Errorf("JWK %q is not unpadded base64url", name)
	}
	if len(b) != p256CoordSize {
		return nil, fmt.Errorf("JWK %q is %d bytes, want %d", name, len(b), p256CoordSize)
	}
	return b, nil
}

// JWKMatchesPin parses a JWK and returns its key only when the key's SPKI pin
// is pin. The join client seals the token only to such a key: the JWK comes
// from a file or a web document that anyone on the path could have swapped,
// while the pin came with the install.
func JWKMatchesPin(jwkJSON []byte, pin string) (*ecdsa.PublicKey, error) {
	if _, err := ParsePin(pin); err != nil {
		return nil, err
	}
	pub, err := ParsePublicJWK(jwkJSON)
	if err != nil {
		return nil, err
	}
	if err := MatchPin(pin, pub); err != nil {
		return nil, fmt.Errorf("JWK: %w", err)
	}
	return pub, nil
}
