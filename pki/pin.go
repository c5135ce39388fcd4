package pki

import (
	"crypto"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/better-compute/bcd/internal/human"
)

// PinPrefix starts every pin. It names the hash so that another one could be
// added without a pin of one kind ever being read as the other.
const PinPrefix = "sha256/"

// ErrPinMismatch means a key is well formed but is not the pinned one. Callers
// that must refuse to go on (bcd join: "refusing to join") test for it with
// errors.Is.
var ErrPinMismatch = errors.New("public key does not match the pin")

// SPKIPin returns the pin of a public key: "sha256/" and the standard base64
// (with padding) of the SHA-256 of its DER SubjectPublicKeyInfo. This is the
// form of HPKP and curl --pinnedpubkey, and what
//
//	openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64
//
// prints, so an operator can check a pin with tools they already trust.
func SPKIPin(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("pin: %w", err)
	}
	return pinOf(der), nil
}

// CertPin returns the pin of a certificate's public key. It hashes the
// certificate's own SubjectPublicKeyInfo bytes, so the pin is the one a TLS
// client computes from the wire even for a key Go would encode differently.
func CertPin(cert *x509.Certificate) string {
	return pinOf(cert.RawSubjectPublicKeyInfo)
}

func pinOf(spkiDER []byte) string {
	sum := sha256.Sum256(spkiDER)
	return PinPrefix + base64.StdEncoding.EncodeToString(sum[:])
}

// ParsePin checks that s is "sha256/" and the canonical standard base64 of
// exactly 32 bytes, and returns those bytes. Anything else is refused rather
// than normalised: whitespace, the URL-safe alphabet, missing padding or stray
// bits all mean the pin was mangled on the way, and a pin that silently
// "almost" matches is worse than an error.
func ParsePin(s string) ([32]byte, error) {
	var out [32]byte
	b64, ok := strings.CutPrefix(s, PinPrefix)
	if !ok {
		return out, fmt.Errorf("pin %q does not start with %q", human.ShortN(s, 80), PinPrefix)
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		return out, fmt.Errorf("pin %q: not standard base64: %w", human.ShortN(s, 80), err)
	}
	// DecodeString skips \r and \n; re-encoding catches those and any other
	// non-canonical spelling.
	if base64.StdEncoding.EncodeToString(raw) != b64 {
		return out, fmt.Errorf("pin %q: not canonical standard base64", human.ShortN(s, 80))
	}
	if len(raw) != len(out) {
		return out, fmt.Errorf("pin %q: %d bytes, want a 32-byte SHA-256", human.ShortN(s, 80), len(raw))
	}
	copy(out[:], raw)
	return out, nil
}

// MatchPin returns nil when pub's pin is pin, an error wrapping ErrPinMismatch
// when it is another key, and another error when pin or pub is malformed.
func MatchPin(pin string, pub crypto.PublicKey) error {
	want, err := ParsePin(pin)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return fmt.Errorf("pin: %w", err)
	}
	got := sha256.Sum256(der)
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return fmt.Errorf("key %s is not pinned %s: %w", pinOf(der), pin, ErrPinMismatch)
	}
	return nil
}

// Pins are the three pins an agent needs to trust the control plane: the
// serving CA (TLS to the gateway), the join signing key (join responses) and
// the join encryption key (sealing the join token).
type Pins struct {
	ServingCA      string
	JoinSigning    string
	JoinEncryption string
}

// BootstrapPins reads the three pins from the public half of the bundle in
// dir; it needs no private key.
func BootstrapPins(dir string) (Pins, error) {
	p, err := LoadPublic(dir)
	if err != nil {
		return Pins{}, err
	}
	return p.Pins(), nil
}

// Validate checks each pin's form and names the config.toml key at fault.
func (p Pins) Validate() error {
	for _, f := range p.fields() {
		if _, err := ParsePin(f.value); err != nil {
			return fmt.Errorf("%s: %w", f.key, err)
		}
	}
	return nil
}

// ConfigLines renders the pins as the three config.toml lines, in the order and
// spelling of the spec, each ending in a newline.
func (p Pins) ConfigLines() string {
	var b strings.Builder
	for _, f := range p.fields() {
		// %q is a valid TOML basic string for the base64 alphabet a valid pin
		// is made of.
		fmt.Fprintf(&b, "%s = %q\n", f.key, f.value)
	}
	return b.String()
}

func (p Pins) fields() []struct{ key, value string } {
	return []struct{ key, value string }{
		{"serving_ca_spki_pin", p.ServingCA},
		{"join_signing_key_pin", p.JoinSigning},
		{"join_encryption_key_pin", p.JoinEncryption},
	}
}
