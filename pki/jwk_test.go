package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
)

func mustKey(t testing.TB, c elliptic.Curve) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestPublicJWKRoundTrip(t *testing.T) {
	for range 20 { // covers coordinates with leading zero bytes now and then
		k := mustKey(t, elliptic.P256())
		data, err := PublicJWK(&k.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParsePublicJWK(data)
		if err != nil {
			t.Fatalf("ParsePublicJWK(%s): %v", data, err)
		}
		if !got.Equal(&k.PublicKey) {
			t.Fatalf("round trip changed the key: %s", data)
		}
		// go-jose, an independent reader, agrees on the key.
		var jk jose.JSONWebKey
		if err := jk.UnmarshalJSON(data); err != nil {
			t.Fatal(err)
		}
		if !k.PublicKey.Equal(jk.Key) {
			t.Fatal("go-jose reads another key from the JWK")
		}
		pin, _ := SPKIPin(&k.PublicKey)
		if jk.KeyID != pin {
			t.Errorf("kid = %q, want the pin %q", jk.KeyID, pin)
		}
	}
	if _, err := PublicJWK(&mustKey(t, elliptic.P384()).PublicKey); err == nil {
		t.Error("PublicJWK accepted a P-384 key")
	}
	if _, err := PublicJWK(nil); err == nil {
		t.Error("PublicJWK accepted nil")
	}
}

func TestParsePublicJWKRefuses(t *testing.T) {
	k := mustKey(t, elliptic.P256())
	good, err := PublicJWK(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	// with returns the good JWK with member set to v (or deleted for nil).
	with := func(member string, v any) string {
		var m map[string]any
		if err := json.Unmarshal(good, &m); err != nil {
			t.Fatal(err)
		}
		if v == nil {
			delete(m, member)
		} else {
			m[member] = v
		}
		out, _ := json.Marshal(m)
		return string(out)
	}
	privJWK, err := jose.JSONWebKey{Key: k}.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	p384JWK, err := jose.JSONWebKey{Key: &mustKey(t, elliptic.P384()).PublicKey}.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var raw struct{ X, Y string }
	json.Unmarshal(good, &raw)
	x, _ := base64.RawURLEncoding.DecodeString(raw.X)
	x[len(x)-1] ^= 1 // almost surely off the curve
	offCurve := base64.RawURLEncoding.EncodeToString(x)

	tests := []struct {
		name string
		jwk  string
	}{
		{"private key (go-jose)", string(privJWK)},
		{"private member", with("d", "AAAA")},
		{"null private member", with("d", json.RawMessage("null"))},
		{"P-384", string(p384JWK)},
		{"kty RSA", with("kty", "RSA")},
		{"kty oct", with("kty", "oct")},
		{"crv missing", with("crv", nil)},
		{"x missing", with("x", nil)},
		{"y not a string", with("y", 5)},
		{"x padded", with("x", raw.X+"=")},
		{"x std alphabet", with("x", base64.StdEncoding.EncodeToString(x))},
		{"x short", with("x", raw.X[:40])},
		{"x with leading zero byte", with("x", base64.RawURLEncoding.EncodeToString(append([]byte{0}, x...)))},
		{"off curve", with("x", offCurve)},
		{"array", `[` + string(good) + `]`},
		{"null", `null`},
		{"empty", ``},
		{"too big", with("pad", strings.Repeat("a", MaxJWKSize))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ParsePublicJWK([]byte(tt.jwk)); err == nil {
				t.Errorf("ParsePublicJWK accepted %s", tt.jwk)
			} else if strings.Contains(err.Error(), "AAAA") {
				t.Errorf("error %q quotes the private part", err)
			}
		})
	}
	// Unknown members are ignored, as RFC 7517 asks.
	if _, err := ParsePublicJWK([]byte(with("use", "enc"))); err != nil {
		t.Errorf("extra member: %v", err)
	}
}

func TestJWKMatchesPin(t *testing.T) {
	k, other := mustKey(t, elliptic.P256()), mustKey(t, elliptic.P256())
	jwk, _ := PublicJWK(&k.PublicKey)
	pin, _ := SPKIPin(&k.PublicKey)
	otherPin, _ := SPKIPin(&other.PublicKey)

	got, err := JWKMatchesPin(jwk, pin)
	if err != nil || !got.Equal(&k.PublicKey) {
		t.Fatalf("JWKMatchesPin(own pin) = %v, %v", got, err)
	}
	if _, err := JWKMatchesPin(jwk, otherPin); !errors.Is(err, ErrPinMismatch) {
		t.Errorf("other pin: err = %v, want ErrPinMismatch", err)
	}
	// A forged kid claiming the right pin changes nothing.
	forged := strings.Replace(string(jwk), pin, otherPin, 1)
	if _, err := JWKMatchesPin([]byte(forged), otherPin); !errors.Is(err, ErrPinMismatch) {
		t.Errorf("forged kid: err = %v, want ErrPinMismatch", err)
	}
	if _, err := JWKMatchesPin(jwk, "sha256/bad"); err == nil || errors.Is(err, ErrPinMismatch) {
		t.Errorf("malformed pin: err = %v", err)
	}
}
