package tpm

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"strings"
	"testing"

	"github.com/better-compute/bcd/pki/tpmattest"
)

func TestEK(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ekCert bool
	}{
		{"no EK certificate", false},
		{"EK certificate from swtpm_setup", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := startSwtpm(t, tc.ekCert).open()
			ek, err := tp.EK()
			if err != nil {
				t.Fatal(err)
			}
			if k, ok := ek.Public.(*rsa.PublicKey); !ok || k.N.BitLen() != 2048 {
				t.Fatalf("EK is a %T, want RSA 2048", ek.Public)
			}
			if h := tpmattest.EKSHA256(ek.PKIX); len(h) != 64 || strings.ToLower(h) != h {
				t.Errorf("EKSHA256 = %q", h)
			}
			if !tc.ekCert {
				if ek.Certificate != nil {
					t.Fatalf("an EK certificate on a TPM without one: %x", ek.Certificate)
				}
				return
			}
			if ek.Certificate == nil {
				t.Fatal("no EK certificate")
			}
			if _, err := tpmattest.CheckEKCertificate(ek.Certificate, ek.PKIX); err != nil {
				t.Fatal(err)
			}
			// The same again: the EK is derived, not random.
			again, err := tp.EK()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again.PKIX, ek.PKIX) {
				t.Fatal("the EK changed")
			}
			other, err := startSwtpm(t, false).open().EK()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tpmattest.CheckEKCertificate(ek.Certificate, other.PKIX); err == nil {
				t.Fatal("an EK certificate matches another TPM's EK")
			}
		})
	}
}

func TestCertify(t *testing.T) {
	sw := startSwtpm(t, false)
	tp := sw.open()
	key, _, err := tp.CreateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := tp.CreateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	ak, err := tp.CreateAK()
	if err != nil {
		t.Fatal(err)
	}
	nonce := []byte("the control plane's nonce")
	attest, sig, err := tp.Certify(key, ak, nonce)
	if err != nil {
		t.Fatal(err)
	}
	if err := tpmattest.VerifyCertify(ak.TPMTPublic(), attest, sig, key.Public(), nonce); err != nil {
		t.Fatalf("VerifyCertify: %v", err)
	}
	if err := tpmattest.VerifyCertifyPublic(ak.TPMTPublic(), attest, sig, key.TPMTPublic(), key.Public(), nonce); err != nil {
		t.Fatalf("VerifyCertifyPublic: %v", err)
	}
	flip := func(b []byte, i int) []byte {
		b = bytes.Clone(b)
		b[i] ^= 1
		return b
	}
	for _, tc := range []struct {
		name            string
		ak, attest, sig []byte
		certified       *Key
		nonce           []byte
		want            string
	}{
		{"tampered attest", ak.TPMTPublic(), flip(attest, len(attest)-1), sig, key, nonce, "does not verify under the AK"},
		{"tampered signature", ak.TPMTPublic(), attest, flip(sig, len(sig)-1), key, nonce, "does not verify under the AK"},
		{"another key", ak.TPMTPublic(), attest, sig, other, nonce, "names another key"},
		{"wrong qualifying data", ak.TPMTPublic(), attest, sig, key, []byte("another nonce"), "extraData"},
		{"no qualifying data", ak.TPMTPublic(), attest, sig, key, nil, "extraData"},
		{"AK not restricted", key.TPMTPublic(), attest, sig, key, nonce, "the AK is not restricted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tpmattest.VerifyCertify(tc.ak, tc.attest, tc.sig, tc.certified.Public(), tc.nonce)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("VerifyCertify = %v, want an error with %q", err, tc.want)
			}
		})
	}

	// The AK comes back from its record after the TPM restarts, and certifies
	// again (the two-round join keeps it between the rounds).
	record := ak.Record()
	keyRecord := key.Record()
	tp.Close()
	sw.restart()
	tp = sw.open()
	ak2, err := tp.LoadAK(record)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ak2.Name(), ak.Name()) {
		t.Fatal("the reloaded AK has another Name")
	}
	key2, err := tp.LoadNodeKey(keyRecord)
	if err != nil {
		t.Fatal(err)
	}
	attest, sig, err = tp.Certify(key2, ak2, nonce)
	if err != nil {
		t.Fatal(err)
	}
	if err := tpmattest.VerifyCertify(ak2.TPMTPublic(), attest, sig, key2.Public(), nonce); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	if _, err := tp.LoadAK(keyRecord); err == nil {
		t.Fatal("LoadAK took a node key record")
	}
	if _, err := tp.LoadNodeKey(record); err == nil {
		t.Fatal("LoadNodeKey took an AK record")
	}
}

func TestActivateCredential(t *testing.T) {
	tp := startSwtpm(t, false).open()
	ek, err := tp.EK()
	if err != nil {
		t.Fatal(err)
	}
	ak, err := tp.CreateAK()
	if err != nil {
		t.Fatal(err)
	}
	otherAK, err := tp.CreateAK()
	if err != nil {
		t.Fatal(err)
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	blob, enc, err := tpmattest.MakeCredential(ek.Public, ak.Name(), secret)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tp.ActivateCredential(ak, blob, enc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, secret) {
		t.Fatalf("ActivateCredential = %x, want %x", got, secret)
	}

	// Bound to another AK's Name: this AK cannot answer.
	if _, err := tp.ActivateCredential(otherAK, blob, enc); err == nil {
		t.Fatal("a credential for one AK activated with another")
	}
	// Made for another TPM's EK: this TPM cannot answer.
	otherEK, err := startSwtpm(t, false).open().EK()
	if err != nil {
		t.Fatal(err)
	}
	blob, enc, err = tpmattest.MakeCredential(otherEK.Public, ak.Name(), secret)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tp.ActivateCredential(ak, blob, enc); err == nil || !strings.Contains(err.Error(), "TPM2_ActivateCredential") {
		t.Fatalf("a credential for another TPM's EK: %v, want a TPM2_ActivateCredential error", err)
	}
}
