package tpmattest

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"math/big"

	"github.com/google/go-tpm/tpm2"
)

// unmarshalExact parses b as a T and refuses trailing bytes or an encoding that does
// not marshal back to b, so that what is hashed (a Name, a signed digest) is exactly
// what was parsed.
func unmarshalExact[T tpm2.Marshallable, P interface {
	*T
	tpm2.Unmarshallable
}](what string, b []byte) (v *T, err error) {
	defer func() {
		// go-tpm's reflection unmarshaller is not written for hostile input; a
		// panic there is a malformed structure here.
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("%s does not parse: %v", what, r)
		}
	}()
	v, err = tpm2.Unmarshal[T, P](b)
	if err != nil {
		return nil, fmt.Errorf("%s does not parse: %w", what, err)
	}
	if !bytes.Equal(tpm2.Marshal(*v), b) {
		return nil, fmt.Errorf("%s has trailing bytes or a non-canonical encoding", what)
	}
	return v, nil
}

// publicKey returns the key of a TPMT_PUBLIC and the hash its signing scheme uses:
// an ECDSA key on P-256 or P-384 (the point checked to be on the curve), or an RSA
// key of at least 2048 bits with RSASSA or RSAPSS.
func publicKey(pub *tpm2.TPMTPublic) (crypto.PublicKey, tpm2.TPMAlgID, tpm2.TPMIAlgHash, error) {
	switch pub.Type {
	case tpm2.TPMAlgECC:
		parms, err := pub.Parameters.ECCDetail()
		if err != nil {
			return nil, 0, 0, fmt.Errorf("ECC parameters: %w", err)
		}
		var curve elliptic.Curve
		switch parms.CurveID {
		case tpm2.TPMECCNistP256:
			curve = elliptic.P256()
		case tpm2.TPMECCNistP384:
			curve = elliptic.P384()
		default:
			return nil, 0, 0, fmt.Errorf("curve %#x is not P-256 or P-384", uint16(parms.CurveID))
		}
		if parms.Scheme.Scheme != tpm2.TPMAlgECDSA {
			return nil, 0, 0, fmt.Errorf("signing scheme %#x is not ECDSA", uint16(parms.Scheme.Scheme))
		}
		scheme, err := parms.Scheme.Details.ECDSA()
		if err != nil {
			return nil, 0, 0, fmt.Errorf("ECDSA scheme: %w", err)
		}
		point, err := pub.Unique.ECC()
		if err != nil {
			return nil, 0, 0, fmt.Errorf("ECC point: %w", err)
		}
		size := (curve.Params().BitSize + 7) / 8
		if len(point.X.Buffer) > size || len(point.Y.Buffer) > size {
			return nil, 0, 0, errors.New("ECC point coordinates are longer than the curve")
		}
		raw := make([]byte, 1+2*size)
		raw[0] = 4
		copy(raw[1+size-len(point.X.Buffer):1+size], point.X.Buffer)
		copy(raw[1+2*size-len(point.Y.Buffer):], point.Y.Buffer)
		k, err := ecdsa.ParseUncompressedPublicKey(curve, raw)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("ECC point: %w", err)
		}
		return k, tpm2.TPMAlgECDSA, scheme.HashAlg, nil
	case tpm2.TPMAlgRSA:
		parms, err := pub.Parameters.RSADetail()
		if err != nil {
			return nil, 0, 0, fmt.Errorf("RSA parameters: %w", err)
		}
		var hash tpm2.TPMIAlgHash
		switch parms.Scheme.Scheme {
		case tpm2.TPMAlgRSASSA:
			s, err := parms.Scheme.Details.RSASSA()
			if err != nil {
				return nil, 0, 0, fmt.Errorf("RSASSA scheme: %w", err)
			}
			hash = s.HashAlg
		case tpm2.TPMAlgRSAPSS:
			s, err := parms.Scheme.Details.RSAPSS()
			if err != nil {
				return nil, 0, 0, fmt.Errorf("RSAPSS scheme: %w", err)
			}
			hash = s.HashAlg
		default:
			return nil, 0, 0, fmt.Errorf("signing scheme %#x is not RSASSA or RSAPSS", uint16(parms.Scheme.Scheme))
		}
		n, err := pub.Unique.RSA()
		if err != nil {
			return nil, 0, 0, fmt.Errorf("RSA modulus: %w", err)
		}
		k := &rsa.PublicKey{N: new(big.Int).SetBytes(n.Buffer), E: int(parms.Exponent)}
		if k.E == 0 {
			k.E = 65537
		}
		if k.N.BitLen() < 2048 || k.N.BitLen() != int(parms.KeyBits) {
			return nil, 0, 0, fmt.Errorf("RSA modulus of %d bits (keyBits %d) is not a key of at least 2048 bits", k.N.BitLen(), parms.KeyBits)
		}
		return k, parms.Scheme.Scheme, hash, nil
	default:
		return nil, 0, 0, fmt.Errorf("key type %#x is not ECC or RSA", uint16(pub.Type))
	}
}

// checkHash refuses hashes weaker than SHA-256.
func checkHash(what string, h tpm2.TPMIAlgHash) (crypto.Hash, error) {
	switch h {
	case tpm2.TPMAlgSHA256, tpm2.TPMAlgSHA384, tpm2.TPMAlgSHA512:
		return h.Hash()
	}
	return 0, fmt.Errorf("%s %#x is not SHA-256, SHA-384 or SHA-512", what, uint16(h))
}

// name returns the TPM Name of the marshalled TPMT_PUBLIC b: its nameAlg followed
// by the digest of b under that algorithm.
func name(pub *tpm2.TPMTPublic, b []byte) ([]byte, error) {
	h, err := checkHash("nameAlg", pub.NameAlg)
	if err != nil {
		return nil, err
	}
	d := h.New()
	d.Write(b)
	return d.Sum([]byte{byte(pub.NameAlg >> 8), byte(pub.NameAlg)}), nil
}

// ParseAKPublic parses the marshalled TPMT_PUBLIC of an attestation key and returns
// its public key and Name. It refuses a key that is not a restricted signing key
// made in its TPM and fixed to it (restricted, sign, not decrypt, fixedTPM,
// fixedParent, sensitiveDataOrigin), saying which property is missing.
func ParseAKPublic(tpmtPublic []byte) (crypto.PublicKey, []byte, error) {
	pub, err := unmarshalExact[tpm2.TPMTPublic]("tpmattest: the AK's TPMT_PUBLIC", tpmtPublic)
	if err != nil {
		return nil, nil, err
	}
	a := pub.ObjectAttributes
	for _, c := range []struct {
		ok   bool
		what string
	}{
		{a.Restricted, "not restricted"},
		{a.SignEncrypt, "not a signing key"},
		{!a.Decrypt, "a decryption key"},
		{a.FixedTPM, "not fixedTPM"},
		{a.FixedParent, "not fixedParent"},
		{a.SensitiveDataOrigin, "not sensitiveDataOrigin (made outside the TPM)"},
	} {
		if !c.ok {
			return nil, nil, fmt.Errorf("tpmattest: the AK is %s", c.what)
		}
	}
	k, _, hash, err := publicKey(pub)
	if err != nil {
		return nil, nil, fmt.Errorf("tpmattest: the AK: %w", err)
	}
	if _, err := checkHash("the AK's scheme hash", hash); err != nil {
		return nil, nil, fmt.Errorf("tpmattest: %w", err)
	}
	n, err := name(pub, tpmtPublic)
	if err != nil {
		return nil, nil, fmt.Errorf("tpmattest: the AK's %w", err)
	}
	return k, n, nil
}
