package apitype

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// Machine states (MachineInfo.State): the lifecycle the control plane runs.
// A machine is registered until its first deployment; failed and
// provisioned are where a deployment ends, and both may start another.
const (
	MachineRegistered  = "registered"
	MachinePXEBooting  = "pxe-booting"
	MachineRamdisk     = "ramdisk"
	MachineDeploying   = "deploying"
	MachineInstalling  = "installing"
	MachineProvisioned = "provisioned"
	MachineFailed      = "failed"
)

// Firmware of a machine: how its BMC is told to PXE-boot it.
const (
	FirmwareBIOS = "bios"
	FirmwareUEFI = "uefi"
)

// DefaultPool is the pool an installed OS joins when the deploy names none.
const DefaultPool = "default"

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
	// Firmware is FirmwareBIOS (the default when empty) or FirmwareUEFI.
	Firmware string `json:"firmware,omitempty"`
}

// MachineFirmware is the body of PUT /api/v1/machines/{m}/firmware.
type MachineFirmware struct {
	// Firmware is bios or uefi.
	Firmware string `json:"firmware"`
}

// MachineBoot is the body of PUT /api/v1/machines/{m}/boot.
type MachineBoot struct {
	// Mode is ramdisk, local or none.
	Mode string `json:"mode"`
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

// MachineBMCInfo is a machine's BMC as the api shows it: never the
// password, only whether there is one.
type MachineBMCInfo struct {
	Address     string `json:"address"`
	Port        int    `json:"port,omitempty"`
	Username    string `json:"username"`
	HasPassword bool   `json:"has_password"`
	CipherSuite int    `json:"cipher_suite,omitempty"`
}

// MachineInfo is a bare-metal server as the api shows it. The field order
// is the order of the JSON the api has always written (bmc after
// updated_at).
type MachineInfo struct {
	ID string `json:"id"`
	// Name is optional and unique within the site.
	Name string `json:"name,omitempty"`
	Site string `json:"site"`
	// MACs are lowercase and colon-separated.
	MACs []string `json:"macs"`
	// BootMode is what the site agent is told: ramdisk, local or "" (it
	// does not answer the machine's PXE requests). BootOverride, when set, is
	// the operator's (ramdisk, local or none), which wins while no deployment
	// runs; a deploy clears it.
	BootMode       string    `json:"boot_mode,omitempty"`
	BootOverride   string    `json:"boot_override,omitempty"`
	Firmware       string    `json:"firmware"`
	State          string    `json:"state"`
	StateReason    string    `json:"state_reason,omitempty"`
	StateChangedAt time.Time `json:"state_changed_at"`
	// RamdiskNode is the node its ramdisk joined as on its latest boot.
	RamdiskNode string `json:"ramdisk_node,omitempty"`
	// Node is the node its installed OS joined as.
	Node string `json:"node,omitempty"`
	// Deployment is its latest deployment (dep_…), "" before the first.
	Deployment string `json:"deployment,omitempty"`
	// Inventory is the latest hardware report (left out of lists).
	Inventory   json.RawMessage `json:"inventory,omitempty"`
	InventoryAt time.Time       `json:"inventory_at,omitzero"`
	// Approved lets its ramdisk join in a site with manual approval, and
	// its TPM's join when its EK is not enrolled yet.
	Approved bool `json:"approved"`
	// TPMEKSHA256 is its TPM's enrolled endorsement key (SHA-256 of the
	// PKIX DER), with TPMPool the pool its tpm join enters ("": the
	// default pool).
	TPMEKSHA256 string `json:"tpm_ek_sha256,omitempty"`
	TPMPool     string `json:"tpm_pool,omitempty"`
	// LastBootStage is the latest machine.booted step a site agent
	// reported, at LastBootAt.
	LastBootStage string    `json:"last_boot_stage,omitempty"`
	LastBootAt    time.Time `json:"last_boot_at,omitzero"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
	// BMC is nil for a machine without one.
	BMC *MachineBMCInfo `json:"bmc,omitempty"`
	// SiteApproval is the site's policy (auto or manual).
	SiteApproval string `json:"site_approval"`
	// RamdiskConnected and NodeConnected say whether the machine's ramdisk
	// node and installed node have a session.
	RamdiskConnected bool `json:"ramdisk_connected"`
	NodeConnected    bool `json:"node_connected"`
	// CurrentDeployment is the machine's latest deployment (GET of one
	// machine only).
	CurrentDeployment *Deployment `json:"current_deployment,omitempty"`
}

// MachineList answers GET /api/v1/machines (inventories left out).
type MachineList struct {
	Machines []MachineInfo `json:"machines"`
}

// MachineEvent is one entry of a machine's timeline.
type MachineEvent struct {
	ID        int64           `json:"id"`
	MachineID string          `json:"machine_id"`
	Time      time.Time       `json:"time"`
	Kind      string          `json:"kind"`
	Message   string          `json:"message,omitempty"`
	NodeID    string          `json:"node_id,omitempty"`
	CommandID string          `json:"command_id,omitempty"`
	Data      json.RawMessage `json:"data,omitempty"`
}

// MachineEventList answers GET /api/v1/machines/{m}/events.
type MachineEventList struct {
	Machine string         `json:"machine"`
	Events  []MachineEvent `json:"events"`
}

// DeployCreate is the body of POST /api/v1/machines/{m}/deploy: a new
// deployment of the machine, which the lifecycle runs from PXE boot to
// provisioned.
type DeployCreate struct {
	// Image is the image to install; ImageName instead names an entry of
	// the image catalog (POST /api/v1/images), which the api resolves and
	// copies into the deployment. Give one of them.
	Image     protocol.DeployImage  `json:"image,omitzero"`
	ImageName string                `json:"image_name,omitempty"`
	Target    protocol.DeployTarget `json:"target,omitzero"`
	// After is what the ramdisk does once the disk is written: kexec (the
	// default when empty) or reboot; Cmdline is the installed kernel's
	// command line for kexec.
	After   string `json:"after,omitempty"`
	Cmdline string `json:"cmdline,omitempty"`
	// Pool is the installed OS's node pool; "" means DefaultPool.
	Pool string `json:"pool,omitempty"`
	// BCDVersion names a release (better-compute releases add) whose bcd
	// the ramdisk installs into the root, for an image that does not ship
	// it; "" means the control plane's default (serve
	// --deploy-bcd-version), and with none the image must ship bcd.
	BCDVersion string `json:"bcd_version,omitempty"`
	// Seed is the cloud-init NoCloud seed the deploy writes (see Seed).
	Seed Seed `json:"seed,omitzero"`
}

// Normalize fills in a deploy's defaults: after kexec (a deployment ends
// with the installed OS running) and DefaultPool. With Validate it is the one
// place a deploy's defaults and checks live: the api calls both once, at its
// edge, and the CLI calls them before it sends, to answer a bad flag with a
// usage error.
func (d *DeployCreate) Normalize() {
	if d.After == "" {
		d.After = protocol.AfterKexec
	}
	if d.Pool == "" {
		d.Pool = DefaultPool
	}
	d.Image.SHA256 = strings.ToLower(d.Image.SHA256)
}

// Validate checks a normalized deploy as its deploy.image will be checked,
// without the files each attempt adds. The error names the field at fault.
//
// A deploy by ImageName is checked without its image, which only the api
// knows: it resolves the name (Resolve) and validates again.
func (d DeployCreate) Validate() error {
	if d.ImageName != "" {
		if d.Image != (protocol.DeployImage{}) {
			return fmt.Errorf("image_name %q and image: the catalog entry has the image's url, sha256, size and format: give image_name or image, not both", human.Short(d.ImageName))
		}
		if !protocol.ValidName(d.ImageName) {
			return fmt.Errorf("image_name %q: %s", human.Short(d.ImageName), protocol.NameRule)
		}
		// The rest is checked with a stand-in for the image.
		d.Image = protocol.DeployImage{URL: "https://catalog.invalid/", SHA256: strings.Repeat("0", 64), Size: 1}
	}
	if d.After != protocol.AfterKexec && d.After != protocol.AfterReboot {
		return fmt.Errorf("after %q: a deployment ends with the installed OS running: want kexec or reboot", human.Short(d.After))
	}
	if !protocol.ValidName(d.Pool) {
		return fmt.Errorf("pool %q: %s", human.Short(d.Pool), protocol.NameRule)
	}
	if d.BCDVersion != "" && !ValidVersion(d.BCDVersion) {
		return fmt.Errorf("bcd_version %q: want a release version such as 1.4.0", human.Short(d.BCDVersion))
	}
	if err := d.Seed.Validate(); err != nil {
		return err
	}
	p := protocol.DeployImageParams{Image: d.Image, Target: d.Target, After: protocol.DeployAfter{Action: d.After, Cmdline: d.Cmdline}}
	return p.Validate()
}

// Resolve is the deploy by catalog name with the entry's image: what the
// api validates and stores, the same deploy as one that gave the image.
func (d DeployCreate) Resolve(img protocol.DeployImage) DeployCreate {
	d.Image, d.ImageName = img, ""
	return d
}

// DeploySpec is what a deployment installs.
type DeploySpec struct {
	// Image's URL is shown without userinfo, query or fragment, which may
	// hold a credential.
	Image  protocol.DeployImage  `json:"image"`
	Target protocol.DeployTarget `json:"target,omitzero"`
	// After is kexec or reboot.
	After   string `json:"after"`
	Cmdline string `json:"cmdline,omitempty"`
	Pool    string `json:"pool"`
	// BCDVersion is the release whose bcd the deploy installs, "" when the
	// image ships it; Seed the cloud-init seed.
	BCDVersion string `json:"bcd_version,omitempty"`
	Seed       Seed   `json:"seed,omitzero"`
}

// Deployment is one run of a machine's lifecycle, from `machines deploy` to
// provisioned or failed: where the controller is and what it has used of
// its retries.
type Deployment struct {
	ID        string     `json:"id"`
	MachineID string     `json:"machine_id"`
	Spec      DeploySpec `json:"spec"`
	// Step is the controller's step within the machine's state; Deadline
	// is when it gives up on it.
	Step           string    `json:"step"`
	Deadline       time.Time `json:"deadline,omitzero"`
	BootAttempts   int       `json:"boot_attempts"`
	DeployAttempts int       `json:"deploy_attempts"`
	DeployFailures int       `json:"deploy_failures,omitempty"`
	BMCAttempts    int       `json:"bmc_attempts,omitempty"`
	// CommandID is the command the current step waits for.
	CommandID string `json:"command_id,omitempty"`
	// RamdiskNode is the ramdisk the deployment uses, "" while it
	// PXE-boots; LeftRamdisk the one it left behind then (a ramdisk that
	// joins is new when it is another node).
	RamdiskNode string `json:"ramdisk_node,omitempty"`
	LeftRamdisk string `json:"left_ramdisk,omitempty"`
	// NodeID and TokenID are the current deploy.image attempt's node and
	// join token.
	NodeID  string `json:"node_id,omitempty"`
	TokenID string `json:"token_id,omitempty"`
	// LostAt is when the ramdisk's session was seen closed.
	LostAt      time.Time `json:"lost_at,omitzero"`
	NodeSession int64     `json:"node_session,omitempty"`
	NodeBootID  string    `json:"node_boot_id,omitempty"`
	// Outcome is how it ended (provisioned, failed, cancelled), "" while
	// it runs; FinishedAt when.
	Outcome    string    `json:"outcome,omitempty"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	Version    int64     `json:"version"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// Finished reports whether the deployment has ended.
func (d Deployment) Finished() bool { return !d.FinishedAt.IsZero() }

// DeployCreated answers DeployCreate: the machine in the state its
// deployment starts in, and the deployment.
type DeployCreated struct {
	Machine    MachineInfo `json:"machine"`
	Deployment Deployment  `json:"deployment"`
}

// Seed is a deploy's cloud-init NoCloud seed (protocol.DeploySeed).
type Seed = protocol.DeploySeed

// Bounds and checks of a seed, for the CLI.
const MaxSeedUserData = protocol.MaxSeedUserData

// ParseSSHAuthorizedKeys reads an authorized_keys-style file
// (protocol.ParseSSHAuthorizedKeys).
func ParseSSHAuthorizedKeys(b []byte) ([]string, error) { return protocol.ParseSSHAuthorizedKeys(b) }

// ValidVersion accepts a release version (protocol.ValidVersion).
func ValidVersion(v string) bool { return protocol.ValidVersion(v) }
