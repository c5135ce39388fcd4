package join

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/pki/tpmattest"
	"github.com/better-compute/bcd/protocol"
)

// TPMRetryAfter is how long a tpm join that waits for an operator's
// approval waits between tries.
const TPMRetryAfter = 5 * time.Second

// Node key policies of the tpm attestor (TPMOptions.NodeKey).
const (
	// NodeKeyCertified requires the TPM's certification of the node key
	// (TPM2_Certify by the AK of the CSR's key): the default.
	NodeKeyCertified = "certified"
	// NodeKeyAny accepts a join without a certification (the AK still
	// proves the EK's TPM); one that is sent must verify.
	NodeKeyAny = "any"
)

// TPMStore is what the tpm attestor reads, and the machine timeline it
// writes a deferral on.
type TPMStore interface {
	GetTPMEnrollment(ctx context.Context, ekSHA256 string) (store.TPMEnrollment, error)
	FindMachineByMAC(ctx context.Context, mac string) (store.Machine, error)
	AddMachineEvent(ctx context.Context, e store.MachineEvent) error
	MachineEvents(ctx context.Context, machineID string, limit int) ([]store.MachineEvent, error)
}

// TPMOptions configure the tpm attestor.
type TPMOptions struct {
	// Bundle's join encryption key seals the challenges (their ID) and
	// opens them in the second round.
	Bundle *pki.Bundle
	// NodeKey is NodeKeyCertified ("" means it) or NodeKeyAny.
	NodeKey string
}

// tpmChallengeID is what a TPMChallenge.ID seals: everything round two
// checks, so that nothing is stored between the rounds.
type tpmChallengeID struct {
	Purpose      string `json:"purpose"`
	Secret       []byte `json:"secret"`
	CSRSHA256    string `json:"csr_sha256"`
	AKNameSHA256 string `json:"ak_name_sha256"`
	EKSHA256     string `json:"ek_sha256"`
	Exp          int64  `json:"exp"`
}

// tpmEvidence is a request's TPMAttestation, decoded and checked.
type tpmEvidence struct {
	ekDER  []byte
	ek     any
	ekHash string
	akPub  []byte
	akName []byte
}

// NewTPMAttestor is the tpm attestor (protocol.AttestorTPM): a node proves
// its TPM in two rounds (see protocol.TPMAttestation). In both, the
// evidence must decode (INVALID_INPUT naming the field), the claims' tpm_ek
// must be the EK sent, the AK must be a restricted signing key of a TPM, and
// its certification of the node key must verify with the SHA-256 of the
// CSR as qualifying data and the CSR's key as the certified key
// (ATTESTOR_REFUSED with the reason); then the EK's policy decides:
//
//   - an enrolled EK (machines enroll-tpm, tpm enroll) joins the
//     enrollment's site and pool (the default pool when it names none),
//     bound to its machine when it names one;
//   - else a registered machine of the join's site whose MAC the claims
//     list joins once the operator approved it (machines approve), and its
//     EK becomes the machine's; until then the join is deferred
//     (TPMRetryAfter) and a join.deferred entry goes on the machine's
//     timeline once;
//   - else ATTESTOR_REFUSED: the EK is not enrolled.
//
// Round one answers a TPMChallenge: a secret sealed to the EK for the AK's
// Name (MakeCredential), its ID the secret and what it is bound to sealed
// to the join encryption key. Round two opens the ID, checks that it is
// for this CSR, AK and EK and not expired, compares the secret in constant
// time, checks everything again, and admits role node (other roles:
// WRONG_ROLE) with reclaim allowed, since the EK is proven: the node of
// this EK, after a bcd join --reset, gets its id back.
func NewTPMAttestor(st TPMStore, opts TPMOptions) Attestor {
	return AttestorFunc(func(ctx context.Context, r *Request) (Verdict, error) {
		req := r.Join
		switch {
		case req.Role != protocol.RoleNode:
			return Verdict{}, refuse(protocol.CodeWrongRole, "the %s attestor admits role %s only, not %s", protocol.AttestorTPM, protocol.RoleNode, human.Short(req.Role))
		case req.NodeID != "":
			return Verdict{}, refuse(protocol.CodeInvalidInput, "node_id is for the %s attestor; the %s attestor finds the node by its endorsement key", protocol.AttestorProvisioned, protocol.AttestorTPM)
		case req.SealedToken != "":
			return Verdict{}, refuse(protocol.CodeInvalidInput, "the %s attestor takes the TPM's evidence, not a join token", protocol.AttestorTPM)
		case req.BootNonce != "":
			return Verdict{}, refuse(protocol.CodeInvalidInput, "the %s attestor takes the TPM's evidence, not a boot nonce", protocol.AttestorTPM)
		case req.TPM == nil:
			return Verdict{}, refuse(protocol.CodeInvalidInput, "tpm: the %s attestor needs the TPM's evidence", protocol.AttestorTPM)
		}
		ev, err := checkTPMEvidence(r, opts.NodeKey)
		if err != nil {
			return Verdict{}, err
		}
		round2 := req.TPM.ChallengeID != "" || req.TPM.Secret != ""
		if round2 {
			if err := checkChallenge(r, opts.Bundle, ev); err != nil {
				return Verdict{}, err
			}
		}
		d, err := tpmPolicy(ctx, st, r, ev)
		if err != nil || d.deferred {
			return Verdict{RetryAfter: TPMRetryAfter}, err
		}
		if !round2 {
			ch, err := newChallenge(r, opts.Bundle, ev)
			if err != nil {
				return Verdict{}, err
			}
			return Verdict{Challenge: ch}, nil
		}
		adm := &Admission{Role: protocol.RoleNode, Site: d.site, Pool: d.pool, AllowReclaim: true, ProvenEK: ev.ekHash, Machine: d.machine}
		if d.enroll {
			adm.TPMEnrollment = &store.TPMEnrollment{EKSHA256: ev.ekHash, Site: d.site, MachineID: d.machine, CreatedAt: r.Now}
		}
		return Verdict{Admit: adm}, nil
	})
}

// b64 decodes a field of the evidence (INVALID_INPUT naming it).
func b64(field, v string, required bool) ([]byte, error) {
	if v == "" {
		if required {
			return nil, refuse(protocol.CodeInvalidInput, "tpm.%s is missing", field)
		}
		return nil, nil
	}
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return nil, refuse(protocol.CodeInvalidInput, "tpm.%s is not standard base64", field)
	}
	return b, nil
}

// checkTPMEvidence decodes the evidence and checks the EK, the AK and the
// certification of the CSR's key: the part both rounds share.
func checkTPMEvidence(r *Request, nodeKey string) (tpmEvidence, error) {
	a := r.Join.TPM
	var ev tpmEvidence
	var err error
	if ev.ekDER, err = b64("ek_public", a.EKPublic, true); err != nil {
		return ev, err
	}
	if ev.ek, err = x509.ParsePKIXPublicKey(ev.ekDER); err != nil {
		return ev, refuse(protocol.CodeInvalidInput, "tpm.ek_public is not a PKIX public key: %v", err)
	}
	ev.ekHash = tpmattest.EKSHA256(ev.ekDER)
	if blk, _ := pem.Decode([]byte(r.Join.Claims.TPMEK)); blk == nil || string(blk.Bytes) != string(ev.ekDER) {
		return ev, refuse(protocol.CodeInvalidInput, "claims.tpm_ek is not the PEM of tpm.ek_public (the TPM's endorsement key %s)", ev.ekHash)
	}
	ekCert, err := b64("ek_cert", a.EKCert, false)
	if err != nil {
		return ev, err
	}
	if ekCert != nil {
		if _, err := tpmattest.CheckEKCertificate(ekCert, ev.ekDER); err != nil {
			return ev, refuse(protocol.CodeInvalidInput, "tpm.ek_cert: %v", err)
		}
	}
	if ev.akPub, err = b64("ak_public", a.AKPublic, true); err != nil {
		return ev, err
	}
	if _, err := tpm2.Unmarshal[tpm2.TPMTPublic](ev.akPub); err != nil {
		return ev, refuse(protocol.CodeInvalidInput, "tpm.ak_public is not a TPMT_PUBLIC: %v", err)
	}
	if _, ev.akName, err = tpmattest.ParseAKPublic(ev.akPub); err != nil {
		return ev, refuse(protocol.CodeAttestorRefused, "tpm.ak_public: %v", err)
	}
	required := nodeKey != NodeKeyAny
	info, err := b64("certify_info", a.CertifyInfo, required)
	if err != nil {
		return ev, err
	}
	sig, err := b64("certify_signature", a.CertifySignature, required || info != nil)
	if err != nil {
		return ev, err
	}
	if info == nil && sig == nil {
		return ev, nil
	}
	if info == nil {
		return ev, refuse(protocol.CodeInvalidInput, "tpm.certify_info is missing")
	}
	if _, err := tpm2.Unmarshal[tpm2.TPMSAttest](info); err != nil {
		return ev, refuse(protocol.CodeInvalidInput, "tpm.certify_info is not a TPMS_ATTEST: %v", err)
	}
	if _, err := tpm2.Unmarshal[tpm2.TPMTSignature](sig); err != nil {
		return ev, refuse(protocol.CodeInvalidInput, "tpm.certify_signature is not a TPMT_SIGNATURE: %v", err)
	}
	csrSum := sha256.Sum256(r.CSR.Raw)
	if err := tpmattest.VerifyCertify(ev.akPub, info, sig, r.CSR.PublicKey, csrSum[:]); err != nil {
		return ev, refuse(protocol.CodeAttestorRefused, "the TPM's certification of the node key does not verify (nodeKey: %s): %v", NodeKeyCertified, err)
	}
	return ev, nil
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// newChallenge makes round one's answer.
func newChallenge(r *Request, b *pki.Bundle, ev tpmEvidence) (*protocol.TPMChallenge, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("tpm challenge: %w", err)
	}
	blob, enc, err := tpmattest.MakeCredential(ev.ek, ev.akName, secret)
	if err != nil {
		return nil, refuse(protocol.CodeAttestorRefused, "tpm.ek_public cannot be sealed to: %v", err)
	}
	exp := r.Now.Add(protocol.TPMChallengeLifetime * time.Second).Unix()
	payload, err := json.Marshal(tpmChallengeID{Purpose: protocol.PurposeTPMChallenge, Secret: secret, CSRSHA256: r.CSRSHA256,
		AKNameSHA256: sha256Hex(ev.akName), EKSHA256: ev.ekHash, Exp: exp})
	if err != nil {
		return nil, fmt.Errorf("tpm challenge: %w", err)
	}
	id, err := pki.Seal(b.Public.JoinEncryptionPublicKey(), payload)
	if err != nil {
		return nil, fmt.Errorf("tpm challenge: %w", err)
	}
	return &protocol.TPMChallenge{ID: id, CredentialBlob: base64.StdEncoding.EncodeToString(blob),
		EncryptedSecret: base64.StdEncoding.EncodeToString(enc), ExpiresAt: exp}, nil
}

// checkChallenge checks round two's challenge ID and secret.
func checkChallenge(r *Request, b *pki.Bundle, ev tpmEvidence) error {
	a := r.Join.TPM
	if a.ChallengeID == "" {
		return refuse(protocol.CodeInvalidInput, "tpm.challenge_id is missing (tpm.secret answers a challenge)")
	}
	secret, err := b64("secret", a.Secret, true)
	if err != nil {
		return err
	}
	plain, err := pki.Open(b.JoinEncryptionKey, a.ChallengeID)
	if err != nil {
		return refuse(protocol.CodeAttestorRefused, "tpm.challenge_id is not a challenge of this control plane (it does not open with its join encryption key)")
	}
	var c tpmChallengeID
	if err := httpjson.DecodeBytes(plain, &c); err != nil || c.Purpose != protocol.PurposeTPMChallenge {
		return refuse(protocol.CodeAttestorRefused, "tpm.challenge_id is not a TPM challenge")
	}
	switch {
	case r.Now.Unix() > c.Exp:
		return refuse(protocol.CodeAttestorRefused, "the TPM challenge expired at %s; join again for a new one",
			time.Unix(c.Exp, 0).UTC().Format(time.RFC3339))
	case c.EKSHA256 != ev.ekHash:
		return refuse(protocol.CodeAttestorRefused, "the TPM challenge was issued for another endorsement key (%s, this join's is %s)", human.Short(c.EKSHA256), ev.ekHash)
	case c.AKNameSHA256 != sha256Hex(ev.akName):
		return refuse(protocol.CodeAttestorRefused, "the TPM challenge was issued for another attestation key")
	case c.CSRSHA256 != r.CSRSHA256:
		return refuse(protocol.CodeAttestorRefused, "the TPM challenge was issued for another CSR (csr_sha256 %s, this one's is %s)", human.Short(c.CSRSHA256), r.CSRSHA256)
	case len(c.Secret) == 0 || subtle.ConstantTimeCompare(c.Secret, secret) != 1:
		return refuse(protocol.CodeAttestorRefused, "tpm.secret is not the challenge's: the TPM that holds the endorsement key did not activate the credential for this attestation key")
	}
	return nil
}

// tpmDecision is where the EK's policy lets the node join.
type tpmDecision struct {
	site, pool, machine string
	// enroll: the EK becomes the machine's enrollment with the node.
	enroll bool
	// deferred: the machine waits for approval.
	deferred bool
}

// tpmPolicy applies the EK's policy (see NewTPMAttestor).
func tpmPolicy(ctx context.Context, st TPMStore, r *Request, ev tpmEvidence) (tpmDecision, error) {
	req := r.Join
	e, err := st.GetTPMEnrollment(ctx, ev.ekHash)
	switch {
	case err == nil:
		if req.Site != "" && req.Site != e.Site {
			return tpmDecision{}, refuse(protocol.CodeWrongSite, "the TPM's endorsement key %s is enrolled in site %s, the join says site %s", ev.ekHash, e.Site, human.Short(req.Site))
		}
		pool := e.Pool
		if pool == "" {
			pool = apitype.DefaultPool
		}
		return tpmDecision{site: e.Site, pool: pool, machine: e.MachineID}, nil
	case !errors.Is(err, store.ErrNotFound):
		return tpmDecision{}, err
	}
	m, err := claimedMachine(ctx, st, req)
	if err != nil {
		return tpmDecision{}, err
	}
	if m.ID == "" {
		return tpmDecision{}, refuse(protocol.CodeAttestorRefused,
			"the TPM's endorsement key %s is not enrolled (better-compute machines enroll-tpm <machine> --ek-sha256 %s, or better-compute tpm enroll --site <site> --pool <pool> --ek-sha256 %s)",
			ev.ekHash, ev.ekHash, ev.ekHash)
	}
	if m.TPMEKSHA256 != "" {
		return tpmDecision{}, refuse(protocol.CodeAttestorRefused,
			"machine %s has another TPM enrolled (endorsement key %s, this join's is %s): better-compute machines enroll-tpm %s --ek-sha256 %s if its TPM was replaced",
			m.ID, m.TPMEKSHA256, ev.ekHash, m.ID, ev.ekHash)
	}
	if m.Approved {
		return tpmDecision{site: m.Site, pool: apitype.DefaultPool, machine: m.ID, enroll: true}, nil
	}
	if err := deferredOnce(ctx, st, r, m, ev.ekHash); err != nil {
		return tpmDecision{}, err
	}
	return tpmDecision{deferred: true}, nil
}

// claimedMachine is the registered machine of the join's site (any site when
// the join names none) whose MAC the claims list, ID "" for none.
func claimedMachine(ctx context.Context, st TPMStore, req *protocol.JoinRequest) (store.Machine, error) {
	for _, raw := range req.Claims.MACs {
		mac, err := protocol.NormalizeMAC(raw)
		if err != nil {
			continue
		}
		m, err := st.FindMachineByMAC(ctx, mac)
		switch {
		case errors.Is(err, store.ErrNotFound):
			continue
		case err != nil:
			return store.Machine{}, err
		case req.Site != "" && m.Site != req.Site:
			continue
		}
		return m, nil
	}
	return store.Machine{}, nil
}

// deferredEventScan is how far back in a machine's timeline a tpm join
// looks for its own deferral before writing one.
const deferredEventScan = 50

// deferredOnce puts a join.deferred entry for the EK on the machine's
// timeline unless its latest entries have one already.
func deferredOnce(ctx context.Context, st TPMStore, r *Request, m store.Machine, ek string) error {
	evs, err := st.MachineEvents(ctx, m.ID, deferredEventScan)
	if err != nil {
		return err
	}
	for _, e := range evs {
		var d struct {
			EK string `json:"ek_sha256"`
		}
		if e.Kind == protocol.MachineEventJoinDeferred && json.Unmarshal(e.Data, &d) == nil && d.EK == ek {
			return nil
		}
	}
	data, _ := json.Marshal(map[string]string{"attestor": protocol.AttestorTPM, "ek_sha256": ek})
	return st.AddMachineEvent(ctx, store.MachineEvent{MachineID: m.ID, Time: r.Now, Kind: protocol.MachineEventJoinDeferred, Data: data,
		Message: fmt.Sprintf("a tpm join (endorsement key %s) waits for approval: better-compute machines approve %s, or enroll the EK (better-compute machines enroll-tpm %s --ek-sha256 %s)",
			ek, m.ID, m.ID, ek)})
}
