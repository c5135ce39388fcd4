package apitype

import (
	"encoding/json"
	"time"

	"github.com/better-compute/bcd/protocol"
)

// Approval policies of a site (Site.Approval): whether a machine's ramdisk
// joins on its boot nonce alone or waits for `machines approve`.
const (
	ApprovalAuto   = "auto"
	ApprovalManual = "manual"
)

// SiteCreate is the body of POST /api/v1/sites.
type SiteCreate struct {
	Name string `json:"name"`
	// Approval is ApprovalAuto (the default when empty) or ApprovalManual:
	// whether a machine's ramdisk joins on its boot nonce alone or waits
	// for POST /machines/{m}/approve.
	Approval string `json:"approval,omitempty"`
}

// HTTPProxySet is the body of PUT /api/v1/sites/{name}/http-proxy.
type HTTPProxySet = protocol.HTTPProxySection

// Site is a data-centre site. Tokens, nodes and machines belong to one.
type Site struct {
	Name string `json:"name"`
	// Approval is ApprovalAuto or ApprovalManual.
	Approval string `json:"approval"`
	// HTTPProxy is the proxy the site's agents run for the boot network;
	// nil for none.
	HTTPProxy *protocol.HTTPProxySection `json:"http_proxy,omitempty"`
	// SpecRevision grows with every change to what the site's agents are
	// sent (machines, BMCs, boot modes, the proxy).
	SpecRevision int64     `json:"spec_revision"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at,omitzero"`
}

// ManualApproval reports whether the site's ramdisk joins wait for an
// operator.
func (s Site) ManualApproval() bool { return s.Approval == ApprovalManual }

// SiteList answers GET /api/v1/sites.
type SiteList struct {
	Sites []Site `json:"sites"`
}

// Token states (TokenInfo.State).
const (
	TokenActive  = "active"
	TokenUsed    = "used"
	TokenRevoked = "revoked"
	TokenExpired = "expired"
)

// TokenCreate is the body of POST /api/v1/tokens.
type TokenCreate struct {
	Pool string `json:"pool"`
	Site string `json:"site"`
	Role string `json:"role"`
	// TTLSeconds is the token's lifetime; 0 means the api's default (24h).
	TTLSeconds   int64  `json:"ttl_s,omitempty"`
	AllowReclaim bool   `json:"allow_reclaim,omitempty"`
	NodeID       string `json:"node_id,omitempty"`
}

// TokenInfo is a join token's record and its state: active, used, revoked
// or expired. The secret is not in it.
type TokenInfo struct {
	ID   string `json:"id"`
	Pool string `json:"pool"`
	Site string `json:"site"`
	Role string `json:"role"`
	// NodeID binds the token to one node id: the join must name it and
	// gets it.
	NodeID string `json:"node_id,omitempty"`
	// MachineID names the machine whose deploy minted the token.
	MachineID    string    `json:"machine_id,omitempty"`
	AllowReclaim bool      `json:"allow_reclaim"`
	CreatedAt    time.Time `json:"created_at"`
	ExpiresAt    time.Time `json:"expires_at"`
	UsedAt       time.Time `json:"used_at,omitzero"`
	UsedBy       string    `json:"used_by,omitempty"`
	RevokedAt    time.Time `json:"revoked_at,omitzero"`
	// State is TokenActive, TokenUsed, TokenRevoked or TokenExpired.
	State string `json:"state"`
}

// TokenCreated answers TokenCreate. Token is the secret, shown once.
type TokenCreated struct {
	TokenInfo
	Token string `json:"token"`
}

// TokenList answers GET /api/v1/tokens.
type TokenList struct {
	Tokens []TokenInfo `json:"tokens"`
}

// NodeInfo is a joined agent and whether it has a session.
type NodeInfo struct {
	ID       string          `json:"id"`
	Role     string          `json:"role"`
	Site     string          `json:"site"`
	Pool     string          `json:"pool"`
	SPIFFEID string          `json:"spiffe_id"`
	Claims   json.RawMessage `json:"claims"`
	// SystemUUID and TPMEKSHA256 are the claims a reclaim matches on.
	SystemUUID  string `json:"system_uuid,omitempty"`
	TPMEKSHA256 string `json:"tpm_ek_sha256,omitempty"`
	// TPMEKProven: the tpm attestor proved the EK; only the same TPM or a
	// token bound to the node reclaims it.
	TPMEKProven bool `json:"tpm_ek_proven,omitempty"`
	// ProvenEKSHA256 is the TPM endorsement key its join proved by
	// credential activation (tpm; a ramdisk of a machine with an enrolled EK).
	ProvenEKSHA256 string    `json:"proven_ek_sha256,omitempty"`
	CertSerial     string    `json:"cert_serial"`
	CertNotAfter   time.Time `json:"cert_not_after"`
	State          string    `json:"state"`
	Cordoned       bool      `json:"cordoned"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	JoinedAt       time.Time `json:"joined_at"`
	// DeletedAt is when the node was deleted (its identity revoked).
	DeletedAt time.Time `json:"deleted_at,omitzero"`
	// SessionID is the node's open gateway session, 0 when it has none.
	SessionID     int64     `json:"session_id,omitempty"`
	DaemonVersion string    `json:"daemon_version"`
	LastSeenAt    time.Time `json:"last_seen_at,omitzero"`
	SpecRevision  int64     `json:"spec_revision"`
	Connected     bool      `json:"connected"`
	// DaemonArch is the GOARCH the node's bcd reported.
	DaemonArch string `json:"daemon_arch"`
	// DaemonTarget is the release the node should run (its daemon
	// section), "" for none.
	DaemonTarget string `json:"daemon_target,omitempty"`
	// DaemonSection is the node's latest report on its daemon section,
	// nil for none.
	DaemonSection *SectionStatus `json:"daemon_section"`
}

// Deleted reports whether the node was deleted.
func (n NodeInfo) Deleted() bool { return !n.DeletedAt.IsZero() }

// NodeList answers GET /api/v1/nodes.
type NodeList struct {
	Nodes []NodeInfo `json:"nodes"`
}

// CommandCreate is the body of POST /api/v1/nodes/{id}/commands.
type CommandCreate struct {
	Kind   string          `json:"kind"`
	Params json.RawMessage `json:"params,omitempty"`
}

// Command is something a node is asked to do once, with its latest status.
// Params are as the api shows them: the content of every file in them
// replaced by content_redacted and content_bytes.
type Command struct {
	ID     string `json:"id"`
	NodeID string `json:"node_id"`
	// MachineID is the machine the command is about, "" for none.
	MachineID string          `json:"machine_id,omitempty"`
	Kind      string          `json:"kind"`
	Params    json.RawMessage `json:"params,omitempty"`
	// State is PENDING, SENT, or one of the protocol's states.
	State     string          `json:"state"`
	Reason    string          `json:"reason,omitempty"`
	Message   string          `json:"message,omitempty"`
	Progress  json.RawMessage `json:"progress,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	SentAt    time.Time       `json:"sent_at,omitzero"`
}
