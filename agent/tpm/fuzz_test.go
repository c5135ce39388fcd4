package tpm

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/better-compute/bcd/pki/tpmattest"
	"github.com/google/go-tpm/tpm2"
)

// softRecord is a node key record for a software key, with a random "private blob":
// the framing of a real record, which no TPM loads.
func softRecord(t testing.TB) []byte {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	priv := make([]byte, 126)
	rand.Read(priv)
	return encodeRecord(NodeKeyPEMType, ownerParent, tpm2.Marshal(tpmattest.NodeKeyTemplate(&k.PublicKey)), priv)
}

// parseNodeKeyRecord is LoadNodeKey without its TPM2_Load.
func parseNodeKeyRecord(record []byte) (*Key, error) {
	pub, public, private, err := decodeRecord(NodeKeyPEMType, ownerParent, record)
	if err != nil {
		return nil, err
	}
	return newKey(nil, pub, public, private)
}

func TestRecordRefused(t *testing.T) {
	good := softRecord(t)
	if _, err := parseNodeKeyRecord(good); err != nil {
		t.Fatal(err)
	}
	ak := tpmattest.AKTemplate()
	for _, tc := range []struct {
		name   string
		record []byte
		want   string
	}{
		{"empty", nil, "no PEM block"},
		{"PKCS#8", []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), "not \"BCD TPM NODE KEY\""},
		{"version 2", bytes.Replace(good, []byte("Version: 1"), []byte("Version: 2"), 1), "record version"},
		{"another parent", bytes.Replace(good, []byte("owner/"), []byte("endorsement/"), 1), "parent"},
		{"trailing data", append(bytes.Clone(good), "x"...), "after the PEM block"},
		{"an AK's public area", encodeRecord(NodeKeyPEMType, ownerParent, tpm2.Marshal(ak), []byte{1}), "not a P-256 key"},
		{"no private blob", encodeRecord(NodeKeyPEMType, ownerParent, []byte{0, 1}, nil), "private blob of 0 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseNodeKeyRecord(tc.record)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parsing = %v, want an error with %q", err, tc.want)
			}
		})
	}
	if IsRecord([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")) || !IsRecord(good) {
		t.Error("IsRecord tells PKCS#8 and a record apart wrongly")
	}
}

func FuzzNodeKeyRecord(f *testing.F) {
	f.Add(softRecord(f))
	f.Add([]byte("-----BEGIN BCD TPM NODE KEY-----\nVersion: 1\nParent: owner/ecc-p256-srk\n\nAAEAAgAB\n-----END BCD TPM NODE KEY-----\n"))
	f.Fuzz(func(t *testing.T, record []byte) {
		k, err := parseNodeKeyRecord(record)
		if err != nil {
			return
		}
		// What parses is a node key whose record encodes back to what was read.
		again := encodeRecord(NodeKeyPEMType, ownerParent, k.public, k.private)
		if _, err := parseNodeKeyRecord(again); err != nil {
			t.Fatalf("a parsed record does not parse once encoded again: %v", err)
		}
		if _, err := tpmattest.NodeKeyName(k.pub); err != nil {
			t.Fatal(err)
		}
	})
}
