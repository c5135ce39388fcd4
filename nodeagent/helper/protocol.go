package helper

import (
	"time"

	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/protocol"
)

// PathPrefix is the prefix of every operation's URL path: POST PathPrefix+op.
const PathPrefix = "/v1/"

// The operations.
const (
	OpReboot         = "reboot"
	OpUpdateResume   = "update.resume"
	OpUpdateVerify   = "update.verify"
	OpUpdateSwap     = "update.swap"
	OpUpdateConfirm  = "update.confirm"
	OpUpdateSwapBack = "update.swap-back"
	OpTPMCreate      = "tpm.create"
	OpTPMLoad        = "tpm.load"
	OpTPMSign        = "tpm.sign"
)

// Ops is every operation, in the order the package doc lists them.
var Ops = []string{OpReboot, OpUpdateResume, OpUpdateVerify, OpUpdateSwap, OpUpdateConfirm, OpUpdateSwapBack, OpTPMCreate, OpTPMLoad, OpTPMSign}

// MaxRequest bounds a request body: a daemon section with its signed
// manifest, or a TPM key record, is a few KiB.
const MaxRequest = 256 << 10

// Error codes. A self-update refusal keeps its selfupdate code (NO_RELEASE_PINS,
// RELEASE_ROLLBACK…) and sets Refusal, so the node reports it as a refusal.
const (
	// CodePeerRefused: the caller is not the node user running an installed bcd.
	CodePeerRefused = "HELPER_PEER_REFUSED"
	// CodeInvalidRequest: the request does not decode or validate.
	CodeInvalidRequest = "INVALID_REQUEST"
	// CodeUnknownOp: no such operation.
	CodeUnknownOp = "HELPER_UNKNOWN_OP"
	// CodeNoTPM: the host has no TPM the helper can use.
	CodeNoTPM = "NO_TPM"
	// CodeFailed: the operation failed on the host.
	CodeFailed = "HELPER_FAILED"
	// CodeUnavailable: the client reached no helper at the socket.
	CodeUnavailable = "HELPER_UNAVAILABLE"
)

// Error is a failed operation as the wire carries it.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Refusal marks a self-update refusal (selfupdate.Refusal).
	Refusal bool `json:"refusal,omitempty"`
}

func (e *Error) Error() string { return "bcd helper: " + e.Code + ": " + e.Message }

// UpdateRequest is every update.* operation's request.
type UpdateRequest struct {
	// Running is the node's version (version.Version), which Resume, Confirm
	// and Swap compare with upgrade.json; the helper's own may differ.
	Running string `json:"running"`
	// Section is the daemon section (update.verify, update.swap).
	Section *protocol.DaemonSection `json:"section,omitempty"`
	// ServerTime is the server's clock from the node's last Welcome; zero
	// checks the manifest's expiry on the host clock only.
	ServerTime time.Time `json:"server_time,omitzero"`
	// CommandID and Revision say which daemon.upgrade or spec asked
	// (update.swap).
	CommandID string `json:"command_id,omitempty"`
	Revision  int64  `json:"revision,omitempty"`
	// Why is the swap back's reason (update.swap-back).
	Why string `json:"why,omitempty"`
}

// PlanResponse answers update.verify: nil Plan means the section names the
// running version.
type PlanResponse struct {
	Plan *selfupdate.Plan `json:"plan"`
}

// OutcomeResponse answers update.resume and update.confirm.
type OutcomeResponse struct {
	Outcome selfupdate.Outcome `json:"outcome"`
}

// TPMKeyRequest is tpm.load's request: node.key's content.
type TPMKeyRequest struct {
	Record []byte `json:"record"`
}

// TPMKeyResponse answers tpm.create (Record set: the new node.key's content)
// and tpm.load. PublicKey is the key's PKIX DER.
type TPMKeyResponse struct {
	Record    []byte `json:"record,omitempty"`
	PublicKey []byte `json:"public_key"`
}

// TPMSignRequest is tpm.sign's request. Hash is crypto.Hash's String()
// ("SHA-256"); Digest must be that hash's size.
type TPMSignRequest struct {
	Record []byte `json:"record"`
	Digest []byte `json:"digest"`
	Hash   string `json:"hash"`
}

// TPMSignResponse is the ASN.1 ECDSA signature.
type TPMSignResponse struct {
	Signature []byte `json:"signature"`
}

// Empty is the request and answer of operations that carry nothing (reboot).
type Empty struct{}
