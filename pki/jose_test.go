package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
)

// flipByte returns compact with one byte of segment seg (0-based) flipped.
func flipByte(t *testing.T, compact string, seg int) string {
	t.Helper()
	parts := strings.Split(compact, ".")
	b, err := base64.RawURLEncoding.DecodeString(parts[seg])
	if err != nil || len(b) == 0 {
		t.Fatalf("segment %d: %v", seg, err)
	}
	b[len(b)/2] ^= 0x01
	parts[seg] = base64.RawURLEncoding.EncodeToString(b)
	return strings.Join(parts, ".")
}

func TestSealOpen(t *testing.T) {
	k, other := mustKey(t, elliptic.P256()), mustKey(t, elliptic.P256())
	msg := []byte(`{"token":"bcjt_example","csr_sha256":"00"}`)
	sealed, err := Seal(&k.PublicKey, msg)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(sealed, "."); n != 4 {
		t.Fatalf("not a compact JWE: %d dots", n)
	}
	got, err := Open(k, sealed)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("Open = %q, want %q", got, msg)
	}
	hdr, _ := protectedHeader(sealed, 5)
	pin, _ := SPKIPin(&k.PublicKey)
	if err := hdr.want("kid", pin); err != nil {
		t.Error(err)
	}
	if again, _ := Seal(&k.PublicKey, msg); again == sealed {
		t.Error("two seals of one message are equal; the ephemeral key is not fresh")
	}

	refused := func(name string, key *ecdsa.PrivateKey, compact string) {
		t.Helper()
		pt, err := Open(key, compact)
		if err == nil {
			t.Errorf("%s: Open succeeded with %q", name, pt)
			return
		}
		if bytes.Contains([]byte(err.Error()), msg) {
			t.Errorf("%s: error quotes the plaintext: %v", name, err)
		}
	}
	refused("other key", other, sealed)
	refused("tampered ciphertext", k, flipByte(t, sealed, 3))
	refused("tampered tag", k, flipByte(t, sealed, 4))
	refused("tampered wrapped key", k, flipByte(t, sealed, 1))
	refused("tampered IV", k, flipByte(t, sealed, 2))
	refused("tampered header", k, flipByte(t, sealed, 0))
	refused("truncated", k, sealed[:len(sealed)-10])
	refused("JWS instead", k, mustSign(t, k, PurposeJoinResponse, msg))
	refused("empty", k, "")
	refused("too big", k, sealed+strings.Repeat("A", MaxJWESize))

	// Tokens other libraries (or attackers) could make with other algorithms.
	foreign := []struct {
		name string
		alg  jose.KeyAlgorithm
		enc  jose.ContentEncryption
		opts *jose.EncrypterOptions
	}{
		{"ECDH-ES direct", jose.ECDH_ES, jose.A256GCM, nil},
		{"ECDH-ES+A128KW", jose.ECDH_ES_A128KW, jose.A256GCM, nil},
		{"A128GCM content", jose.ECDH_ES_A256KW, jose.A128GCM, nil},
		{"A256CBC-HS512 content", jose.ECDH_ES_A256KW, jose.A256CBC_HS512, nil},
		{"compressed", jose.ECDH_ES_A256KW, jose.A256GCM, &jose.EncrypterOptions{Compression: jose.DEFLATE}},
		{"critical header", jose.ECDH_ES_A256KW, jose.A256GCM,
			(&jose.EncrypterOptions{}).WithHeader("crit", []string{"exp"}).WithHeader("exp", 1)},
	}
	for _, f := range foreign {
		enc, err := jose.NewEncrypter(f.enc, jose.Recipient{Algorithm: f.alg, Key: &k.PublicKey}, f.opts)
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		obj, err := enc.Encrypt(msg)
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		compact, err := obj.CompactSerialize()
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		refused(f.name, k, compact)
	}

	if _, err := Seal(&mustKey(t, elliptic.P384()).PublicKey, msg); err == nil {
		t.Error("Seal to a P-384 key succeeded")
	}
	if _, err := Seal(&k.PublicKey, make([]byte, MaxJWESize)); err == nil {
		t.Error("Seal produced a JWE over MaxJWESize")
	}
	if _, err := Open(nil, sealed); err == nil {
		t.Error("Open with a nil key succeeded")
	}
}

func mustSign(t testing.TB, k *ecdsa.PrivateKey, purpose string, payload []byte) string {
	t.Helper()
	s, err := Sign(k, purpose, payload)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSignVerify(t *testing.T) {
	k, other := mustKey(t, elliptic.P256()), mustKey(t, elliptic.P256())
	payload := []byte(`{"node_id":"n1","role":"node"}`)
	signed := mustSign(t, k, PurposeJoinResponse, payload)
	got, err := Verify(&k.PublicKey, PurposeJoinResponse, signed)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("Verify = %q, want %q", got, payload)
	}

	b64 := base64.RawURLEncoding.EncodeToString
	parts := strings.Split(signed, ".")
	otherPayload := parts[0] + "." + b64([]byte(`{"node_id":"n2","role":"site"}`)) + "." + parts[2]
	hsJWS := func() string {
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte("0123456789abcdef0123456789abcdef")},
			(&jose.SignerOptions{}).WithHeader(PurposeHeader, PurposeJoinResponse))
		if err != nil {
			t.Fatal(err)
		}
		obj, err := s.Sign(payload)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := obj.CompactSerialize()
		return c
	}()
	es384 := func() string {
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES384, Key: mustKey(t, elliptic.P384())},
			(&jose.SignerOptions{}).WithHeader(PurposeHeader, PurposeJoinResponse))
		if err != nil {
			t.Fatal(err)
		}
		obj, _ := s.Sign(payload)
		c, _ := obj.CompactSerialize()
		return c
	}()
	// Same key and purpose header, but marked critical with b64=false, which
	// would change what the signature covers.
	unencoded := func() string {
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k},
			(&jose.SignerOptions{}).WithHeader(PurposeHeader, PurposeJoinResponse).WithBase64(false))
		if err != nil {
			t.Fatal(err)
		}
		obj, _ := s.Sign(payload)
		c, _ := obj.CompactSerialize()
		return c
	}()
	noPurpose := func() string {
		s, _ := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k}, nil)
		obj, _ := s.Sign(payload)
		c, _ := obj.CompactSerialize()
		return c
	}()

	tests := []struct {
		name    string
		key     *ecdsa.PublicKey
		purpose string
		jws     string
	}{
		{"other key", &other.PublicKey, PurposeJoinResponse, signed},
		{"tampered payload", &k.PublicKey, PurposeJoinResponse, otherPayload},
		{"tampered signature", &k.PublicKey, PurposeJoinResponse, flipByte(t, signed, 2)},
		{"wrong purpose", &k.PublicKey, PurposeReleaseManifest, signed},
		{"purpose prefix", &k.PublicKey, "join", signed},
		{"no purpose header", &k.PublicKey, PurposeJoinResponse, noPurpose},
		{"invalid purpose", &k.PublicKey, "Join Response", signed},
		{"alg none", &k.PublicKey, PurposeJoinResponse,
			b64([]byte(`{"alg":"none","bcd-purpose":"join-response"}`)) + "." + parts[1] + "."},
		{"alg none with signature", &k.PublicKey, PurposeJoinResponse,
			b64([]byte(`{"alg":"none","bcd-purpose":"join-response"}`)) + "." + parts[1] + "." + parts[2]},
		{"HS256", &k.PublicKey, PurposeJoinResponse, hsJWS},
		{"ES384", &k.PublicKey, PurposeJoinResponse, es384},
		{"b64 false", &k.PublicKey, PurposeJoinResponse, unencoded},
		{"JWE instead", &k.PublicKey, PurposeJoinResponse, mustSeal(t, k, payload)},
		{"two parts", &k.PublicKey, PurposeJoinResponse, parts[0] + "." + parts[1]},
		{"too big", &k.PublicKey, PurposeJoinResponse, signed + strings.Repeat("A", MaxJWSSize)},
		{"P-384 verifier", &mustKey(t, elliptic.P384()).PublicKey, PurposeJoinResponse, signed},
		{"nil key", nil, PurposeJoinResponse, signed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, err := Verify(tt.key, tt.purpose, tt.jws); err == nil {
				t.Errorf("Verify accepted it: %q", got)
			}
		})
	}

	if _, err := Sign(k, "", payload); err == nil {
		t.Error("Sign with no purpose succeeded")
	}
	if _, err := Sign(mustKey(t, elliptic.P384()), PurposeJoinResponse, payload); err == nil {
		t.Error("Sign with a P-384 key succeeded")
	}
}

func TestVerifyPinned(t *testing.T) {
	k, attacker := mustKey(t, elliptic.P256()), mustKey(t, elliptic.P256())
	pin, _ := SPKIPin(&k.PublicKey)
	payload := []byte("release")
	signed := mustSign(t, k, PurposeReleaseManifest, payload)

	got, pub, err := VerifyPinned(pin, PurposeReleaseManifest, signed)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) || !pub.Equal(&k.PublicKey) {
		t.Fatalf("VerifyPinned = %q, %v", got, pub)
	}

	// The attacker signs with their own key, which they embed: the pin stops it.
	forged := mustSign(t, attacker, PurposeReleaseManifest, payload)
	if _, _, err := VerifyPinned(pin, PurposeReleaseManifest, forged); !errors.Is(err, ErrPinMismatch) {
		t.Errorf("attacker's JWS: err = %v, want ErrPinMismatch", err)
	}
	if _, _, err := VerifyPinned(pin, PurposeJoinResponse, signed); err == nil {
		t.Error("VerifyPinned accepted the wrong purpose")
	}
	// The pinned key embedded over an attacker's signature still fails.
	parts := strings.Split(signed, ".")
	fparts := strings.Split(forged, ".")
	if _, _, err := VerifyPinned(pin, PurposeReleaseManifest, parts[0]+"."+fparts[1]+"."+fparts[2]); err == nil {
		t.Error("VerifyPinned accepted a signature by another key")
	}
	if _, _, err := VerifyPinned("sha256/x", PurposeReleaseManifest, signed); err == nil {
		t.Error("VerifyPinned accepted a malformed pin")
	}
}

func mustSeal(t testing.TB, k *ecdsa.PrivateKey, msg []byte) string {
	t.Helper()
	s, err := Seal(&k.PublicKey, msg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
