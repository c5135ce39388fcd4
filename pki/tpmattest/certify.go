package tpmattest

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"errors"
	"fmt"
	"math/big"

	"github.com/google/go-tpm/tpm2"
)

// VerifyCertify checks a TPM2_Certify of a node key by an attestation key: that
// signature (a marshalled TPMT_SIGNATURE) verifies over attest (a marshalled
// TPMS_ATTEST) under the AK whose TPMT_PUBLIC is akPublic (which ParseAKPublic
// accepts); that attest is a TPM_ST_ATTEST_CERTIFY with magic TPM_GENERATED_VALUE and
// extraData equal to qualifyingData; and that the certified Name is that of a bcd
// node key (NodeKeyTemplate) whose public key is certified, the CSR's key. The
// template makes it a non-restricted signing key with fixedTPM and fixedParent, so a
// certified key cannot leave its TPM. Each refusal says what did not hold.
func VerifyCertify(akPublic, attest, signature []byte, certified crypto.PublicKey, qualifyingData []byte) error {
	pub, ok := certified.(*ecdsa.PublicKey)
	if !ok {
		return fmt.Errorf("tpmattest: the certified key is a %T, not a P-256 ECDSA key", certified)
	}
	t := NodeKeyTemplate(pub)
	return VerifyCertifyPublic(akPublic, attest, signature, tpm2.Marshal(t), certified, qualifyingData)
}

// VerifyCertifyPublic is VerifyCertify for a certified key whose TPMT_PUBLIC,
// certifiedPublic, the caller has: the certified Name must be that of
// certifiedPublic, whose key must equal certified and which must be a signing key
// that is not restricted, decrypts nothing, and is fixedTPM, fixedParent and
// sensitiveDataOrigin.
func VerifyCertifyPublic(akPublic, attest, signature, certifiedPublic []byte, certified crypto.PublicKey, qualifyingData []byte) error {
	akKey, _, err := ParseAKPublic(akPublic)
	if err != nil {
		return err
	}
	if err := verifySignature(akKey, attest, signature); err != nil {
		return err
	}
	// The signature is the AK's; now what it signed.
	a, err := unmarshalExact[tpm2.TPMSAttest]("tpmattest: the certification's TPMS_ATTEST", attest)
	if err != nil {
		return err
	}
	if a.Magic != tpm2.TPMGeneratedValue {
		return fmt.Errorf("tpmattest: the certification's magic %#x is not TPM_GENERATED_VALUE", uint32(a.Magic))
	}
	if a.Type != tpm2.TPMSTAttestCertify {
		return fmt.Errorf("tpmattest: the attestation is of type %#x, not TPM_ST_ATTEST_CERTIFY", uint16(a.Type))
	}
	if !bytes.Equal(a.ExtraData.Buffer, qualifyingData) {
		return errors.New("tpmattest: the certification's extraData is not the qualifying data the verifier gave (a replayed or foreign certification)")
	}
	info, err := a.Attested.Certify()
	if err != nil {
		return fmt.Errorf("tpmattest: the certification's TPMS_CERTIFY_INFO: %w", err)
	}

	cp, err := unmarshalExact[tpm2.TPMTPublic]("tpmattest: the certified key's TPMT_PUBLIC", certifiedPublic)
	if err != nil {
		return err
	}
	n, err := name(cp, certifiedPublic)
	if err != nil {
		return fmt.Errorf("tpmattest: the certified key's %w", err)
	}
	if !bytes.Equal(info.Name.Buffer, n) {
		return errors.New("tpmattest: the certification names another key than the CSR's (the certified Name is not the Name of the node key with the CSR's public key)")
	}
	at := cp.ObjectAttributes
	for _, c := range []struct {
		ok   bool
		what string
	}{
		{!at.Restricted, "restricted"},
		{at.SignEncrypt, "not a signing key"},
		{!at.Decrypt, "a decryption key"},
		{at.FixedTPM, "not fixedTPM"},
		{at.FixedParent, "not fixedParent"},
		{at.SensitiveDataOrigin, "not sensitiveDataOrigin (made outside the TPM)"},
	} {
		if !c.ok {
			return fmt.Errorf("tpmattest: the certified key is %s", c.what)
		}
	}
	k, _, _, err := publicKey(cp)
	if err != nil {
		return fmt.Errorf("tpmattest: the certified key: %w", err)
	}
	eq, ok := k.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !eq.Equal(certified) {
		return errors.New("tpmattest: the certified key is not the CSR's public key")
	}
	return nil
}

// verifySignature checks that signature, a marshalled TPMT_SIGNATURE, is ak's over
// the digest of msg.
func verifySignature(ak crypto.PublicKey, msg, signature []byte) error {
	sig, err := unmarshalExact[tpm2.TPMTSignature]("tpmattest: the certification's TPMT_SIGNATURE", signature)
	if err != nil {
		return err
	}
	switch k := ak.(type) {
	case *ecdsa.PublicKey:
		if sig.SigAlg != tpm2.TPMAlgECDSA {
			return fmt.Errorf("tpmattest: the certification's signature algorithm %#x is not ECDSA, the AK's", uint16(sig.SigAlg))
		}
		s, err := sig.Signature.ECDSA()
		if err != nil {
			return fmt.Errorf("tpmattest: the certification's ECDSA signature: %w", err)
		}
		h, err := checkHash("the certification's signature hash", s.Hash)
		if err != nil {
			return fmt.Errorf("tpmattest: %w", err)
		}
		d := h.New()
		d.Write(msg)
		r, ss := new(big.Int).SetBytes(s.SignatureR.Buffer), new(big.Int).SetBytes(s.SignatureS.Buffer)
		if !ecdsa.Verify(k, d.Sum(nil), r, ss) {
			return errors.New("tpmattest: the certification's signature does not verify under the AK")
		}
		return nil
	case *rsa.PublicKey:
		var (
			hashAlg tpm2.TPMIAlgHash
			raw     []byte
			pss     bool
		)
		switch sig.SigAlg {
		case tpm2.TPMAlgRSASSA:
			s, err := sig.Signature.RSASSA()
			if err != nil {
				return fmt.Errorf("tpmattest: the certification's RSASSA signature: %w", err)
			}
			hashAlg, raw = s.Hash, s.Sig.Buffer
		case tpm2.TPMAlgRSAPSS:
			s, err := sig.Signature.RSAPSS()
			if err != nil {
				return fmt.Errorf("tpmattest: the certification's RSAPSS signature: %w", err)
			}
			hashAlg, raw, pss = s.Hash, s.Sig.Buffer, true
		default:
			return fmt.Errorf("tpmattest: the certification's signature algorithm %#x is not RSASSA or RSAPSS", uint16(sig.SigAlg))
		}
		h, err := checkHash("the certification's signature hash", hashAlg)
		if err != nil {
			return fmt.Errorf("tpmattest: %w", err)
		}
		d := h.New()
		d.Write(msg)
		if pss {
			err = rsa.VerifyPSS(k, h, d.Sum(nil), raw, nil)
		} else {
			err = rsa.VerifyPKCS1v15(k, h, d.Sum(nil), raw)
		}
		if err != nil {
			return errors.New("tpmattest: the certification's signature does not verify under the AK")
		}
		return nil
	}
	return fmt.Errorf("tpmattest: an AK of type %T", ak)
}
