package tpm

import (
	"bytes"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// A record is what it takes to load a key made under an SRK again, as PEM:
//
//	-----BEGIN BCD TPM NODE KEY-----
//	Version: 1
//	Parent: owner/ecc-p256-srk
//
//	<base64 of TPM2B_PUBLIC || TPM2B_PRIVATE>
//	-----END BCD TPM NODE KEY-----
//
// The body is the key's public area (a TPM2B_PUBLIC: a big-endian uint16 size and a
// marshalled TPMT_PUBLIC) followed by its private blob (a TPM2B_PRIVATE: a uint16
// size and the blob the TPM wrapped with the parent's key, useless outside that
// TPM). Parent names the hierarchy and the fixed template of the primary key the
// blob is wrapped under ("owner/ecc-p256-srk": the TCG ECC P-256 SRK template,
// re-derived from the owner seed), so a record of another kind is refused rather than
// loaded under the wrong parent. An attestation key's record has the PEM type
// "BCD TPM ATTESTATION KEY" and the parent "endorsement/ecc-p256-srk".
const (
	// NodeKeyPEMType is the PEM type of a node key's record.
	NodeKeyPEMType = "BCD TPM NODE KEY"
	// AKPEMType is the PEM type of an attestation key's record.
	AKPEMType = "BCD TPM ATTESTATION KEY"

	recordVersion = "1"
	ownerParent   = "owner/ecc-p256-srk"
	endorseParent = "endorsement/ecc-p256-srk"
	maxPrivate    = 4096
)

// IsRecord reports whether pemBytes is a TPM node key record (a PEM block of type
// NodeKeyPEMType) rather than, say, a PKCS#8 key. It does not check the record; use
// LoadNodeKey for that.
func IsRecord(pemBytes []byte) bool {
	b, _ := pem.Decode(pemBytes)
	return b != nil && b.Type == NodeKeyPEMType
}

func encodeRecord(typ, parent string, public, private []byte) []byte {
	var body []byte
	body = binary.BigEndian.AppendUint16(body, uint16(len(public)))
	body = append(body, public...)
	body = binary.BigEndian.AppendUint16(body, uint16(len(private)))
	body = append(body, private...)
	return pem.EncodeToMemory(&pem.Block{
		Type:    typ,
		Headers: map[string]string{"Version": recordVersion, "Parent": parent},
		Bytes:   body,
	})
}

// decodeRecord checks a record's framing and returns its TPMT_PUBLIC (parsed, and
// as marshalled) and private blob.
func decodeRecord(typ, parent string, record []byte) (*tpm2.TPMTPublic, []byte, []byte, error) {
	b, rest := pem.Decode(record)
	if b == nil {
		return nil, nil, nil, errors.New("no PEM block")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, nil, nil, errors.New("data after the PEM block")
	}
	if b.Type != typ {
		return nil, nil, nil, fmt.Errorf("a PEM block of type %q, not %q", b.Type, typ)
	}
	if v := b.Headers["Version"]; v != recordVersion {
		return nil, nil, nil, fmt.Errorf("record version %q, not %q", v, recordVersion)
	}
	if p := b.Headers["Parent"]; p != parent {
		return nil, nil, nil, fmt.Errorf("parent %q, not %q", p, parent)
	}
	if len(b.Headers) != 2 {
		return nil, nil, nil, errors.New("unknown PEM headers")
	}
	body := b.Bytes
	next := func(what string) ([]byte, error) {
		if len(body) < 2 {
			return nil, fmt.Errorf("the record ends before its %s", what)
		}
		n := int(binary.BigEndian.Uint16(body))
		if len(body) < 2+n {
			return nil, fmt.Errorf("the record's %s is cut short", what)
		}
		v := body[2 : 2+n]
		body = body[2+n:]
		return v, nil
	}
	public, err := next("public area")
	if err != nil {
		return nil, nil, nil, err
	}
	private, err := next("private blob")
	if err != nil {
		return nil, nil, nil, err
	}
	if len(body) != 0 {
		return nil, nil, nil, errors.New("data after the private blob")
	}
	if len(private) == 0 || len(private) > maxPrivate {
		return nil, nil, nil, fmt.Errorf("a private blob of %d bytes", len(private))
	}
	pub, err := parsePublic(public)
	if err != nil {
		return nil, nil, nil, err
	}
	return pub, public, private, nil
}

// parsePublic parses a marshalled TPMT_PUBLIC exactly.
func parsePublic(b []byte) (pub *tpm2.TPMTPublic, err error) {
	defer func() {
		if r := recover(); r != nil {
			pub, err = nil, fmt.Errorf("the public area does not parse: %v", r)
		}
	}()
	pub, err = tpm2.Unmarshal[tpm2.TPMTPublic](b)
	if err != nil {
		return nil, fmt.Errorf("the public area does not parse: %w", err)
	}
	if !bytes.Equal(tpm2.Marshal(*pub), b) {
		return nil, errors.New("the public area has trailing bytes")
	}
	return pub, nil
}
