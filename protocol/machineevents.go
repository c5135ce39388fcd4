package protocol

// Kinds of the entries of a machine's timeline that an operator's change
// writes (`better-compute machines events` shows them beside the agents'
// events and the lifecycle's).
const (
	MachineEventAdded    = "machine.added"     // the machine was added, with its MACs
	MachineEventBootMode = "machine.boot_mode" // the operator's boot mode changed
	MachineEventBMC      = "machine.bmc"       // the BMC was set or removed
	MachineEventFirmware = "machine.firmware"  // the firmware changed
	MachineEventApproved = "machine.approved"  // the operator approved its ramdisk's join
)
