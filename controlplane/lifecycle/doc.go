// Package lifecycle runs machines' lifecycles: the state machine that takes a
// bare-metal machine from `better-compute machines deploy` to an installed OS
// that is a ready node, or to failed with the reason. Nothing outside the
// control plane drives a step; the testbed and operators only call the api.
//
// # States
//
//	registered   added, never deployed
//	pxe-booting  boot entry ramdisk (spec push to the site's agents), then
//	             bmc.bootdev pxe (efi for firmware uefi) and bmc.power cycle
//	             through a connected site agent of the machine's site, then
//	             the wait for a ramdisk that joins (discovery attestor) and
//	             connects; a machine without a BMC is waited for, powered by
//	             hand
//	ramdisk      the ramdisk is the deployment's: inventory
//	deploying    deploy.image, with a fresh node id and single-use token per
//	             attempt in its files (the api never shows them), after kexec
//	             or reboot; progress reaches the timeline as command.status
//	             events, thinned to one per 5 s
//	installing   deploy.image SUCCEEDED (the only way here); after reboot the
//	             boot entry is local at once; waiting for the installed OS to
//	             join as that node id (provisioned attestor) and be welcomed
//	provisioned  the node is ready; boot entry local; the deployment is over,
//	             but the node losing its session and coming back (a reboot
//	             shows as a new boot id) goes on the timeline
//	failed       with the reason; deploy starts again from here, as from
//	             provisioned
//
// A deploy of a machine whose ramdisk is connected starts at ramdisk.
//
// # Timeouts and retries
//
// Timeouts (serve --lifecycle-timeouts, ParseTimeouts): bmc 2m (a BMC
// command's terminal status, or a site agent to send it to), ramdisk 10m (the
// join after a power cycle; sized for TCG), inventory 2m (then deploy without
// it), deploy 1h, install 15m, grace 1m (a ramdisk whose session closed, which
// a gateway restart brings back within it).
//
// Retries, each bounded:
//
//	BMC command FAILED or unanswered   sent once more (BMCRetries), then failed
//	no ramdisk within the timeout       power-cycled again; at most 2 more power
//	                                    cycles (BootRetries), then failed "no
//	                                    ramdisk joined within …"
//	deploy.image FAILED                 sent once more (DeployRetries) to the
//	                                    ramdisk if it is connected, else through
//	                                    a new PXE boot; then failed with the
//	                                    ramdisk's reason and message
//	ramdisk retired, or its session     back to pxe-booting within the power
//	closed past the grace period,       cycle budget ("the ramdisk disconnected
//	deploy.image past its timeout,      during deploy.image …"), else failed
//	the installed OS not joining
//
// Cancel (machines cancel) fails the machine "cancelled by operator" and
// revokes the attempt's unused token; a command an agent runs is not called
// back and whatever it reports is ignored.
//
// # Ownership
//
// The controller is the only writer of a machine's status (state and reason,
// boot mode in effect, ramdisk node, installed node, deployment). The
// JoinService does not bind a node to a machine itself: it records the binding
// as an observation (MachineObserved.BoundRamdisk, BoundNode and BindSeq) and
// reports it (Bound); the next step of the machine adopts it into the status,
// in the transaction of that step, under a BindSeq check (plan.adopt). Whether
// a ramdisk is new is decided against the deployment's LeftRamdisk (the one it
// left behind when it PXE-booted), never by comparing records that mean two
// things. Deploy expects a spec the api normalized and validated
// (apitype.DeployCreate) and clears the operator's boot override: the
// deployment decides the boot mode from then on.
//
// # Running it
//
// Everything is in the store: the machine's state and a deployment record
// (step, deadline, attempts, the command waited for, the ramdisk and node
// ids), written with each step's commands, tokens and timeline events in one
// transaction under a version check. A restart of serve resumes every
// machine where it was; a deploy.image the ramdisk finished while the gateway
// was down is seen SUCCEEDED when its journal replays, and the gateway never
// sends a command the agent reported RUNNING again.
//
// Controller.Run steps machines on a pool of workers: every running
// deployment each Tick, and a machine at once when the gateway stores a
// status of one of its commands or a session of one of its nodes opens or
// closes, or when a node joins for it. A machine is stepped by one worker at
// a time, each step on its own deadline, and a step's error waits for the
// next tick: one machine's trouble never holds up another.
package lifecycle
