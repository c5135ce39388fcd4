package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/better-compute/bcd/controlplane/token"
)

// Machine states: the lifecycle the control plane runs (see the lifecycle
// package). A machine is registered until its first deployment; failed and
// provisioned are where a deployment ends, and both may start another.
const (
	MachineRegistered  = "registered"
	MachinePXEBooting  = "pxe-booting" // boot entry ramdisk, BMC bootdev pxe and power cycle, waiting for the ramdisk
	MachineRamdisk     = "ramdisk"     // the ramdisk joined: inventory
	MachineDeploying   = "deploying"   // deploy.image runs
	MachineInstalling  = "installing"  // deploy.image SUCCEEDED: waiting for the installed OS's node
	MachineProvisioned = "provisioned" // the installed OS's node is ready; boot entry local
	MachineFailed      = "failed"      // with the reason
)

// MachineBusy reports whether a machine in state runs a deployment: one
// that a new deployment must not replace without a cancel, and whose spec and
// BMC an operator must not change under it.
func MachineBusy(state string) bool {
	switch state {
	case MachinePXEBooting, MachineRamdisk, MachineDeploying, MachineInstalling:
		return true
	}
	return false
}

// Boot overrides an operator sets (MachineSpec.BootOverride): while no
// deployment runs, they win over the boot mode the lifecycle left.
const (
	// BootOverrideNone: the site agent ignores the machine's PXE requests.
	BootOverrideNone = "none"
)

// Firmware of a machine (Machine.Firmware): how its BMC is told to PXE-boot.
const (
	FirmwareBIOS = "bios"
	FirmwareUEFI = "uefi"
)

// Machine is a bare-metal server the control plane knows by its MACs. Its
// record has three parts, each with one writer:
//
//   - MachineSpec is what the operator sets, through machines.Service (the
//     api's only way to change a machine);
//   - MachineStatus is what the lifecycle decided: only the lifecycle
//     controller writes it (StartDeployment, AdvanceDeployment,
//     AdoptBindings);
//   - MachineObserved is what agents reported: the JoinService's bindings,
//     a site agent's boot steps, inventories. The lifecycle consumes the
//     bindings into the status (BindSeq against BindApplied).
//
// The parts are embedded so that the JSON of a machine stays flat.
type Machine struct {
	ID   string `json:"id"`
	Site string `json:"site"`
	MachineSpec
	MachineStatus
	MachineObserved
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// MachineSpec is what the operator sets.
type MachineSpec struct {
	// Name is optional and unique within the site.
	Name string `json:"name,omitempty"`
	// MACs are lowercase and colon-separated, each unique across machines.
	MACs []string `json:"macs"`
	// BMC is nil for a machine without one.
	BMC *MachineBMC `json:"bmc,omitempty"`
	// Firmware is FirmwareBIOS ("" when creating means bios) or
	// FirmwareUEFI: bmc.bootdev pxe asks for an EFI boot on uefi.
	Firmware string `json:"firmware"`
	// Approved lets its ramdisk join in a site with manual approval.
	Approved bool `json:"approved"`
	// BootOverride is the operator's boot mode: protocol.BootRamdisk,
	// protocol.BootLocal, BootOverrideNone, or "" to leave it to the
	// lifecycle. It wins over MachineStatus.BootMode while no deployment
	// runs; a deployment clears it (the deploy hands the boot mode to the
	// lifecycle).
	BootOverride string `json:"boot_override,omitempty"`
	// TPMEKSHA256 is the SHA-256 of its TPM's endorsement key when one is
	// enrolled (its TPMEnrollment), with TPMPool the pool its tpm join
	// enters ("": the default pool).
	TPMEKSHA256 string `json:"tpm_ek_sha256,omitempty"`
	TPMPool     string `json:"tpm_pool,omitempty"`
}

// MachineStatus is what the lifecycle decided.
type MachineStatus struct {
	State          string    `json:"state"`
	StateReason    string    `json:"state_reason,omitempty"`
	StateChangedAt time.Time `json:"state_changed_at"`
	// BootMode is the boot mode the lifecycle put in effect:
	// protocol.BootRamdisk, protocol.BootLocal or "" (none).
	// EffectiveBootMode says what the site agent is told.
	BootMode string `json:"boot_mode,omitempty"`
	// RamdiskNode is the node its ramdisk joined as on its latest boot, ""
	// once its installed OS joined (which retires the ramdisk).
	RamdiskNode string `json:"ramdisk_node,omitempty"`
	// Node is the node its installed OS joined as.
	Node string `json:"node,omitempty"`
	// Deployment is its latest deployment (dep_…), "" before the first.
	Deployment string `json:"deployment,omitempty"`
	// BindApplied is the MachineObserved.BindSeq whose bindings RamdiskNode
	// and Node reflect.
	BindApplied int64 `json:"-"`
}

// MachineObserved is what agents reported about the machine.
type MachineObserved struct {
	// Inventory is the latest hardware report: the claims of its ramdisk's
	// join, or the result of an inventory command.
	Inventory   json.RawMessage `json:"inventory,omitempty"`
	InventoryAt time.Time       `json:"inventory_at,omitzero"`
	// LastBoot is the latest machine.booted step a site agent reported.
	LastBootStage string    `json:"last_boot_stage,omitempty"`
	LastBootAt    time.Time `json:"last_boot_at,omitzero"`
	// BoundRamdisk and BoundNode are the nodes the JoinService last bound
	// to the machine (a ramdisk join; an installed OS's join, which clears
	// BoundRamdisk); BindSeq grows with each binding. The lifecycle adopts
	// them into MachineStatus.
	BoundRamdisk string `json:"-"`
	BoundNode    string `json:"-"`
	BindSeq      int64  `json:"-"`
}

// Busy reports whether the machine runs a deployment.
func (m Machine) Busy() bool { return MachineBusy(m.State) }

// PendingBindings reports whether the JoinService bound a node the
// lifecycle has not adopted yet.
func (m Machine) PendingBindings() bool { return m.BindSeq != m.BindApplied }

// EffectiveBootMode is what the site agent is told for the machine's MACs:
// protocol.BootRamdisk, protocol.BootLocal or "" (ignore its PXE requests).
// The operator's override wins while no deployment runs.
func (m Machine) EffectiveBootMode() string {
	switch {
	case m.Busy() || m.BootOverride == "":
		return m.BootMode
	case m.BootOverride == BootOverrideNone:
		return ""
	}
	return m.BootOverride
}

// MachineBMC is a machine's BMC. The password is never encoded: nothing
// that prints a Machine as JSON can leak it.
type MachineBMC struct {
	Address     string `json:"address"`
	Port        int    `json:"port,omitempty"`
	Username    string `json:"username"`
	Password    string `json:"-"`
	CipherSuite int    `json:"cipher_suite,omitempty"`
}

// MachineEvent is one entry of a machine's timeline. Its Kind is one of the
// kinds listed in protocol (machineevents.go).
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

// MachineUpdate is a change to a machine's spec; nil fields stay as they
// are. Only machines.Service writes one.
type MachineUpdate struct {
	// BootOverride, when set, is the operator's boot mode (see
	// MachineSpec.BootOverride).
	BootOverride *string
	// Firmware, when set, is FirmwareBIOS or FirmwareUEFI.
	Firmware *string
	// SetBMC replaces the BMC with BMC (nil removes it).
	SetBMC bool
	BMC    *MachineBMC
	// SetTPM replaces the machine's TPM enrollment with TPM (nil removes
	// it); TPM.MachineID and TPM.Site are the machine's. An EK another
	// machine or an allow-list entry holds is *EKConflictError.
	SetTPM  bool
	TPM     *TPMEnrollment
	Approve bool
	// IfIdle refuses the change with a *BusyError when the machine's
	// deployment has not finished, checked in the transaction that writes
	// it.
	IfIdle bool
	// Event goes on the machine's timeline with the change.
	Event MachineEvent
	At    time.Time
}

// ErrMachineBusy: the machine runs a deployment; cancel it first.
var ErrMachineBusy = errors.New("the machine runs a deployment")

// BusyError says which deployment a refused change would run under. It
// wraps ErrMachineBusy.
type BusyError struct {
	Machine, State, Deployment string
}

func (e *BusyError) Error() string {
	return "machine " + e.Machine + " is " + e.State + " (" + e.Deployment + "): cancel it first (better-compute machines cancel " + e.Machine + ")"
}

func (e *BusyError) Unwrap() error { return ErrMachineBusy }

// StatusChange is the lifecycle's write of a machine's status outside a
// deployment step: the bindings it adopted.
type StatusChange struct {
	// BindSeq is the MachineObserved.BindSeq the change adopts: the write
	// fails with ErrConflict when another binding arrived meanwhile.
	BindSeq     int64
	RamdiskNode string
	Node        string
	At          time.Time
}

// ConflictError says which MAC or name of a new machine is taken, and by
// which machine. It wraps ErrMACTaken or ErrNameTaken.
type ConflictError struct {
	// Value is the MAC or the name.
	Value string
	// Machine holds it; "" for a MAC given twice.
	Machine string
	Err     error
}

func (e *ConflictError) Error() string {
	switch {
	case e.Machine == "":
		return e.Value + " is given twice"
	case errors.Is(e.Err, ErrNameTaken):
		return "the site already has a machine named " + e.Value + " (" + e.Machine + ")"
	}
	return e.Value + " belongs to machine " + e.Machine
}

func (e *ConflictError) Unwrap() error { return e.Err }

// Machines holds machines and their timelines.
type Machines interface {
	// CreateMachine fails with ErrNotFound for a missing site, ErrMACTaken
	// or ErrNameTaken (wrapped with the MAC or name at fault). It moves the
	// site's spec revision on.
	CreateMachine(ctx context.Context, m Machine) error
	GetMachine(ctx context.Context, id string) (Machine, error)
	FindMachineByMAC(ctx context.Context, mac string) (Machine, error)
	// FindMachinesByName returns the machines of that name in every site.
	FindMachinesByName(ctx context.Context, name string) ([]Machine, error)
	// ListMachines lists a site's machines ("": every site's), oldest first.
	ListMachines(ctx context.Context, site string) ([]Machine, error)
	// CountMachinesByState counts every site's machines by lifecycle state
	// (a state no machine is in is absent): one query, for the metrics
	// endpoint, without reading the machines.
	CountMachinesByState(ctx context.Context) (map[string]int, error)
	// UpdateMachine applies u to the machine's spec and returns the
	// machine; a change of boot override or BMC moves the site's spec
	// revision on. With u.IfIdle a machine whose deployment has not
	// finished refuses (*BusyError).
	UpdateMachine(ctx context.Context, id string, u MachineUpdate) (Machine, error)
	// DeleteMachine removes a machine, its MACs and its timeline, and moves
	// the site's spec revision on. With ifIdle a machine whose deployment
	// has not finished refuses (*BusyError).
	DeleteMachine(ctx context.Context, id string, ifIdle bool) error
	// AdoptBindings writes the bindings the lifecycle adopted into the
	// machine's status (ErrConflict when ch.BindSeq is no longer the
	// machine's).
	AdoptBindings(ctx context.Context, id string, ch StatusChange) (Machine, error)
	// RecordBoot attaches a boot step a site agent of site reported for mac
	// to the machine with that MAC in that site, and puts ev on its
	// timeline. It returns the machine's id, or ErrNotFound when no machine
	// of the site has the MAC.
	RecordBoot(ctx context.Context, site, mac, stage string, ev MachineEvent) (string, error)
	// RecordBoots is RecordBoot for many steps of site in one transaction (a
	// storm's events arrive in batches). ids[i] is step i's machine, "" when no
	// machine of the site has its MAC; an error stores none of them.
	RecordBoots(ctx context.Context, site string, steps []BootStep) (ids []string, err error)
	AddMachineEvent(ctx context.Context, e MachineEvent) error
	// MachineEvents returns the latest limit events of a machine, oldest
	// first.
	MachineEvents(ctx context.Context, machineID string, limit int) ([]MachineEvent, error)
}

// BootNonce is a nonce a site agent minted for a MAC and put on the
// machine's ramdisk command line. Only its hash is kept.
type BootNonce struct {
	Hash token.Hash `json:"-"`
	MAC  string     `json:"mac"`
	Site string     `json:"site"`
	// SiteNode is the site agent that reported it.
	SiteNode string `json:"site_node"`
	// MachineID is the machine that had the MAC when the nonce arrived, ""
	// for none.
	MachineID string    `json:"machine_id,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// CSRSHA256 is the CSR of the first join that presented the nonce and
	// was deferred for approval: only that join may use it afterwards.
	CSRSHA256  string    `json:"csr_sha256,omitempty"`
	DeferredAt time.Time `json:"deferred_at,omitzero"`
	UsedAt     time.Time `json:"used_at,omitzero"`
	UsedBy     string    `json:"used_by,omitempty"`
	// Event, when set, is the machine's timeline entry for the nonce: AddBootNonce
	// stores it in the transaction that adds the nonce, so a nonce is never
	// stored without it (a replay of the event finds the nonce and adds nothing).
	Event *MachineEvent `json:"-"`
}

// BootNonces holds boot nonces.
type BootNonces interface {
	// AddBootNonce stores a nonce, and its Event when set; the same hash again
	// changes nothing and reports false (a replayed event). Nonces that expired
	// a day ago go.
	AddBootNonce(ctx context.Context, n BootNonce) (bool, error)
	// AddBootNonces stores the nonces a site agent of site reported, in order
	// and in one transaction (a flood of script GETs arrives in batches): each
	// as AddBootNonce would, except that its Site is site and its MachineID the
	// machine of site with its MAC ("" for none; what the caller set is
	// ignored), and its Event, that MachineID filled in, is stored only when
	// there is such a machine. added[i] reports whether nonce i was new (false
	// for one already stored, or earlier in ns). An error, a nonce without its
	// times among them, stores none of them. Nonces that expired a day before
	// the latest of ns was created go.
	AddBootNonces(ctx context.Context, site string, ns []BootNonce) (added []bool, err error)
	GetBootNonce(ctx context.Context, h token.Hash) (BootNonce, error)
	// DeferBootNonce binds an unused nonce to the CSR of a join that waits
	// for approval. It reports whether this was the first deferral, and
	// fails with ErrNonceClaimed when another CSR holds the nonce and
	// ErrNonceUsed when it was consumed.
	DeferBootNonce(ctx context.Context, h token.Hash, csrSHA256 string, at time.Time) (bool, error)
}

// BootStep is one boot step a site agent reported: RecordBoots's unit.
type BootStep struct {
	MAC, Stage string
	// Event goes on the machine's timeline; its MachineID is filled in.
	Event MachineEvent
}
