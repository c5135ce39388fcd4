package protocol

import (
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"regexp"
	"time"
)

// Version is the protocol version this build speaks.
const Version = 1

// MinVersion is the oldest protocol version a gateway of this build accepts.
const MinVersion = 1

// Roles an agent joins as. A certificate names exactly one.
const (
	RoleNode    = "node"
	RoleSite    = "site"
	RoleRamdisk = "ramdisk"
)

// ValidRole reports whether r is one of the three roles.
func ValidRole(r string) bool { return r == RoleNode || r == RoleSite || r == RoleRamdisk }

// Attestors: how a joining agent proves it may join.
const (
	AttestorJoinToken   = "join-token"  // a single-use bcjt_ token
	AttestorProvisioned = "provisioned" // an installed OS: the token and node id its deploy wrote
	AttestorDiscovery   = "discovery"   // the ramdisk: a boot nonce the site agent minted for its MAC
	AttestorTPM         = "tpm"
)

// TokenPrefix starts every join token; OperatorTokenPrefix every operator token.
const (
	TokenPrefix         = "bcjt_"
	OperatorTokenPrefix = "bcop_"
)

// Paths on the gateway and the api.
const (
	PathJoin      = "/v1/join"
	PathSession   = "/v1/session"
	PathRenew     = "/v1/renew"
	PathWellKnown = "/.well-known/better-compute"
)

// MaxJoinRequestSize bounds what the gateway reads of a join request.
const MaxJoinRequestSize = 64 << 10

// JoinRequest is the body of POST /v1/join.
type JoinRequest struct {
	ProtocolVersion int    `json:"protocol_version"`
	CSR             string `json:"csr"` // PEM, P-256
	Role            string `json:"role"`
	Attestor        string `json:"attestor"`
	// SealedToken is a compact JWE (ECDH-ES+A256KW, A256GCM) to the join encryption
	// key whose plaintext is a SealedToken bound to this CSR.
	SealedToken string `json:"sealed_token,omitempty"`
	// TPM is the tpm attestor's evidence (see TPMAttestation).
	TPM       *TPMAttestation `json:"tpm,omitempty"`
	Claims    Claims          `json:"claims"`
	NodeID    string          `json:"node_id,omitempty"`    // provisioned: the node the deploy minted the token for
	BootNonce string          `json:"boot_nonce,omitempty"` // discovery
	// Witness is the discovery join's countersignature by the site agent
	// that minted BootNonce (see BootWitness).
	Witness       *BootWitness `json:"witness,omitempty"`
	Site          string       `json:"site,omitempty"` // from config.toml; a token for another site is refused
	DaemonVersion string       `json:"daemon_version,omitempty"`
	// ReclaimProof, when set, proves that the joining agent holds the key of
	// the node its hardware claims match (see ReclaimProof). Optional: an
	// older agent sends none, and then a join-token reclaim is refused.
	ReclaimProof *ReclaimProof `json:"reclaim_proof,omitempty"`
}

// ReclaimProof is a joining agent's proof of possession of an existing
// node's key: bcd join signs it with the node.key that bcd join --reset moved
// aside (in the TPM when the key is there). A join-token join whose claims
// (system_uuid, tpm_ek) match an existing node reclaims that node only with
// this proof, with the tpm attestor proving the node's EK, or with a token
// bound to the node (provisioned attestor); a node whose EK the tpm attestor
// proved is not reclaimed by this proof.
//
// Payload is a ReclaimPayload's JSON; Signature is ASN.1 ECDSA over
// SHA-256(Payload) by the old node's key, whose DER SubjectPublicKeyInfo is
// PublicKey. The control plane takes it only when PublicKey is the key of the
// node's current certificate, Payload names that node and this join's CSR,
// and Time is within ReclaimProofMaxAge of its clock. Bound to the CSR, a
// captured proof cannot reclaim for another key; once the reclaim is done the
// node's key is the CSR's, so the proof cannot be used again.
type ReclaimProof struct {
	Payload   []byte `json:"payload"`    // a ReclaimPayload, as signed
	Signature []byte `json:"signature"`  // over SHA-256(Payload)
	PublicKey []byte `json:"public_key"` // DER SubjectPublicKeyInfo of the old node's key
}

// ReclaimPayload is what a ReclaimProof signs.
type ReclaimPayload struct {
	Purpose   string    `json:"purpose"`    // PurposeReclaimProof
	NodeID    string    `json:"node_id"`    // the node whose key signs
	CSRSHA256 string    `json:"csr_sha256"` // lowercase hex SHA-256 of this join's CSR DER
	Time      time.Time `json:"time"`       // when the agent signed
}

// PurposeReclaimProof is ReclaimPayload.Purpose: a signature by a node key
// over a payload of another purpose is no reclaim proof.
const PurposeReclaimProof = "reclaim-proof"

// ReclaimProofMaxAge bounds how far from the control plane's clock a
// ReclaimProof's time may be (either way).
const ReclaimProofMaxAge = 10 * time.Minute

// DecodeReclaimPayload reads a ReclaimProof's payload.
func DecodeReclaimPayload(b []byte) (ReclaimPayload, error) {
	var p ReclaimPayload
	err := json.Unmarshal(b, &p)
	return p, err
}

// SealedToken is the plaintext inside JoinRequest.SealedToken. Binding the token to the
// CSR's digest means a captured request cannot be replayed with another key.
type SealedToken struct {
	Token     string `json:"token"`
	CSRSHA256 string `json:"csr_sha256"` // lowercase hex of SHA-256 over the CSR's DER
	IssuedAt  int64  `json:"iat"`        // unix seconds
}

// Claims describe the hardware an agent runs on. Nothing in them is trusted without
// an attestor that proves it; they are inventory.
type Claims struct {
	Hostname      string   `json:"hostname,omitempty"`
	MACs          []string `json:"macs,omitempty"`
	SystemUUID    string   `json:"system_uuid,omitempty"`
	SystemSerial  string   `json:"system_serial,omitempty"`
	SystemVendor  string   `json:"system_vendor,omitempty"`
	SystemProduct string   `json:"system_product,omitempty"`
	CPUs          int      `json:"cpus,omitempty"`
	CPUModel      string   `json:"cpu_model,omitempty"`
	MemoryBytes   int64    `json:"memory_bytes,omitempty"`
	Disks         []Disk   `json:"disks,omitempty"`
	GPUs          []GPU    `json:"gpus,omitempty"`
	TPMEK         string   `json:"tpm_ek,omitempty"` // PEM public endorsement key, where present
}

// Disk is one block device of the claims.
type Disk struct {
	Name       string `json:"name"` // kernel name, e.g. nvme0n1
	SizeBytes  int64  `json:"size_bytes"`
	Model      string `json:"model,omitempty"`
	Serial     string `json:"serial,omitempty"`
	Removable  bool   `json:"removable,omitempty"`
	Rotational bool   `json:"rotational,omitempty"`
}

// GPU is one accelerator as nvidia-smi reports it.
type GPU struct {
	Index       int    `json:"index"`
	Name        string `json:"name"`
	UUID        string `json:"uuid,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
}

// JoinResponse is the answer to a join: either Signed (a compact JWS under the join
// signing key, purpose PurposeJoinResponse, over a JoinResult) or a deferral.
type JoinResponse struct {
	Signed string `json:"signed,omitempty"`
	// SigningKey is the join signing public key (PEM SubjectPublicKeyInfo). An agent
	// uses it only when its SPKI pin equals join_signing_key_pin.
	SigningKey  string `json:"signing_key,omitempty"`
	RetryAfterS int    `json:"retry_after_s,omitempty"`
	// TPMChallenge is the tpm attestor's round one answer: recover its
	// secret with the TPM and join again with it.
	TPMChallenge *TPMChallenge `json:"tpm_challenge,omitempty"`
}

// PurposeJoinResponse is the JWS purpose of JoinResponse.Signed.
const PurposeJoinResponse = "join-response"

// JoinResult is the payload of JoinResponse.Signed.
type JoinResult struct {
	ProtocolVersion int      `json:"protocol_version"`
	NodeID          string   `json:"node_id"`
	Role            string   `json:"role"`
	Site            string   `json:"site"`
	Pool            string   `json:"pool,omitempty"`
	SPIFFEID        string   `json:"spiffe_id"`
	CSRSHA256       string   `json:"csr_sha256"`
	CertChain       []string `json:"cert_chain"`   // PEM, leaf first
	TrustBundle     []string `json:"trust_bundle"` // PEM: the node CA and the serving CA
	IssuedAt        int64    `json:"iat"`
}

// RenewRequest is the body of POST /v1/renew, sent over mutual TLS with the node's
// current certificate: the handshake proves the current key, the CSR the next
// one. The answer is a JoinResponse whose JoinResult (purpose
// PurposeJoinResponse) certifies the CSR's key for the same node and role.
type RenewRequest struct {
	ProtocolVersion int    `json:"protocol_version"`
	CSR             string `json:"csr"` // PEM, P-256: the next key
	DaemonVersion   string `json:"daemon_version,omitempty"`
}

// ErrorResponse is the body of every refused api or gateway call.
type ErrorResponse struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable,omitempty"`
}

func (e *ErrorResponse) Error() string { return e.Code + ": " + e.Message }

// Error codes an agent or operator reads. Join refusals say exactly why.
const (
	CodeInvalidInput      = "INVALID_INPUT"
	CodeInvalidConfig     = "INVALID_CONFIG"
	CodeUnauthenticated   = "UNAUTHENTICATED"
	CodeNotFound          = "NOT_FOUND"
	CodeTokenUnknown      = "TOKEN_UNKNOWN"
	CodeTokenUsed         = "TOKEN_USED"
	CodeTokenExpired      = "TOKEN_EXPIRED"
	CodeTokenRevoked      = "TOKEN_REVOKED"
	CodeWrongRole         = "WRONG_ROLE"
	CodeWrongPool         = "WRONG_POOL"
	CodeWrongSite         = "WRONG_SITE"
	CodeReclaimNotAllowed = "RECLAIM_NOT_ALLOWED"
	CodeAttestorRefused   = "ATTESTOR_REFUSED"
	CodeNodeRevoked       = "NODE_REVOKED"
	// CodeCertReplaced: a renewal with a certificate a later join or renewal
	// of the node replaced.
	CodeCertReplaced = "CERT_REPLACED"
	CodeUnsupported  = "UNSUPPORTED"
	CodeUnavailable  = "UNAVAILABLE"
	CodeInternal     = "INTERNAL"
	// CodeAlreadyExists refuses creating what exists (a site of that name).
	CodeAlreadyExists = "ALREADY_EXISTS"
	// CodeAttestorNotAllowed refuses a join into a pool whose policy
	// (joinAttestors) does not list the join's attestor.
	CodeAttestorNotAllowed = "ATTESTOR_NOT_ALLOWED"
	// CodeMachineBusy refuses a change to a machine that runs a deployment
	// (its spec, a manual BMC command, a delete): cancel the deployment
	// first.
	CodeMachineBusy = "MACHINE_BUSY"
)

// WellKnown is /.well-known/better-compute: what an agent with only the server URL and
// three pins needs to join. Everything in it is checked against the pins.
type WellKnown struct {
	Gateway *WellKnownGateway `json:"gateway,omitempty"`
	Join    WellKnownJoin     `json:"join"`
}

// WellKnownGateway says where the gateway is.
type WellKnownGateway struct {
	URL          string `json:"url"`
	ServerName   string `json:"serverName,omitempty"`
	ServingCAPin string `json:"servingCaPin"`
}

// WellKnownJoin carries the join encryption public key and the pins the control plane
// publishes, so a mismatch with the installer's pins is refused.
type WellKnownJoin struct {
	EncryptionJWK    json.RawMessage `json:"encryptionJwk"`
	EncryptionKeyPin string          `json:"encryptionKeyPin"`
	SigningKeyPin    string          `json:"signingKeyPin"`
}

// MaxWellKnownSize bounds what an agent reads of the well-known document.
const MaxWellKnownSize = 64 << 10

// Frame types of a session.
const (
	FrameHello   = "hello"
	FrameWelcome = "welcome"
	FrameSpec    = "spec"
	FrameCommand = "command"
	FrameStatus  = "status"
	FrameEvent   = "event"
	FrameAck     = "ack"
	FrameError   = "error"
)

// Frame is one WebSocket message of a session: a type and its payload.
type Frame struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

// NewFrame encodes v as the payload of a frame of type typ.
func NewFrame(typ string, v any) (Frame, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return Frame{}, fmt.Errorf("protocol: encode %s: %w", typ, err)
	}
	return Frame{Type: typ, Data: b}, nil
}

// Decode decodes the frame's payload into v.
func (f Frame) Decode(v any) error {
	if err := json.Unmarshal(f.Data, v); err != nil {
		return fmt.Errorf("protocol: decode %s: %w", f.Type, err)
	}
	return nil
}

// Hello is the agent's first frame.
type Hello struct {
	ProtocolVersion int    `json:"protocol_version"`
	NodeID          string `json:"node_id"`
	Role            string `json:"role"`
	DaemonVersion   string `json:"daemon_version"`
	BootID          string `json:"boot_id"`
	// DaemonArch is the GOARCH bcd was built for: which bare binary of a
	// release (bcd_<version>_linux_<arch>) a rollout hands this agent.
	DaemonArch string  `json:"daemon_arch,omitempty"`
	Claims     *Claims `json:"claims,omitempty"`
}

// Welcome is the gateway's answer to Hello.
type Welcome struct {
	ServerTime         time.Time `json:"server_time"`
	MinProtocolVersion int       `json:"min_protocol_version"`
	UpgradeRequired    bool      `json:"upgrade_required,omitempty"`
	NodeState          string    `json:"node_state"`
	Spec               *Spec     `json:"spec,omitempty"`
}

// Spec is an agent's desired state. Sections are added by the steps that need them;
// an agent ignores a section it does not know, and Revision only grows.
type Spec struct {
	Revision int64                      `json:"revision"`
	Sections map[string]json.RawMessage `json:"sections,omitempty"`
}

// Command states.
const (
	StateRunning     = "RUNNING"
	StateSucceeded   = "SUCCEEDED"
	StateFailed      = "FAILED"
	StateUnsupported = "UNSUPPORTED"
)

// Reasons the control plane itself gives a command's FAILED status (an
// agent gives its own: each command kind names them).
const (
	// ReasonNodeDeleted: the node the command was for was deleted (or
	// retired, like a ramdisk once its installed OS joined) before it
	// reported.
	ReasonNodeDeleted = "NodeDeleted"
)

// Terminal reports whether a command in state s is over.
func Terminal(s string) bool { return s == StateSucceeded || s == StateFailed || s == StateUnsupported }

// Command asks an agent to do something once.
type Command struct {
	ID     string          `json:"id"`
	Kind   string          `json:"kind"`
	Params json.RawMessage `json:"params,omitempty"`
}

// Status reports a command's progress. Seq is the agent's journal sequence number.
type Status struct {
	Seq       uint64          `json:"seq"`
	CommandID string          `json:"command_id"`
	State     string          `json:"state"`
	Reason    string          `json:"reason,omitempty"`
	Message   string          `json:"message,omitempty"`
	Progress  *Progress       `json:"progress,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Time      time.Time       `json:"time"`
}

// Progress of a long command (a deploy): done of total units.
type Progress struct {
	Done  int64   `json:"done"`
	Total int64   `json:"total,omitempty"`
	Unit  string  `json:"unit,omitempty"` // "bytes"
	Rate  float64 `json:"rate,omitempty"` // units per second
}

// Event is something an agent saw: a log line, a machine that booted.
type Event struct {
	Seq     uint64          `json:"seq"`
	Kind    string          `json:"kind"`
	Time    time.Time       `json:"time"`
	Level   string          `json:"level,omitempty"`
	Message string          `json:"message,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// Ack acknowledges every Status and Event up to and including Seq.
type Ack struct {
	Seq uint64 `json:"seq"`
}

// Node states the gateway records.
const (
	NodeAdopting = "adopting"
	NodeReady    = "ready"
	NodeOffline  = "offline"
	NodeCordoned = "cordoned"
)

// Command kinds, by the role that runs them.
const (
	KindBMCPower      = "bmc.power"
	KindBMCBootdev    = "bmc.bootdev"
	KindBMCInventory  = "bmc.inventory"
	KindInventory     = "inventory"
	KindDeployImage   = "deploy.image"
	KindDiskWipe      = "disk.wipe"
	KindDiagDCGM      = "diag.dcgm"
	KindMachineKexec  = "machine.kexec"
	KindMachineReboot = "machine.reboot"
	KindMachineOff    = "machine.poweroff"
	KindNodeReboot    = "node.reboot"
	KindDaemonUpgrade = "daemon.upgrade"
)

var kindsByRole = map[string][]string{
	RoleSite:    {KindBMCPower, KindBMCBootdev, KindBMCInventory, KindDaemonUpgrade},
	RoleRamdisk: {KindInventory, KindDeployImage, KindDiskWipe, KindDiagDCGM, KindMachineKexec, KindMachineReboot, KindMachineOff},
	RoleNode:    {KindNodeReboot, KindDaemonUpgrade},
}

// KindAllowed reports whether a command of kind may be sent to an agent of role.
func KindAllowed(role, kind string) bool {
	for _, k := range kindsByRole[role] {
		if k == kind {
			return true
		}
	}
	return false
}

var nodeIDPattern = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// ValidNodeID reports whether id may name a node (it ends up in a SPIFFE id and paths).
func ValidNodeID(id string) bool { return nodeIDPattern.MatchString(id) }

// SignReclaimProof is key's ReclaimProof for a join of the CSR whose SHA-256
// is csrSHA256 (lowercase hex) that reclaims node nodeID, signed at now. key
// is the old node's key (a crypto.Signer: it may be in a TPM).
func SignReclaimProof(key crypto.Signer, nodeID, csrSHA256 string, now time.Time) (*ReclaimProof, error) {
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, fmt.Errorf("reclaim proof: %w", err)
	}
	payload, err := json.Marshal(ReclaimPayload{Purpose: PurposeReclaimProof, NodeID: nodeID, CSRSHA256: csrSHA256, Time: now.UTC()})
	if err != nil {
		return nil, fmt.Errorf("reclaim proof: %w", err)
	}
	digest := sha256.Sum256(payload)
	sig, err := key.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("reclaim proof: sign with the key of node %s: %w", nodeID, err)
	}
	return &ReclaimProof{Payload: payload, Signature: sig, PublicKey: pub}, nil
}
