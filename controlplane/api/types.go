package api

import (
	"encoding/json"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// TokenCreate is the body of POST /api/v1/tokens.
type TokenCreate struct {
	Pool string `json:"pool"`
	Site string `json:"site"`
	Role string `json:"role"`
	// TTLSeconds is the token's lifetime; 0 means DefaultTokenTTL.
	TTLSeconds   int64  `json:"ttl_s,omitempty"`
	AllowReclaim bool   `json:"allow_reclaim,omitempty"`
	NodeID       string `json:"node_id,omitempty"`
}

// TokenInfo is a join token's record and its state: active, used, revoked
// or expired.
type TokenInfo struct {
	store.Token
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

// SiteCreate is the body of POST /api/v1/sites.
type SiteCreate struct {
	Name string `json:"name"`
	// Approval is store.ApprovalAuto (the default when empty) or
	// store.ApprovalManual: whether a machine's ramdisk joins on its boot
	// nonce alone or waits for POST /machines/{m}/approve.
	Approval string `json:"approval,omitempty"`
}

// HTTPProxySet is the body of PUT /api/v1/sites/{name}/http-proxy.
type HTTPProxySet = protocol.HTTPProxySection

// SiteList answers GET /api/v1/sites.
type SiteList struct {
	Sites []store.Site `json:"sites"`
}

// NodeInfo is a node and whether it has a session.
type NodeInfo struct {
	store.Node
	Connected bool `json:"connected"`
}

// NodeList answers GET /api/v1/nodes.
type NodeList struct {
	Nodes []NodeInfo `json:"nodes"`
}

// CommandCreate is the body of POST /api/v1/nodes/{id}/commands.
type CommandCreate struct {
	Kind   string          `json:"kind"`
	Params json.RawMessage `json:"params,omitempty"`
}

// Token states.
const (
	TokenActive  = "active"
	TokenUsed    = "used"
	TokenRevoked = "revoked"
	TokenExpired = "expired"
)

// TokenState says whether t can still be used at now, and if not why.
func TokenState(t store.Token, now time.Time) string {
	switch {
	case !t.RevokedAt.IsZero():
		return TokenRevoked
	case !t.UsedAt.IsZero():
		return TokenUsed
	case !now.Before(t.ExpiresAt):
		return TokenExpired
	}
	return TokenActive
}

// MachineBMCInput is a machine's BMC as an operator gives it.
type MachineBMCInput struct {
	Address  string `json:"address"`
	Port     int    `json:"port,omitempty"`
	Username string `json:"username"`
	// Password is the BMC password. On PUT …/bmc, null keeps the password
	// the machine has.
	Password    *string `json:"password,omitempty"`
	CipherSuite int     `json:"cipher_suite,omitempty"`
}

// MachineCreate is the body of POST /api/v1/machines.
type MachineCreate struct {
	Site string   `json:"site"`
	Name string   `json:"name,omitempty"`
	MACs []string `json:"macs"`
	// BootMode is ramdisk, local, or empty for none.
	BootMode string           `json:"boot_mode,omitempty"`
	BMC      *MachineBMCInput `json:"bmc,omitempty"`
	// Firmware is bios (the default when empty) or uefi: how the BMC is
	// told to PXE-boot the machine.
	Firmware string `json:"firmware,omitempty"`
}

// MachineFirmware is the body of PUT /api/v1/machines/{m}/firmware.
type MachineFirmware struct {
	// Firmware is bios or uefi.
	Firmware string `json:"firmware"`
}

// MachineBMCInfo is a machine's BMC as the api shows it: never the
// password, only whether there is one.
type MachineBMCInfo struct {
	Address     string `json:"address"`
	Port        int    `json:"port,omitempty"`
	Username    string `json:"username"`
	HasPassword bool   `json:"has_password"`
	CipherSuite int    `json:"cipher_suite,omitempty"`
}

// MachineInfo is a machine as the api shows it.
type MachineInfo struct {
	store.Machine
	// BMC shadows the record's: no password, has_password instead.
	BMC *MachineBMCInfo `json:"bmc,omitempty"`
	// SiteApproval is the site's policy (auto or manual).
	SiteApproval string `json:"site_approval"`
	// RamdiskConnected and NodeConnected say whether the machine's ramdisk
	// node and installed node have a session.
	RamdiskConnected bool `json:"ramdisk_connected"`
	NodeConnected    bool `json:"node_connected"`
	// CurrentDeployment is the machine's latest deployment (GET of one
	// machine only), its image URL without userinfo or query.
	CurrentDeployment *store.Deployment `json:"current_deployment,omitempty"`
}

// MachineList answers GET /api/v1/machines (inventories left out).
type MachineList struct {
	Machines []MachineInfo `json:"machines"`
}

// MachineBoot is the body of PUT /api/v1/machines/{m}/boot.
type MachineBoot struct {
	// Mode is ramdisk, local or none.
	Mode string `json:"mode"`
}

// MachineEventList answers GET /api/v1/machines/{m}/events.
type MachineEventList struct {
	Machine string               `json:"machine"`
	Events  []store.MachineEvent `json:"events"`
}

// MachinePower is the body of POST /api/v1/machines/{m}/power.
type MachinePower struct {
	// Action is on, off, cycle, reset or status.
	Action string `json:"action"`
}

// MachineBootdev is the body of POST /api/v1/machines/{m}/bootdev.
type MachineBootdev struct {
	Device     string `json:"device"`
	EFI        bool   `json:"efi,omitempty"`
	Persistent bool   `json:"persistent,omitempty"`
}

// DeployCreate is the body of POST /api/v1/machines/{m}/deploy: a new
// deployment of the machine, which the lifecycle runs from PXE boot to
// provisioned.
type DeployCreate struct {
	Image  protocol.DeployImage  `json:"image"`
	Target protocol.DeployTarget `json:"target,omitzero"`
	// After is what the ramdisk does once the disk is written: kexec (the
	// default when empty) or reboot; Cmdline is the installed kernel's
	// command line for kexec.
	After   string `json:"after,omitempty"`
	Cmdline string `json:"cmdline,omitempty"`
	// Pool is the installed OS's node pool; "" means DefaultPool.
	Pool string `json:"pool,omitempty"`
}

// DefaultPool is the pool an installed OS joins when the deploy names none.
const DefaultPool = "default"

// DeployCreated answers DeployCreate: the machine in the state its
// deployment starts in, and the deployment.
type DeployCreated struct {
	Machine    MachineInfo      `json:"machine"`
	Deployment store.Deployment `json:"deployment"`
}
