package protocol

// Event kinds: the one list. An agent sends an Event with a Kind; the control
// plane writes each entry of a machine's timeline with a Kind
// (`better-compute machines events` shows them all). Every kind anyone
// writes or compares is one of these constants.

// Kinds of the Events an agent sends over its session.
const (
	// EventLog carries one of an agent's log lines: Level and Message as
	// logged, Data the line's attributes as a JSON object. The ramdisk sends
	// its log this way once it has joined, since nobody reads its console.
	// It stays on the node's events; it is never on a machine's timeline.
	EventLog = "log"
	// The kinds a site agent sends; the control plane puts both on the
	// machine's timeline under the same kind.
	EventMachineBooted = "machine.booted" // MachineBooted: the site served a machine
	EventBootNonce     = "boot.nonce"     // BootNonce: the site minted a nonce for a MAC
	EventBootRefused   = "boot.refused"   // BootRefused: the site refused a nonce or witness (spoofing?)
)

// Kinds of the entries of a machine's timeline that an operator's change
// writes (the api).
const (
	MachineEventAdded    = "machine.added"     // the machine was added, with its MACs
	MachineEventBootMode = "machine.boot_mode" // the operator's boot mode changed
	MachineEventBMC      = "machine.bmc"       // the BMC was set or removed
	MachineEventFirmware = "machine.firmware"  // the firmware changed
	MachineEventApproved = "machine.approved"  // the operator approved its ramdisk's join
	MachineEventTPM      = "machine.tpm"       // its TPM endorsement key was enrolled or revoked
)

// Kinds of the entries of a machine's timeline that the store writes itself,
// in the transaction of the change they record.
const (
	MachineEventCommand       = "command"        // a command about the machine was enqueued
	MachineEventCommandStatus = "command.status" // an agent reported on it
	MachineEventJoin          = "join"           // a node joined for the machine
	// MachineEventState is a lifecycle transition: the machine's new state
	// and why (data: from, to, reason, deployment).
	MachineEventState = "state"
)

// Kinds of the entries of a machine's timeline that the discovery and tpm
// attestors write when a join matches the machine but is not admitted.
const (
	MachineEventJoinRefused  = "join.refused"  // refused: its boot nonce was used or expired, MAC or site disagree, or the machine's enrolled TPM was not proven
	MachineEventJoinDeferred = "join.deferred" // waits for the operator's approval (MachineEventApproved)
	// MachineEventSpoofed is a second ramdisk claiming a machine that
	// already has a live one, or a join without the minting site's witness.
	MachineEventSpoofed = "join.spoofed"
)

// Kinds of the entries of a machine's timeline that the lifecycle controller
// writes besides its state transitions (MachineEventState).
const (
	MachineEventNote       = "lifecycle"   // what a step waits for, a retry, a ramdisk lost and back
	MachineEventDeployDone = "deploy.done" // deploy.image SUCCEEDED: bytes, seconds, MB/s
	// MachineEventDeployHeld: deploy.image (the installed OS's join token)
	// was not sent, as the ramdisk did not prove the machine's enrolled TPM
	// endorsement key; the machine PXE-boots the ramdisk again.
	MachineEventDeployHeld  = "deploy.held"
	MachineEventNodeReady   = "node.ready"   // the installed OS's node is ready: provisioned
	MachineEventNodeOffline = "node.offline" // a provisioned machine's node lost its session
	MachineEventNodeBack    = "node.back"    // … and has one again (data: reboot, boot_id)
)
