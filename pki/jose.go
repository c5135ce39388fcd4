package pki

import (
	"crypto/ecdsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/internal/human"
)

// The only algorithms bcd produces or accepts. Fixing them, instead of
// negotiating, closes the usual JOSE downgrades (alg "none", HMAC keyed with a
// public key, direct key agreement without wrapping).
const (
	// JWEKeyAlgorithm wraps a fresh content key per message to the
	// recipient's P-256 key.
	JWEKeyAlgorithm = jose.ECDH_ES_A256KW
	// JWEContentEncryption encrypts the payload.
	JWEContentEncryption = jose.A256GCM
	// JWSAlgorithm signs with a P-256 key.
	JWSAlgorithm = jose.ES256
)

// Size limits, checked before any parsing. A sealed join token is a few hundred
// bytes; a signed join response carries a certificate chain and a trust bundle
// and a release manifest lists a few artifacts, so both fit well under 1 MiB.
const (
	MaxJWESize = 16 << 10
	MaxJWSSize = 1 << 20
)

// PurposeHeader is the protected JWS header that says what a signature is
// for. It is inside the signed bytes, so it cannot be changed without the key.
const PurposeHeader = "bcd-purpose"

// Purposes signed with keys of this PKI.
const (
	PurposeJoinResponse    = "join-response"
	PurposeReleaseManifest = "release-manifest"
)

var purposeRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

func checkPurpose(purpose string) error {
	if !purposeRE.MatchString(purpose) {
		return fmt.Errorf("JWS purpose %q: want [a-z0-9-], at most 63 characters", purpose)
	}
	return nil
}

// Seal encrypts plaintext to pub as a compact JWE (ECDH-ES+A256KW, A256GCM).
// The kid header is pub's SPKI pin, a hint for a receiver holding more than one
// key; Open does not rely on it.
func Seal(pub *ecdsa.PublicKey, plaintext []byte) (string, error) {
	ec, err := asP256(pub)
	if err != nil {
		return "", fmt.Errorf("seal: %w", err)
	}
	pin, err := SPKIPin(ec)
	if err != nil {
		return "", fmt.Errorf("seal: %w", err)
	}
	enc, err := jose.NewEncrypter(JWEContentEncryption,
		jose.Recipient{Algorithm: JWEKeyAlgorithm, Key: ec, KeyID: pin}, nil)
	if err != nil {
		return "", fmt.Errorf("seal: %w", err)
	}
	obj, err := enc.Encrypt(plaintext)
	if err != nil {
		return "", fmt.Errorf("seal: %w", err)
	}
	out, err := obj.CompactSerialize()
	if err != nil {
		return "", fmt.Errorf("seal: %w", err)
	}
	// Never hand out a token that Open on the other side would refuse.
	if len(out) > MaxJWESize {
		return "", fmt.Errorf("seal: JWE would be %d bytes, over the %d-byte limit", len(out), MaxJWESize)
	}
	return out, nil
}

// Open decrypts a compact JWE made by Seal. Only ECDH-ES+A256KW with A256GCM
// is accepted, without compression or critical extensions; anything over
// MaxJWESize is refused unread. Errors never quote the token.
func Open(priv *ecdsa.PrivateKey, compact string) ([]byte, error) {
	if priv == nil {
		return nil, errors.New("open JWE: no private key")
	}
	if _, err := asP256(&priv.PublicKey); err != nil {
		return nil, fmt.Errorf("open JWE: %w", err)
	}
	if len(compact) > MaxJWESize {
		return nil, fmt.Errorf("open JWE: %d bytes, over the %d-byte limit", len(compact), MaxJWESize)
	}
	hdr, err := protectedHeader(compact, 5)
	if err != nil {
		return nil, fmt.Errorf("open JWE: %w", err)
	}
	if err := hdr.want("alg", string(JWEKeyAlgorithm)); err != nil {
		return nil, fmt.Errorf("open JWE: %w", err)
	}
	if err := hdr.want("enc", string(JWEContentEncryption)); err != nil {
		return nil, fmt.Errorf("open JWE: %w", err)
	}
	// Seal never compresses: refusing "zip" keeps decompression (and its
	// bombs) out of reach of an unauthenticated sender.
	if err := hdr.absent("zip", "crit"); err != nil {
		return nil, fmt.Errorf("open JWE: %w", err)
	}
	obj, err := jose.ParseEncryptedCompact(compact,
		[]jose.KeyAlgorithm{JWEKeyAlgorithm}, []jose.ContentEncryption{JWEContentEncryption})
	if err != nil {
		return nil, fmt.Errorf("open JWE: %w", err)
	}
	plaintext, err := obj.Decrypt(priv)
	if err != nil {
		return nil, fmt.Errorf("open JWE: %w", err)
	}
	return plaintext, nil
}

// Sign signs payload as a compact JWS (ES256) whose protected header names
// purpose, so that a signature made for one purpose (a join response) can
// never be presented as another (a release manifest) even though the same
// verifier code and possibly the same key check both. The header also embeds
// the public key as a JWK, so that a verifier holding only a pin can check
// the signature (VerifyPinned).
func Sign(priv *ecdsa.PrivateKey, purpose string, payload []byte) (string, error) {
	if priv == nil {
		return "", errors.New("sign: no private key")
	}
	if _, err := asP256(&priv.PublicKey); err != nil {
		return "", fmt.Errorf("sign: %w", err)
	}
	if err := checkPurpose(purpose); err != nil {
		return "", fmt.Errorf("sign: %w", err)
	}
	opts := (&jose.SignerOptions{EmbedJWK: true}).WithHeader(PurposeHeader, purpose)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: JWSAlgorithm, Key: priv}, opts)
	if err != nil {
		return "", fmt.Errorf("sign: %w", err)
	}
	obj, err := signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("sign: %w", err)
	}
	out, err := obj.CompactSerialize()
	if err != nil {
		return "", fmt.Errorf("sign: %w", err)
	}
	if len(out) > MaxJWSSize {
		return "", fmt.Errorf("sign: JWS would be %d bytes, over the %d-byte limit", len(out), MaxJWSSize)
	}
	return out, nil
}

// Verify checks a compact JWS made by Sign under pub for exactly purpose and
// returns its payload. Only ES256 is accepted; the embedded JWK is ignored,
// the caller's key is the one that counts.
func Verify(pub *ecdsa.PublicKey, purpose, compact string) ([]byte, error) {
	ec, err := asP256(pub)
	if err != nil {
		return nil, fmt.Errorf("verify JWS: %w", err)
	}
	if _, err := checkJWSHeader(purpose, compact); err != nil {
		return nil, err
	}
	obj, err := jose.ParseSignedCompact(compact, []jose.SignatureAlgorithm{JWSAlgorithm})
	if err != nil {
		return nil, fmt.Errorf("verify JWS: %w", err)
	}
	payload, err := obj.Verify(ec)
	if err != nil {
		return nil, fmt.Errorf("verify JWS: %w", err)
	}
	return payload, nil
}

// VerifyPinned verifies a JWS for purpose under the public key embedded in
// its header, after checking that key's SPKI pin is pin. It serves a verifier
// that knows only a pin, as bcd join knows only join_signing_key_pin. It
// returns the payload and the key. A key that is not the pinned one fails
// with an error wrapping ErrPinMismatch, before its signature is looked at.
func VerifyPinned(pin, purpose, compact string) ([]byte, *ecdsa.PublicKey, error) {
	if _, err := ParsePin(pin); err != nil {
		return nil, nil, fmt.Errorf("verify JWS: %w", err)
	}
	hdr, err := checkJWSHeader(purpose, compact)
	if err != nil {
		return nil, nil, err
	}
	raw, ok := hdr["jwk"]
	if !ok {
		return nil, nil, errors.New("verify JWS: no jwk header to check against the pin")
	}
	pub, err := ParsePublicJWK(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("verify JWS: jwk header: %w", err)
	}
	if err := MatchPin(pin, pub); err != nil {
		return nil, nil, fmt.Errorf("verify JWS: signer: %w", err)
	}
	payload, err := Verify(pub, purpose, compact)
	if err != nil {
		return nil, nil, err
	}
	return payload, pub, nil
}

// checkJWSHeader applies the checks Verify and VerifyPinned share, before any
// key is used: size, algorithm, purpose, and no extension that would change
// how the payload is read.
func checkJWSHeader(purpose, compact string) (header, error) {
	if err := checkPurpose(purpose); err != nil {
		return nil, fmt.Errorf("verify JWS: %w", err)
	}
	if len(compact) > MaxJWSSize {
		return nil, fmt.Errorf("verify JWS: %d bytes, over the %d-byte limit", len(compact), MaxJWSSize)
	}
	hdr, err := protectedHeader(compact, 3)
	if err != nil {
		return nil, fmt.Errorf("verify JWS: %w", err)
	}
	if err := hdr.want("alg", string(JWSAlgorithm)); err != nil {
		return nil, fmt.Errorf("verify JWS: %w", err)
	}
	if err := hdr.want(PurposeHeader, purpose); err != nil {
		return nil, fmt.Errorf("verify JWS: %w", err)
	}
	if err := hdr.absent("crit", "b64"); err != nil {
		return nil, fmt.Errorf("verify JWS: %w", err)
	}
	return hdr, nil
}

// header is a decoded JOSE protected header.
type header map[string]json.RawMessage

// protectedHeader decodes the first segment of a compact serialization with
// parts segments. It is read here, ahead of go-jose, so that policy (which
// algorithm, which purpose) is decided by this package's own few lines.
func protectedHeader(compact string, parts int) (header, error) {
	if n := strings.Count(compact, ".") + 1; n != parts {
		return nil, fmt.Errorf("compact serialization has %d parts, want %d", n, parts)
	}
	first, _, _ := strings.Cut(compact, ".")
	raw, err := base64.RawURLEncoding.DecodeString(first)
	if err != nil {
		return nil, errors.New("protected header is not base64url")
	}
	var h header
	if err := json.Unmarshal(raw, &h); err != nil || h == nil {
		return nil, errors.New("protected header is not a JSON object")
	}
	return h, nil
}

// want requires member name to be the string value.
func (h header) want(name, value string) error {
	raw, ok := h[name]
	if !ok {
		return fmt.Errorf("header %q missing, want %q", name, value)
	}
	var got string
	if err := json.Unmarshal(raw, &got); err != nil {
		return fmt.Errorf("header %q is not a string, want %q", name, value)
	}
	if got != value {
		return fmt.Errorf("header %q is %q, want %q", name, human.ShortN(got, 80), value)
	}
	return nil
}

// absent refuses any of the named members.
func (h header) absent(names ...string) error {
	for _, n := range names {
		if _, ok := h[n]; ok {
			return fmt.Errorf("header %q is not accepted", n)
		}
	}
	return nil
}
