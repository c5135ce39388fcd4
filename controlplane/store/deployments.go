package store

import (
	"context"
	"errors"
	"time"

	"github.com/better-compute/bcd/protocol"
)

// Errors of deployments.
var (
	// ErrDeploymentActive: the machine runs a deployment that has not
	// finished; cancel it first.
	ErrDeploymentActive = errors.New("the machine runs a deployment that has not finished")
	// ErrConflict: the record changed since it was read (its version moved
	// on); read it again and decide again.
	ErrConflict = errors.New("changed meanwhile")
)

// DeploySpec is what a deployment installs: the image and the disk, what the
// ramdisk does once the disk is written, and the pool the installed OS joins.
// It holds no secret: each deploy.image attempt mints its own token.
type DeploySpec struct {
	Image  protocol.DeployImage  `json:"image"`
	Target protocol.DeployTarget `json:"target,omitzero"`
	// After is protocol.AfterKexec or protocol.AfterReboot: a deployment ends
	// with the installed OS running.
	After   string `json:"after"`
	Cmdline string `json:"cmdline,omitempty"`
	Pool    string `json:"pool"`
	// BCDVersion is the release whose bcd the ramdisk installs into the
	// root, "" when the image ships it; NodeAgent its binaries, one per
	// architecture, copied from the release when the deploy was made.
	BCDVersion string              `json:"bcd_version,omitempty"`
	NodeAgent  []NodeAgentBinary   `json:"node_agent,omitempty"`
	Seed       protocol.DeploySeed `json:"seed,omitzero"`
}

// NodeAgentBinary is one architecture's bcd of a release.
type NodeAgentBinary struct {
	Arch   string `json:"arch"`
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size,omitempty"`
}

// Params are the deploy.image params of the spec with files.
func (s DeploySpec) Params(files []protocol.DeployFile) protocol.DeployImageParams {
	return protocol.DeployImageParams{Image: s.Image, Target: s.Target, Files: files,
		After: protocol.DeployAfter{Action: s.After, Cmdline: s.Cmdline}}
}

// Deployment is one run of a machine's lifecycle, from `machines deploy` to
// provisioned or failed: the spec, where the controller is (Step, Deadline),
// what it has used of its retries, and what it waits for. Everything the
// controller needs to resume after a restart is here or in the machine.
type Deployment struct {
	ID        string     `json:"id"`
	MachineID string     `json:"machine_id"`
	Spec      DeploySpec `json:"spec"`
	// Step is the controller's step within the machine's state (the
	// lifecycle package names them); Deadline is when it gives up on it.
	Step     string    `json:"step"`
	Deadline time.Time `json:"deadline,omitzero"`
	// BootAttempts counts the power cycles (or, without a BMC, the boots
	// waited for); DeployAttempts the deploy.image commands sent and
	// DeployFailures those that reported FAILED; BMCAttempts the tries of
	// the current BMC command.
	BootAttempts   int `json:"boot_attempts"`
	DeployAttempts int `json:"deploy_attempts"`
	DeployFailures int `json:"deploy_failures,omitempty"`
	BMCAttempts    int `json:"bmc_attempts,omitempty"`
	// CommandID is the command the current step waits for.
	CommandID string `json:"command_id,omitempty"`
	// RamdiskNode is the ramdisk the deployment uses: set when the machine
	// enters ramdisk, "" while it PXE-boots.
	RamdiskNode string `json:"ramdisk_node,omitempty"`
	// LeftRamdisk is the ramdisk it left behind when it PXE-booted (the
	// machine's ramdisk at the deploy, or the one lost mid-way): a ramdisk
	// that joins is new when it is another node.
	LeftRamdisk string `json:"left_ramdisk,omitempty"`
	// NodeID and TokenID are the current deploy.image attempt's: the node
	// the installed OS joins as and the single-use token it joins with.
	NodeID  string `json:"node_id,omitempty"`
	TokenID string `json:"token_id,omitempty"`
	// LostAt is when the ramdisk's session was seen closed; zero while it is
	// connected.
	LostAt time.Time `json:"lost_at,omitzero"`
	// NodeSession and NodeBootID are the installed node's session and boot
	// as last seen, so that a provisioned machine's node going away and
	// coming back is on its timeline.
	NodeSession int64  `json:"node_session,omitempty"`
	NodeBootID  string `json:"node_boot_id,omitempty"`
	// Outcome is how it ended (provisioned, failed, cancelled), "" while it
	// runs; FinishedAt when.
	Outcome    string    `json:"outcome,omitempty"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Version grows with every write; a write of an older version fails
	// with ErrConflict.
	Version   int64     `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Finished reports whether the deployment has ended.
func (d Deployment) Finished() bool { return !d.FinishedAt.IsZero() }

// DeploymentChange is what a step of the lifecycle writes besides the
// deployment itself, in the same transaction: so a command is never sent
// without the deployment knowing it, nor a state entered without its event.
type DeploymentChange struct {
	// State, when set, moves the machine to it with Reason, and puts a
	// protocol.MachineEventState on its timeline (even for the state it is in: a
	// retry is a transition too).
	State, Reason string
	// BootMode, when set, is the machine's new boot mode; a change moves the
	// site's spec revision on.
	BootMode *string
	// Tokens are created, RevokeTokens revoked (a used token is left as it
	// is), Commands created (each with its "command" event).
	Tokens       []Token
	RevokeTokens []string
	Commands     []Command
	// Events go on the machine's timeline after the state event.
	Events []MachineEvent
	// Adopt, when set, writes the bindings the step adopted into the
	// machine's status, under the same check as AdoptBindings.
	Adopt *StatusChange
	// Finish, when set, ends the deployment with this outcome.
	Finish string
	At     time.Time
}

// Deployments holds machine deployments: what the lifecycle controller runs.
type Deployments interface {
	// StartDeployment stores d as the machine's deployment and applies ch,
	// in one transaction. It fails with ErrDeploymentActive when the
	// machine's current deployment has not finished, ErrNotFound when the
	// machine does not exist. The previous deployment's unused token is
	// revoked, and the operator's boot override cleared: the deploy hands
	// the boot mode to the lifecycle.
	StartDeployment(ctx context.Context, d Deployment, ch DeploymentChange) (Deployment, error)
	GetDeployment(ctx context.Context, id string) (Deployment, error)
	// OpenDeployments returns the deployments that have not finished,
	// oldest first.
	OpenDeployments(ctx context.Context) ([]Deployment, error)
	// AdvanceDeployment writes d and applies ch in one transaction, if the
	// stored deployment is still at d.Version (ErrConflict otherwise), and
	// returns it at its new version.
	AdvanceDeployment(ctx context.Context, d Deployment, ch DeploymentChange) (Deployment, error)
	// FindMachineByNode returns the machine whose installed node or ramdisk
	// node, adopted or only bound, is nodeID, or ErrNotFound.
	FindMachineByNode(ctx context.Context, nodeID string) (Machine, error)
	// ListMachinesInState returns every site's machines in state, oldest
	// first.
	ListMachinesInState(ctx context.Context, state string) ([]Machine, error)
	// ListMachinesWithPendingBindings returns the machines with bindings
	// the lifecycle has not adopted (Machine.PendingBindings).
	ListMachinesWithPendingBindings(ctx context.Context) ([]Machine, error)
}
