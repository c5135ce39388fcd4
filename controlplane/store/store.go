package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/protocol"
)

// Errors a caller tells apart with errors.Is.
var (
	ErrNotFound     = errors.New("not found")
	ErrExists       = errors.New("already exists")
	ErrTokenUsed    = errors.New("join token already used")
	ErrTokenRevoked = errors.New("join token revoked")
	ErrTokenExpired = errors.New("join token expired")
	ErrNodeDeleted  = errors.New("node deleted")
	// ErrCertReplaced: the node's certificate is no longer the one a renewal
	// replaces (another renewal or a join came first).
	ErrCertReplaced = errors.New("node certificate replaced")
	// ErrMACTaken: a MAC given for a machine belongs to another machine.
	ErrMACTaken = errors.New("MAC address belongs to another machine")
	// ErrNameTaken: the site already has a machine of that name.
	ErrNameTaken = errors.New("machine name taken in this site")
	// ErrNonceUsed: the boot nonce was consumed by another join.
	ErrNonceUsed = errors.New("boot nonce already used")
	// ErrNonceClaimed: the boot nonce was presented by a join with another
	// CSR, which waits for approval.
	ErrNonceClaimed = errors.New("boot nonce presented by another join")
	// ErrNoMachine: the machine a ramdisk join binds to is gone.
	ErrNoMachine = errors.New("machine not found")
)

// Command states the control plane adds before an agent reports one of the
// protocol's (RUNNING, SUCCEEDED, FAILED, UNSUPPORTED).
const (
	// CommandPending: enqueued, not yet written to a session of the node.
	CommandPending = "PENDING"
	// CommandSent: written to a session; the agent has not reported yet.
	CommandSent = "SENT"
)

// Approval policies of a site (Site.Approval): whether a machine's ramdisk
// joins on its boot nonce alone or waits for `machines approve`.
const (
	ApprovalAuto   = "auto"
	ApprovalManual = "manual"
)

// Site is a data-centre site. Tokens, nodes and machines belong to one.
type Site struct {
	Name string `json:"name"`
	// Approval is ApprovalAuto ("" when creating means auto) or
	// ApprovalManual.
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

// Token is a join token's record. The secret is not in it, only its hash.
type Token struct {
	ID   string     `json:"id"`
	Hash token.Hash `json:"-"`
	Pool string     `json:"pool"`
	Site string     `json:"site"`
	Role string     `json:"role"`
	// NodeID binds the token to one node id (the provisioned attestor): the
	// join must name it and gets it.
	NodeID string `json:"node_id,omitempty"`
	// MachineID names the machine whose deploy minted the token: the node
	// that joins with it is bound to that machine.
	MachineID    string    `json:"machine_id,omitempty"`
	AllowReclaim bool      `json:"allow_reclaim"`
	CreatedAt    time.Time `json:"created_at"`
	ExpiresAt    time.Time `json:"expires_at"`
	UsedAt       time.Time `json:"used_at,omitzero"`
	UsedBy       string    `json:"used_by,omitempty"`
	RevokedAt    time.Time `json:"revoked_at,omitzero"`
}

// Node is a joined agent's record.
type Node struct {
	ID       string          `json:"id"`
	Role     string          `json:"role"`
	Site     string          `json:"site"`
	Pool     string          `json:"pool"`
	SPIFFEID string          `json:"spiffe_id"`
	Claims   json.RawMessage `json:"claims"`
	// SystemUUID and TPMEKSHA256 are the claims a reclaim matches on;
	// placeholder values are stored empty.
	SystemUUID  string `json:"system_uuid,omitempty"`
	TPMEKSHA256 string `json:"tpm_ek_sha256,omitempty"`
	// TPMEKProven: the tpm attestor proved TPMEKSHA256 (it is not only a
	// claim). Such a node is reclaimed only by a join that proves the same
	// EK, or by a token bound to its id, never by its old key's proof.
	TPMEKProven bool `json:"tpm_ek_proven,omitempty"`
	// ProvenEKSHA256 is the TPM endorsement key the node's join proved by
	// credential activation (a tpm join; a ramdisk's discovery join on a
	// machine with an enrolled EK), "" when its join proved none. A ramdisk
	// keeps it here, not in TPMEKSHA256, so it takes part in no reclaim.
	ProvenEKSHA256 string    `json:"proven_ek_sha256,omitempty"`
	CertSerial     string    `json:"cert_serial"`
	CertNotAfter   time.Time `json:"cert_not_after"`
	// CertKeySHA256 is the hex SHA-256 of the current certificate's
	// SubjectPublicKeyInfo. PrevCertSerial is the certificate a renewal
	// replaced ("" after a join): the node holds it until it has stored the
	// renewal's answer, and may ask again with it for the same key.
	CertKeySHA256  string    `json:"cert_key_sha256,omitempty"`
	PrevCertSerial string    `json:"prev_cert_serial,omitempty"`
	State          string    `json:"state"`
	Cordoned       bool      `json:"cordoned"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	JoinedAt       time.Time `json:"joined_at"`
	DeletedAt      time.Time `json:"deleted_at,omitzero"`
	// SessionID is the node's open gateway session, 0 when it has none.
	SessionID     int64     `json:"session_id,omitempty"`
	DaemonVersion string    `json:"daemon_version,omitempty"`
	LastSeenAt    time.Time `json:"last_seen_at,omitzero"`
	SpecRevision  int64     `json:"spec_revision"`
	// DaemonArch is the GOARCH the node's bcd last reported (Hello).
	DaemonArch string `json:"daemon_arch,omitempty"`
	// DaemonTarget is the release the node should run (its spec's daemon
	// section), nil for none; set by a rollout.
	DaemonTarget *protocol.DaemonSection `json:"daemon_target,omitempty"`
}

// Deleted reports whether the node was deleted (its identity revoked).
func (n Node) Deleted() bool { return !n.DeletedAt.IsZero() }

// Session is one gateway session of a node.
type Session struct {
	ID              int64     `json:"id"`
	NodeID          string    `json:"node_id"`
	Role            string    `json:"role"`
	DaemonVersion   string    `json:"daemon_version"`
	DaemonArch      string    `json:"daemon_arch,omitempty"`
	BootID          string    `json:"boot_id"`
	ProtocolVersion int       `json:"protocol_version"`
	RemoteAddr      string    `json:"remote_addr"`
	ConnectedAt     time.Time `json:"connected_at"`
	DisconnectedAt  time.Time `json:"disconnected_at,omitzero"`
}

// Command is something a node is asked to do once, with its latest status.
type Command struct {
	ID     string `json:"id"`
	NodeID string `json:"node_id"`
	// MachineID is the machine the command is about, "" for none: its
	// creation and statuses go on the machine's timeline.
	MachineID string          `json:"machine_id,omitempty"`
	Kind      string          `json:"kind"`
	Params    json.RawMessage `json:"params,omitempty"`
	State     string          `json:"state"`
	Reason    string          `json:"reason,omitempty"`
	Message   string          `json:"message,omitempty"`
	Progress  json.RawMessage `json:"progress,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	SentAt    time.Time       `json:"sent_at,omitzero"`
}

// StatusUpdate is an agent's report on a command.
type StatusUpdate struct {
	CommandID string
	NodeID    string
	State     string
	Reason    string
	Message   string
	Progress  json.RawMessage
	Result    json.RawMessage
	At        time.Time
}

// Event is something an agent saw.
type Event struct {
	ID         int64           `json:"id"`
	NodeID     string          `json:"node_id"`
	SessionID  int64           `json:"session_id,omitempty"`
	Seq        uint64          `json:"seq"`
	Kind       string          `json:"kind"`
	Time       time.Time       `json:"time"`
	Level      string          `json:"level,omitempty"`
	Message    string          `json:"message,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
	ReceivedAt time.Time       `json:"received_at"`
}

// Admission is what a successful join writes, in one transaction.
type Admission struct {
	// TokenID is consumed (used_at, used_by) in the same transaction, so the
	// node is written only by the one join that consumed it. Empty for an
	// attestor that uses no token.
	TokenID string
	// Node is the node as the join leaves it.
	Node Node
	// Reclaim replaces the existing, not deleted, node Node.ID (same id, new
	// certificate) instead of inserting a new one.
	Reclaim bool
	// BootNonce, when set, is consumed in the same transaction (ErrNonceUsed
	// when another join consumed it first): the discovery attestor's
	// single use.
	BootNonce *token.Hash
	// Machine, when set, binds the node to that machine in the same
	// transaction: as its ramdisk node (role ramdisk, with Inventory as
	// the machine's inventory; ErrNoMachine when the machine is gone) or
	// as its installed node (role node; the machine's ramdisk node is
	// retired).
	Machine   string
	Inventory json.RawMessage
	// Retire, when set, is a node the join replaces (the machine's previous
	// ramdisk): it is deleted in the same transaction.
	Retire string
	// TPMEnrollment, when set, becomes the enrollment of its machine in the
	// same transaction: the EK a tpm join proved for a machine the
	// operator approved (ErrEKEnrolled, wrapped, when it is held
	// elsewhere meanwhile).
	TPMEnrollment *TPMEnrollment
	Now           time.Time
}

// CertRenewal is what a certificate renewal writes, in one write.
type CertRenewal struct {
	NodeID string
	// Replaces is the node's current certificate as the renewal read it: the
	// write happens only while it still is (ErrCertReplaced otherwise).
	Replaces string
	// Presented is the certificate the node renewed with; it becomes
	// PrevCertSerial.
	Presented string
	// Serial, NotAfter and KeySHA256 are the new certificate's.
	Serial    string
	NotAfter  time.Time
	KeySHA256 string
	At        time.Time
}

// Sites holds the sites.
type Sites interface {
	// CreateSite fails with ErrExists for a name taken.
	CreateSite(ctx context.Context, s Site) error
	GetSite(ctx context.Context, name string) (Site, error)
	ListSites(ctx context.Context) ([]Site, error)
	// SetSiteHTTPProxy sets (nil: removes) the site's proxy and moves its
	// spec revision on.
	SetSiteHTTPProxy(ctx context.Context, name string, p *protocol.HTTPProxySection, at time.Time) (Site, error)
}

// Tokens holds join tokens.
type Tokens interface {
	// CreateToken fails with ErrNotFound when the token's site does not exist.
	CreateToken(ctx context.Context, t Token) error
	GetToken(ctx context.Context, id string) (Token, error)
	ListTokens(ctx context.Context) ([]Token, error)
	// RevokeToken revokes a token; revoking it again is not an error.
	RevokeToken(ctx context.Context, id string, at time.Time) error
}

// Nodes holds nodes and admits joins.
type Nodes interface {
	// Admit writes a join's outcome: it consumes the token (ErrTokenUsed,
	// ErrTokenRevoked, ErrTokenExpired when it no longer can) and inserts or
	// reclaims the node (ErrExists for an id taken by a deleted node,
	// ErrNodeDeleted when the node to reclaim was deleted meanwhile).
	Admit(ctx context.Context, a Admission) error
	// RenewNodeCert makes a renewal's certificate the node's current one
	// (cert_serial, cert_not_after, cert_key_sha256, prev_cert_serial) in one
	// write. It fails with ErrNotFound, ErrNodeDeleted, or ErrCertReplaced
	// when the node's certificate is no longer r.Replaces.
	RenewNodeCert(ctx context.Context, r CertRenewal) error
	// GetNode returns a node, deleted or not.
	GetNode(ctx context.Context, id string) (Node, error)
	// FindNodeByClaims returns the node, not deleted, whose TPM EK hash or
	// system UUID is the one given (an empty value matches nothing; the EK
	// wins over the UUID), or ErrNotFound.
	FindNodeByClaims(ctx context.Context, systemUUID, tpmEKSHA256 string) (Node, error)
	// ListNodes returns the nodes that are not deleted, oldest first.
	ListNodes(ctx context.Context) ([]Node, error)
	// DeleteNode marks a node deleted, which revokes its identity, and fails
	// its open commands.
	DeleteNode(ctx context.Context, id string, at time.Time) error
	SetCordoned(ctx context.Context, id string, cordoned bool, at time.Time) error
	// SetNodeState moves a node from state from to state to; it reports
	// whether the node was in from.
	SetNodeState(ctx context.Context, id, from, to string, at time.Time) (bool, error)
}

// Sessions records gateway sessions.
type Sessions interface {
	// OpenSession records a session and makes it the node's current one.
	OpenSession(ctx context.Context, s Session) (int64, error)
	// CloseSession ends a session; the node is left without a current
	// session only if it was this one.
	CloseSession(ctx context.Context, id int64, at time.Time) error
	// CloseAllSessions ends every session still open, for a gateway that
	// starts after a crash.
	CloseAllSessions(ctx context.Context, at time.Time) error
	// GetSession returns a session, open or closed.
	GetSession(ctx context.Context, id int64) (Session, error)
	// AddEvent stores an event.
	AddEvent(ctx context.Context, e Event) error
	// AddEvents stores events in one transaction: all or none.
	AddEvents(ctx context.Context, es []Event) error
}

// Commands holds commands and their statuses.
type Commands interface {
	CreateCommand(ctx context.Context, c Command) error
	GetCommand(ctx context.Context, id string) (Command, error)
	// OpenCommands returns a node's commands that are not in a terminal
	// state, oldest first: what a session delivers.
	OpenCommands(ctx context.Context, nodeID string) ([]Command, error)
	// MarkSent records that a command was written to a session.
	MarkSent(ctx context.Context, id string, at time.Time) error
	// ApplyStatus records a status of a command of the node. It reports
	// false, and changes nothing, for an unknown command, a command of
	// another node, or one already in a terminal state.
	ApplyStatus(ctx context.Context, u StatusUpdate) (bool, error)
}

// Operators holds the operator token's hash.
type Operators interface {
	// EnsureOperatorToken stores h when there is no operator token yet and
	// reports whether it did.
	EnsureOperatorToken(ctx context.Context, h token.Hash, at time.Time) (bool, error)
	OperatorTokenHashes(ctx context.Context) ([]token.Hash, error)
}

// Store is all of it.
type Store interface {
	Sites
	Tokens
	Nodes
	Sessions
	Commands
	Operators
	Machines
	BootNonces
	Deployments
	TPMEnrollments
	PoolPolicies
	Releases
	Daemons
	Rollouts
	Images
	Pruner
	Close() error
}
