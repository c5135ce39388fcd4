package pki

import (
	"bytes"
	"crypto/elliptic"
	"testing"
)

// The fuzz targets cover the parsers that read what an untrusted peer sends:
// JWKs from files and web documents, sealed tokens relayed by the gateway,
// signed responses, pins and SPIFFE IDs. Beyond not panicking, each checks
// that what it accepts is well formed.

func FuzzParsePublicJWK(f *testing.F) {
	k := mustKey(f, elliptic.P256())
	good, err := PublicJWK(&k.PublicKey)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"kty":"EC","crv":"P-256","x":"","y":""}`))
	f.Add([]byte(`{"kty":"EC","crv":"P-256","d":"x"}`))
	f.Add([]byte(`{"kty":"RSA","n":"AQAB","e":"AQAB"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		pub, err := ParsePublicJWK(data)
		if err != nil {
			return
		}
		if _, err := asP256(pub); err != nil {
			t.Fatalf("accepted a non-P-256 key: %v", err)
		}
		// Whatever is accepted re-encodes to the same key.
		again, err := PublicJWK(pub)
		if err != nil {
			t.Fatal(err)
		}
		if k2, err := ParsePublicJWK(again); err != nil || !k2.Equal(pub) {
			t.Fatalf("re-encoding changed the key: %v", err)
		}
	})
}

func FuzzOpen(f *testing.F) {
	k := mustKey(f, elliptic.P256())
	sealed, err := Seal(&k.PublicKey, []byte("bcjt_seed"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sealed)
	f.Add("....")
	f.Add("eyJhbGciOiJFQ0RILUVTK0EyNTZLVyIsImVuYyI6IkEyNTZHQ00ifQ....")
	f.Add(mustSign(f, k, PurposeJoinResponse, []byte("x")))
	f.Fuzz(func(t *testing.T, compact string) {
		if _, err := Open(k, compact); err != nil {
			return
		}
		// Whatever opens is within bounds and uses exactly Seal's algorithms.
		if len(compact) > MaxJWESize {
			t.Fatalf("opened a %d-byte JWE", len(compact))
		}
		hdr, err := protectedHeader(compact, 5)
		if err != nil {
			t.Fatal(err)
		}
		if hdr.want("alg", string(JWEKeyAlgorithm)) != nil || hdr.want("enc", string(JWEContentEncryption)) != nil {
			t.Fatalf("opened a JWE with header %v", hdr)
		}
	})
}

func FuzzVerify(f *testing.F) {
	k := mustKey(f, elliptic.P256())
	pin, err := SPKIPin(&k.PublicKey)
	if err != nil {
		f.Fatal(err)
	}
	signed := mustSign(f, k, PurposeJoinResponse, []byte(`{"node_id":"n1"}`))
	f.Add(signed, PurposeJoinResponse)
	f.Add(signed, PurposeReleaseManifest)
	f.Add("eyJhbGciOiJub25lIn0.e30.", PurposeJoinResponse)
	f.Add("..", "")
	f.Fuzz(func(t *testing.T, compact, purpose string) {
		p1, err1 := Verify(&k.PublicKey, purpose, compact)
		p2, _, err2 := VerifyPinned(pin, purpose, compact)
		if err1 == nil && purpose != PurposeJoinResponse {
			t.Fatalf("a join-response signature passed as %q", purpose)
		}
		// VerifyPinned accepts no more than Verify under the pinned key.
		if err2 == nil && (err1 != nil || !bytes.Equal(p1, p2)) {
			t.Fatalf("VerifyPinned accepted what Verify refused: %v", err1)
		}
	})
}

func FuzzParsePin(f *testing.F) {
	f.Add("sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=")
	f.Add("sha256/")
	f.Add("sha256/47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU")
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParsePin(s)
		if err != nil {
			return
		}
		if got := pinOfDigest(b); got != s {
			t.Fatalf("accepted %q, which is not canonical (%q)", s, got)
		}
	})
}

func FuzzParseSPIFFEID(f *testing.F) {
	f.Add("spiffe://better-compute.local/node/n1")
	f.Add("spiffe://a/site/b/c")
	f.Add("spiffe://a:1/ramdisk/x")
	f.Fuzz(func(t *testing.T, s string) {
		td, role, id, err := ParseSPIFFEID(s)
		if err != nil {
			return
		}
		if SPIFFEID(td, role, id) != s {
			t.Fatalf("accepted %q, which SPIFFEID spells differently", s)
		}
	})
}
