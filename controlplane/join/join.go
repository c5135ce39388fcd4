package join

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/refusal"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// DefaultCertTTL is the lifetime of a node certificate.
const DefaultCertTTL = 90 * 24 * time.Hour

// Request is what an attestor decides on.
type Request struct {
	// Join is the request as the agent sent it.
	Join *protocol.JoinRequest
	// CSR is the parsed, signature-checked CSR.
	CSR *x509.CertificateRequest
	// CSRSHA256 is the lower-case hex SHA-256 of the CSR's DER.
	CSRSHA256 string
	// Token is the join token from the opened sealed token, "" when the
	// request carried none. It is a secret: never log it.
	Token string
	// Now is the time the join is decided at.
	Now time.Time
}

// Admission is an attestor's yes: who the agent joins as.
type Admission struct {
	Role, Site, Pool string
	// NodeID, when set, is the node the agent joins as: created when it
	// does not exist, reclaimed when it does.
	NodeID string
	// AllowReclaim lets a join whose claims match an existing node take
	// that node over (same id, new certificate), with proof: ProvenEK is
	// that node's EK, or the request's reclaim_proof is by its key.
	AllowReclaim bool
	// TokenID is the join token the join consumes, "" for none.
	TokenID string
	// BootNonce is the boot nonce the join consumes (discovery), nil for
	// none.
	BootNonce *token.Hash
	// Machine binds the node to that machine: its ramdisk (role ramdisk,
	// with Inventory) or its installed OS (role node).
	Machine   string
	Inventory json.RawMessage
	// Retire is a node the join replaces: the machine's previous ramdisk.
	Retire string
	// ProvenEK is the SHA-256 of the TPM endorsement key the attestor
	// proved by credential activation: a tpm join's is the node's TPM EK
	// whatever the claims say, and the join reclaims only a node of that
	// EK; a ramdisk's (discovery, on a machine with an enrolled EK) is kept
	// as the node's proven EK only (store.Node.ProvenEKSHA256).
	ProvenEK string
	// TPMEnrollment, when set, enrolls the proven EK for its machine with
	// the node (a machine the operator approved).
	TPMEnrollment *store.TPMEnrollment
}

// Verdict is an attestor's answer: Admit, a Challenge the agent must answer
// (the tpm attestor's first round), or a deferral of RetryAfter.
type Verdict struct {
	Admit      *Admission
	Challenge  *protocol.TPMChallenge
	RetryAfter time.Duration
}

// Attestor decides whether a joining agent is who it claims to be. A refusal
// is a *refusal.Refusal; any other error is the attestor failing and
// the join may be retried.
type Attestor interface {
	Attest(ctx context.Context, r *Request) (Verdict, error)
}

// AttestorFunc adapts a function to Attestor.
type AttestorFunc func(ctx context.Context, r *Request) (Verdict, error)

// Attest implements Attestor.
func (f AttestorFunc) Attest(ctx context.Context, r *Request) (Verdict, error) { return f(ctx, r) }

// Store is what the JoinService keeps nodes in, and where it reads the
// pools' policies.
type Store interface {
	store.Nodes
	GetPoolPolicy(ctx context.Context, pool string) (store.PoolPolicy, error)
}

// Service is the JoinService.
type Service struct {
	// Bundle holds the join encryption key (opening tokens), the join
	// signing key (signing answers) and the node CA (certificates).
	Bundle *pki.Bundle
	// Store holds the nodes.
	Store Store
	// Attestors by name (protocol.Attestor*).
	Attestors map[string]Attestor
	// CertTTL is the node certificates' lifetime; 0 means DefaultCertTTL.
	CertTTL time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger records joins; nil discards.
	Logger *slog.Logger
	// Reclaimed, when set, is called after a join took over an existing
	// node, before the answer goes out: the gateway ends the session the
	// node's previous certificate still holds.
	Reclaimed func(nodeID string)
	// Retired, when set, is called after a join retired another node (a
	// machine's previous ramdisk): the gateway ends its session.
	Retired func(nodeID string)
	// Bound, when set, is called after a join bound a node to a machine (a
	// ramdisk, or an installed OS): the lifecycle controller looks at the
	// machine at once.
	Bound func(machineID, nodeID string)
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Service) log() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func refuse(code, format string, args ...any) error { return refusal.New(code, format, args...) }

// DecodeRequest reads a JoinRequest of at most protocol.MaxJoinRequestSize
// bytes, refusing unknown fields and trailing data (INVALID_INPUT).
func DecodeRequest(r io.Reader) (*protocol.JoinRequest, error) {
	var req protocol.JoinRequest
	if err := httpjson.Decode(r, protocol.MaxJoinRequestSize, &req); err != nil {
		return nil, err
	}
	return &req, nil
}

// Join runs one join. See the package documentation for the steps.
func (s *Service) Join(ctx context.Context, req *protocol.JoinRequest) (*protocol.JoinResponse, error) {
	r, err := s.check(req)
	if err != nil {
		return nil, err
	}
	a, ok := s.Attestors[req.Attestor]
	if !ok {
		return nil, refuse(protocol.CodeAttestorRefused, "attestor %q is not enabled on this control plane", human.Short(req.Attestor))
	}
	v, err := a.Attest(ctx, r)
	if err != nil {
		return nil, err
	}
	if v.Challenge != nil {
		s.log().Info("join challenged", "attestor", req.Attestor, "csr_sha256", r.CSRSHA256, "expires", v.Challenge.ExpiresAt)
		return &protocol.JoinResponse{TPMChallenge: v.Challenge}, nil
	}
	if v.Admit == nil {
		secs := int((v.RetryAfter + time.Second - 1) / time.Second)
		if secs < 1 {
			secs = 1
		}
		s.log().Info("join deferred", "attestor", req.Attestor, "csr_sha256", r.CSRSHA256, "retry_after_s", secs)
		return &protocol.JoinResponse{RetryAfterS: secs}, nil
	}
	return s.admit(ctx, r, v.Admit)
}

// check validates the request and opens its sealed token.
func (s *Service) check(req *protocol.JoinRequest) (*Request, error) {
	if req == nil {
		return nil, refuse(protocol.CodeInvalidInput, "no join request")
	}
	if req.ProtocolVersion < protocol.MinVersion {
		return nil, refuse(protocol.CodeInvalidInput, "protocol_version %d: this control plane needs at least %d", req.ProtocolVersion, protocol.MinVersion)
	}
	if !protocol.ValidRole(req.Role) {
		return nil, refuse(protocol.CodeInvalidInput, "role %q: want node, site or ramdisk", human.Short(req.Role))
	}
	if req.Attestor == "" {
		return nil, refuse(protocol.CodeInvalidInput, "attestor is missing")
	}
	if req.NodeID != "" && !protocol.ValidNodeID(req.NodeID) {
		return nil, refuse(protocol.CodeInvalidInput, "node_id %q is not a valid node id", human.Short(req.NodeID))
	}
	csr, err := pki.ParseCSRPEM([]byte(req.CSR))
	if err != nil {
		return nil, refuse(protocol.CodeInvalidInput, "csr: %v", err)
	}
	r := &Request{Join: req, CSR: csr, CSRSHA256: pki.CSRSHA256(csr.Raw), Now: s.now()}
	if req.SealedToken != "" {
		plain, err := pki.Open(s.Bundle.JoinEncryptionKey, req.SealedToken)
		if err != nil {
			return nil, refuse(protocol.CodeInvalidInput, "sealed_token does not open with this control plane's join encryption key (is join_encryption_key_pin from this PKI bundle?)")
		}
		var st protocol.SealedToken
		if err := httpjson.DecodeBytes(plain, &st); err != nil {
			return nil, refuse(protocol.CodeInvalidInput, "sealed_token: the sealed content is not a SealedToken")
		}
		if st.CSRSHA256 != r.CSRSHA256 {
			return nil, refuse(protocol.CodeInvalidInput, "sealed_token is bound to another CSR (csr_sha256 %s, this CSR's is %s)", human.Short(st.CSRSHA256), r.CSRSHA256)
		}
		r.Token = st.Token
	}
	return r, nil
}

// admit picks the node, issues the certificate and writes the node.
func (s *Service) admit(ctx context.Context, r *Request, adm *Admission) (*protocol.JoinResponse, error) {
	req := r.Join
	if adm.Role != req.Role {
		return nil, refuse(protocol.CodeWrongRole, "the attestor admits role %s, the request is for %s", adm.Role, req.Role)
	}
	if err := s.checkPoolPolicy(ctx, req.Attestor, adm.Pool); err != nil {
		return nil, err
	}
	uuid := SystemUUID(req.Claims.SystemUUID)
	ek := EKSHA256(req.Claims.TPMEK)
	if adm.ProvenEK != "" {
		ek = adm.ProvenEK
	}
	if adm.Role == protocol.RoleRamdisk {
		// A ramdisk is a new node at every boot of a machine whose OS is a
		// node too: its hardware must not make later joins of that OS
		// reclaims of the ramdisk.
		uuid, ek = "", ""
	}

	var existing store.Node
	reclaim := false
	if adm.NodeID != "" {
		n, err := s.Store.GetNode(ctx, adm.NodeID)
		switch {
		case err == nil && n.Deleted():
			return nil, refuse(protocol.CodeNodeRevoked, "node %s was deleted; its id cannot join again", adm.NodeID)
		case err == nil:
			existing, reclaim = n, true
		case !errors.Is(err, store.ErrNotFound):
			return nil, err
		}
	} else {
		n, err := s.Store.FindNodeByClaims(ctx, uuid, ek)
		switch {
		case err == nil:
			if adm.ProvenEK != "" && n.TPMEKSHA256 != adm.ProvenEK {
				return nil, refuse(protocol.CodeReclaimNotAllowed,
					"this machine's %s belongs to node %s, which has another TPM (or none); the tpm attestor reclaims only a node of the same endorsement key: delete %s first (better-compute nodes delete %s --yes)",
					matchedOn(n, uuid, ek), n.ID, n.ID, n.ID)
			}
			if !adm.AllowReclaim {
				return nil, refuse(protocol.CodeReclaimNotAllowed,
					"this machine's hardware (%s) belongs to node %s, and the join token does not allow reclaim; %s",
					matchedOn(n, uuid, ek), n.ID, reclaimWays(n.ID))
			}
			if adm.ProvenEK == "" {
				// Claims are no proof: a token that allows reclaim takes the
				// node over only from who holds its key.
				if err := checkReclaimProof(r, n, uuid, ek); err != nil {
					return nil, err
				}
			}
			existing, reclaim = n, true
		case !errors.Is(err, store.ErrNotFound):
			return nil, err
		}
	}
	if reclaim {
		switch {
		case existing.Pool != adm.Pool:
			return nil, refuse(protocol.CodeWrongPool, "node %s is in pool %s, the token is for pool %s", existing.ID, existing.Pool, adm.Pool)
		case existing.Role != adm.Role:
			return nil, refuse(protocol.CodeWrongRole, "node %s has role %s, the token is for role %s", existing.ID, existing.Role, adm.Role)
		case existing.Site != adm.Site:
			return nil, refuse(protocol.CodeWrongSite, "node %s is in site %s, the token is for site %s", existing.ID, existing.Site, adm.Site)
		}
	}
	nodeID := adm.NodeID
	if reclaim {
		nodeID = existing.ID
	}
	if nodeID == "" {
		nodeID = ids.New(ids.PrefixNode, r.Now)
	}

	der, err := s.Bundle.IssueNodeCert(r.CSR, adm.Role, nodeID, s.certTTL())
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	claims, err := json.Marshal(req.Claims)
	if err != nil {
		return nil, fmt.Errorf("join: claims: %w", err)
	}
	spiffeID := pki.SPIFFEID(s.Bundle.Public.TrustDomain, adm.Role, nodeID)
	node := store.Node{
		ID: nodeID, Role: adm.Role, Site: adm.Site, Pool: adm.Pool, SPIFFEID: spiffeID, Claims: claims,
		SystemUUID: uuid, TPMEKSHA256: ek, TPMEKProven: ekProven(adm, existing, reclaim, ek), CertSerial: leaf.SerialNumber.Text(16), CertNotAfter: leaf.NotAfter,
		CertKeySHA256: KeySHA256(leaf.RawSubjectPublicKeyInfo), State: protocol.NodeAdopting, ProvenEKSHA256: adm.ProvenEK,
	}
	err = s.Store.Admit(ctx, store.Admission{TokenID: adm.TokenID, Node: node, Reclaim: reclaim, Now: r.Now,
		BootNonce: adm.BootNonce, Machine: adm.Machine, Inventory: adm.Inventory, Retire: adm.Retire, TPMEnrollment: adm.TPMEnrollment})
	var ekc *store.EKConflictError
	switch {
	case errors.As(err, &ekc):
		return nil, refuse(protocol.CodeAttestorRefused, "%s meanwhile", ekc.Error())
	case errors.Is(err, store.ErrNonceUsed):
		return nil, refuse(protocol.CodeNonceUsed, "the boot nonce was used by another join meanwhile")
	case errors.Is(err, store.ErrNoMachine):
		return nil, refuse(protocol.CodeMachineNotRegistered, "machine %s was deleted while its ramdisk joined", adm.Machine)
	case errors.Is(err, store.ErrTokenUsed):
		return nil, refuse(protocol.CodeTokenUsed, "join token %s was already used", adm.TokenID)
	case errors.Is(err, store.ErrTokenRevoked):
		return nil, refuse(protocol.CodeTokenRevoked, "join token %s was revoked", adm.TokenID)
	case errors.Is(err, store.ErrTokenExpired):
		return nil, refuse(protocol.CodeTokenExpired, "join token %s has expired", adm.TokenID)
	case errors.Is(err, store.ErrNodeDeleted):
		return nil, refuse(protocol.CodeNodeRevoked, "node %s was deleted while it joined", nodeID)
	case errors.Is(err, store.ErrNotFound) && adm.TokenID != "":
		return nil, refuse(protocol.CodeTokenUnknown, "join token %s is not known", adm.TokenID)
	case err != nil:
		return nil, err
	}

	if reclaim && s.Reclaimed != nil {
		s.Reclaimed(nodeID)
	}
	if adm.Retire != "" && adm.Retire != nodeID && s.Retired != nil {
		s.Retired(adm.Retire)
	}
	if adm.Machine != "" && s.Bound != nil {
		s.Bound(adm.Machine, nodeID)
	}
	leafPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	result := protocol.JoinResult{
		ProtocolVersion: protocol.Version,
		NodeID:          nodeID,
		Role:            adm.Role,
		Site:            adm.Site,
		Pool:            adm.Pool,
		SPIFFEID:        spiffeID,
		CSRSHA256:       r.CSRSHA256,
		CertChain:       []string{leafPEM, s.Bundle.Public.NodeCAPEM},
		TrustBundle:     []string{s.Bundle.Public.NodeCAPEM, s.Bundle.Public.ServingCAPEM},
		IssuedAt:        r.Now.Unix(),
	}
	resp, err := s.sign(result)
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	s.log().Info("node joined", "node", nodeID, "role", adm.Role, "site", adm.Site, "pool", adm.Pool,
		"attestor", req.Attestor, "reclaim", reclaim, "token", adm.TokenID, "machine", adm.Machine, "cert_serial", node.CertSerial)
	return resp, nil
}

// sign is the answer carrying result under the join signing key.
func (s *Service) sign(result protocol.JoinResult) (*protocol.JoinResponse, error) {
	payload, err := json.Marshal(result)
	if err != nil {
		return nil, err
	}
	signed, err := pki.Sign(s.Bundle.JoinSigningKey, protocol.PurposeJoinResponse, payload)
	if err != nil {
		return nil, err
	}
	return &protocol.JoinResponse{Signed: signed, SigningKey: s.Bundle.Public.JoinSigningPublicPEM}, nil
}

// checkPoolPolicy refuses (ATTESTOR_NOT_ALLOWED) a join with attestor into a
// pool whose policy does not list it.
func (s *Service) checkPoolPolicy(ctx context.Context, attestor, pool string) error {
	if pool == "" {
		return nil
	}
	p, err := s.Store.GetPoolPolicy(ctx, pool)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return err
	case !p.Allows(attestor):
		return refuse(protocol.CodeAttestorNotAllowed, "pool %s admits joins with the %s attestor only, not %s (better-compute pools show %s)",
			pool, strings.Join(p.JoinAttestors, ", "), attestor, pool)
	}
	return nil
}

func (s *Service) certTTL() time.Duration {
	if s.CertTTL == 0 {
		return DefaultCertTTL
	}
	return s.CertTTL
}

// KeySHA256 is the lower-case hex SHA-256 of a SubjectPublicKeyInfo's DER: the
// key a node's certificate certifies, as store.Node.CertKeySHA256 keeps it.
func KeySHA256(spki []byte) string {
	sum := sha256.Sum256(spki)
	return hex.EncodeToString(sum[:])
}

// ekProven is whether the node's EK, ek, is proven after this join: the
// attestor proved it, or the node's proven EK stays the same across a reclaim
// (by a token bound to the node, say), which takes away none of its
// protection.
func ekProven(adm *Admission, existing store.Node, reclaim bool, ek string) bool {
	if ek == "" {
		return false
	}
	return adm.ProvenEK == ek || (reclaim && existing.TPMEKProven && existing.TPMEKSHA256 == ek)
}

// checkReclaimProof admits a join-token reclaim of node n, which the claims
// matched, only with the proof of possession of n's key that the request
// carries (protocol.ReclaimProof): signed by the key of n's current
// certificate, for n and this join's CSR, and recent. A node whose EK the tpm
// attestor proved is not reclaimed this way. The refusal (RECLAIM_NOT_ALLOWED)
// names the node and the three ways to reclaim it.
func checkReclaimProof(r *Request, n store.Node, uuid, ek string) error {
	if n.TPMEKProven {
		return refuse(protocol.CodeReclaimNotAllowed,
			"this machine's hardware (%s) belongs to node %s, whose TPM endorsement key the tpm attestor proved: only the same TPM "+
				"(bcd join --attestor tpm) or a token bound to the node (better-compute tokens create --allow-reclaim --node-id %s; bcd join --node-id %s) reclaims it, "+
				"not the old node's key; or delete it first (better-compute nodes delete %s --yes)",
			matchedOn(n, uuid, ek), n.ID, n.ID, n.ID, n.ID)
	}
	why := reclaimProofProblem(r, n)
	if why == "" {
		return nil
	}
	return refuse(protocol.CodeReclaimNotAllowed,
		"this machine's hardware (%s) belongs to node %s, and claims are no proof: %s; %s",
		matchedOn(n, uuid, ek), n.ID, why, reclaimWays(n.ID))
}

// reclaimWays is the end of a RECLAIM_NOT_ALLOWED refusal: the three proofs
// that reclaim node id, and deleting it.
func reclaimWays(id string) string {
	return fmt.Sprintf("reclaim it with the same TPM (bcd join --attestor tpm), with the old node's key and a token that allows reclaim "+
		"(bcd join --reset keeps the key in data_dir, and bcd join signs with it), or with a token bound to it "+
		"(better-compute tokens create --allow-reclaim --node-id %s; bcd join --node-id %s); or delete it first (better-compute nodes delete %s --yes)",
		id, id, id)
}

// reclaimProofProblem says why r's reclaim proof does not prove that the
// agent holds node n's key, "" when it does.
func reclaimProofProblem(r *Request, n store.Node) string {
	p := r.Join.ReclaimProof
	if p == nil {
		return "the join carries no proof of the old node's key (reclaim_proof)"
	}
	payload, err := protocol.DecodeReclaimPayload(p.Payload)
	if err != nil {
		return "the reclaim proof's payload is not JSON"
	}
	if payload.Purpose != protocol.PurposeReclaimProof {
		return fmt.Sprintf("the reclaim proof's purpose is %q, not %q", human.Short(payload.Purpose), protocol.PurposeReclaimProof)
	}
	if payload.NodeID != n.ID {
		return fmt.Sprintf("the reclaim proof is by the key of node %s, not %s", human.Short(payload.NodeID), n.ID)
	}
	if n.CertKeySHA256 == "" || KeySHA256(p.PublicKey) != n.CertKeySHA256 {
		return "the reclaim proof is not signed with the key of node " + n.ID + "'s current certificate"
	}
	pub, err := x509.ParsePKIXPublicKey(p.PublicKey)
	ec, ok := pub.(*ecdsa.PublicKey)
	if err != nil || !ok {
		return "the reclaim proof's public key is not an ECDSA key"
	}
	digest := sha256.Sum256(p.Payload)
	if !ecdsa.VerifyASN1(ec, digest[:], p.Signature) {
		return "the reclaim proof's signature does not verify"
	}
	if payload.CSRSHA256 != r.CSRSHA256 {
		return "the reclaim proof is for another CSR (csr_sha256 " + human.Short(payload.CSRSHA256) + "), not this join's"
	}
	if d := r.Now.Sub(payload.Time); d > protocol.ReclaimProofMaxAge || d < -protocol.ReclaimProofMaxAge {
		return fmt.Sprintf("the reclaim proof was signed at %s, more than %s from the control plane's clock",
			payload.Time.UTC().Format(time.RFC3339), protocol.ReclaimProofMaxAge)
	}
	return ""
}

func matchedOn(n store.Node, uuid, ek string) string {
	if ek != "" && n.TPMEKSHA256 == ek {
		return "TPM endorsement key"
	}
	return "system UUID " + uuid
}

// placeholderUUIDs are system UUIDs that firmware ships on many boards at
// once. Matching on them would make unrelated machines reclaim each other.
var placeholderUUIDs = map[string]bool{
	"00000000-0000-0000-0000-000000000000": true,
	"ffffffff-ffff-ffff-ffff-ffffffffffff": true,
	"03000200-0400-0500-0006-000700080009": true,
	"00020003-0004-0005-0006-000700080009": true,
	"not settable":                         true,
	"not present":                          true,
	"default string":                       true,
	"to be filled by o.e.m.":               true,
}

// SystemUUID normalises a claimed system UUID for matching: lower case,
// trimmed, and "" for a placeholder.
func SystemUUID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if placeholderUUIDs[s] || len(s) > 128 {
		return ""
	}
	return s
}

// EKSHA256 is the lower-case hex SHA-256 of a claimed TPM endorsement key:
// of its DER when the claim is PEM, else of the trimmed text. "" for none.
func EKSHA256(ek string) string {
	ek = strings.TrimSpace(ek)
	if ek == "" {
		return ""
	}
	b := []byte(ek)
	if blk, _ := pem.Decode(b); blk != nil {
		b = blk.Bytes
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
