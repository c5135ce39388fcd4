package tpmattest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"
)

// The real-TPM tests of this package are in agent/tpm (against swtpm); these
// build the TPM's structures in software, to reach refusals no TPM produces.

// softAK is an attestation key made in software with the public area t (whose
// point it sets).
type softAK struct {
	key    *ecdsa.PrivateKey
	public []byte
}

func newSoftAK(tb testing.TB, t tpm2.TPMTPublic) softAK {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	b, _ := k.PublicKey.Bytes()
	t.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
		X: tpm2.TPM2BECCParameter{Buffer: b[1:33]}, Y: tpm2.TPM2BECCParameter{Buffer: b[33:]},
	})
	return softAK{key: k, public: tpm2.Marshal(t)}
}

// certify is what TPM2_Certify of the object named name returns, signed by a.
func (a softAK) certify(tb testing.TB, name, extra []byte, magic tpm2.TPMGenerated, typ tpm2.TPMST) (attest, sig []byte) {
	tb.Helper()
	attested := tpm2.NewTPMUAttest(tpm2.TPMSTAttestCertify, &tpm2.TPMSCertifyInfo{
		Name: tpm2.TPM2BName{Buffer: name},
	})
	if typ == tpm2.TPMSTAttestQuote {
		attested = tpm2.NewTPMUAttest(tpm2.TPMSTAttestQuote, &tpm2.TPMSQuoteInfo{})
	}
	attest = tpm2.Marshal(tpm2.TPMSAttest{
		Magic:     magic,
		Type:      typ,
		ExtraData: tpm2.TPM2BData{Buffer: extra},
		Attested:  attested,
	})
	d := sha256.Sum256(attest)
	r, s, err := ecdsa.Sign(rand.Reader, a.key, d[:])
	if err != nil {
		tb.Fatal(err)
	}
	sig = tpm2.Marshal(tpm2.TPMTSignature{
		SigAlg: tpm2.TPMAlgECDSA,
		Signature: tpm2.NewTPMUSignature(tpm2.TPMAlgECDSA, &tpm2.TPMSSignatureECC{
			Hash:       tpm2.TPMAlgSHA256,
			SignatureR: tpm2.TPM2BECCParameter{Buffer: r.Bytes()},
			SignatureS: tpm2.TPM2BECCParameter{Buffer: s.Bytes()},
		}),
	})
	return attest, sig
}

func TestVerifyCertify(t *testing.T) {
	node, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	nodeName, err := NodeKeyName(&node.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	nonce := []byte("nonce")
	ak := newSoftAK(t, AKTemplate())
	attest, sig := ak.certify(t, nodeName, nonce, tpm2.TPMGeneratedValue, tpm2.TPMSTAttestCertify)
	if err := VerifyCertify(ak.public, attest, sig, &node.PublicKey, nonce); err != nil {
		t.Fatal(err)
	}

	attrs := func(f func(*tpm2.TPMAObject)) tpm2.TPMTPublic {
		t := AKTemplate()
		f(&t.ObjectAttributes)
		return t
	}
	type certifyCase struct {
		name string
		ak   softAK
		typ  tpm2.TPMST
		mag  tpm2.TPMGenerated
		want string
	}
	for _, tc := range []certifyCase{
		{"AK not restricted", newSoftAK(t, NodeKeyTemplate(nil)), 0, 0, "the AK is not restricted"},
		{"AK not fixedTPM", newSoftAK(t, attrs(func(a *tpm2.TPMAObject) { a.FixedTPM = false })), 0, 0, "not fixedTPM"},
		{"AK not fixedParent", newSoftAK(t, attrs(func(a *tpm2.TPMAObject) { a.FixedParent = false })), 0, 0, "not fixedParent"},
		{"AK imported", newSoftAK(t, attrs(func(a *tpm2.TPMAObject) { a.SensitiveDataOrigin = false })), 0, 0, "sensitiveDataOrigin"},
		{"AK decrypts", newSoftAK(t, attrs(func(a *tpm2.TPMAObject) { a.Decrypt = true })), 0, 0, "a decryption key"},
		{"not TPM-generated", ak, 0, 0xdeadbeef, "TPM_GENERATED_VALUE"},
		{"a quote", ak, tpm2.TPMSTAttestQuote, 0, "not TPM_ST_ATTEST_CERTIFY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			typ, mag := tpm2.TPMSTAttestCertify, tpm2.TPMGeneratedValue
			if tc.typ != 0 {
				typ = tc.typ
			}
			if tc.mag != 0 {
				mag = tc.mag
			}
			attest, sig := tc.ak.certify(t, nodeName, nonce, mag, typ)
			err := VerifyCertify(tc.ak.public, attest, sig, &node.PublicKey, nonce)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("VerifyCertify = %v, want an error with %q", err, tc.want)
			}
		})
	}

	// A certified key that could leave its TPM, or that is restricted.
	for _, tc := range []struct {
		name string
		f    func(*tpm2.TPMAObject)
		want string
	}{
		{"certified key not fixedTPM", func(a *tpm2.TPMAObject) { a.FixedTPM = false }, "certified key is not fixedTPM"},
		{"certified key not fixedParent", func(a *tpm2.TPMAObject) { a.FixedParent = false }, "certified key is not fixedParent"},
		{"certified key restricted", func(a *tpm2.TPMAObject) { a.Restricted = true }, "certified key is restricted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pt := NodeKeyTemplate(&node.PublicKey)
			tc.f(&pt.ObjectAttributes)
			public := tpm2.Marshal(pt)
			n, err := tpm2.ObjectName(&pt)
			if err != nil {
				t.Fatal(err)
			}
			attest, sig := ak.certify(t, n.Buffer, nonce, tpm2.TPMGeneratedValue, tpm2.TPMSTAttestCertify)
			err = VerifyCertifyPublic(ak.public, attest, sig, public, &node.PublicKey, nonce)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("VerifyCertifyPublic = %v, want an error with %q", err, tc.want)
			}
			// Under VerifyCertify the Name is simply not the node key's.
			if err := VerifyCertify(ak.public, attest, sig, &node.PublicKey, nonce); err == nil {
				t.Fatal("VerifyCertify accepted it")
			}
		})
	}

	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	if err := VerifyCertify(ak.public, attest, sig, &rsaKey.PublicKey, nonce); err == nil {
		t.Error("VerifyCertify accepted an RSA certified key")
	}
	if err := VerifyCertify(ak.public, append(bytes.Clone(attest), 0), sig, &node.PublicKey, nonce); err == nil {
		t.Error("VerifyCertify accepted trailing bytes")
	}
}

func TestParseAKPublicName(t *testing.T) {
	ak := newSoftAK(t, AKTemplate())
	pub, name, err := ParseAKPublic(ak.public)
	if err != nil {
		t.Fatal(err)
	}
	if !pub.(*ecdsa.PublicKey).Equal(&ak.key.PublicKey) {
		t.Error("ParseAKPublic returned another key")
	}
	d := sha256.Sum256(ak.public)
	if want := append([]byte{0, 0x0b}, d[:]...); !bytes.Equal(name, want) {
		t.Errorf("Name = %x, want %x", name, want)
	}
}

func TestMakeCredentialRefuses(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	small, _ := rsa.GenerateKey(rand.Reader, 1024)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	name := append([]byte{0, 0x0b}, make([]byte, 32)...)
	for _, tc := range []struct {
		name   string
		ek     any
		secret []byte
		ok     bool
	}{
		{"RSA 2048", &rsaKey.PublicKey, []byte("secret"), true},
		{"ECC P-256", &p256.PublicKey, []byte("secret"), true},
		{"RSA 1024", &small.PublicKey, []byte("secret"), false},
		{"ECC P-384", &p384.PublicKey, []byte("secret"), false},
		{"secret too long", &rsaKey.PublicKey, make([]byte, 33), false},
		{"no secret", &rsaKey.PublicKey, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blob, enc, err := MakeCredential(tc.ek, name, tc.secret)
			if tc.ok != (err == nil) {
				t.Fatalf("MakeCredential: %v", err)
			}
			if tc.ok && (len(blob) == 0 || len(enc) == 0) {
				t.Fatal("empty credential")
			}
		})
	}
}

func TestEKSHA256(t *testing.T) {
	k, _ := rsa.GenerateKey(rand.Reader, 2048)
	der, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
	sum := sha256.Sum256(der)
	if got := EKSHA256(der); got != strings.ToLower(string(hexOf(sum[:]))) || len(got) != 64 {
		t.Fatalf("EKSHA256 = %q", got)
	}
}

func hexOf(b []byte) []byte {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return out
}

func FuzzParseAKPublic(f *testing.F) {
	f.Add(newSoftAK(f, AKTemplate()).public)
	f.Add(tpm2.Marshal(tpm2.RSAEKTemplate))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, name, err := ParseAKPublic(b)
		if err == nil && len(name) != 34 {
			t.Fatalf("a Name of %d bytes", len(name))
		}
	})
}

func FuzzVerifyCertify(f *testing.F) {
	node, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	nodeName, _ := NodeKeyName(&node.PublicKey)
	ak := newSoftAK(f, AKTemplate())
	nonce := []byte("nonce")
	attest, sig := ak.certify(f, nodeName, nonce, tpm2.TPMGeneratedValue, tpm2.TPMSTAttestCertify)
	f.Add(ak.public, attest, sig)
	f.Fuzz(func(t *testing.T, akPublic, attest, sig []byte) {
		err := VerifyCertify(akPublic, attest, sig, &node.PublicKey, nonce)
		if err == nil && !bytes.Equal(akPublic, ak.public) {
			t.Fatal("a certification verified under an AK nobody holds the key of")
		}
	})
}
