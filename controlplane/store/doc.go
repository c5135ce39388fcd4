// Package store keeps the control plane's state: sites, join tokens, nodes,
// gateway sessions, commands and their statuses, events, machines and their
// timelines, boot nonces, TPM enrollments, pool policies, the image
// catalog, and the operator token's hash.
//
// The rest of the control plane depends on the small interfaces here (Sites,
// Tokens, Nodes, Sessions, Commands, Operators, Machines, BootNonces,
// Deployments, TPMEnrollments, PoolPolicies, Images), never on SQL, so a
// deployment that outgrows one machine can put several api and gateway
// processes on another implementation (PostgreSQL) without touching them.
// This package holds only the records, the interfaces, their errors and
// constants; an implementation is a package of its own (store/sqlite is
// the one `better-compute serve` runs on), so depending on the interfaces
// links no database driver.
//
// # What every implementation guarantees
//
// A join token is consumed once: of any number of concurrent joins with one
// token exactly one is admitted, the others get ErrTokenUsed. A boot nonce
// is consumed once the same way, with the write of the ramdisk's node and
// its binding to its machine. A command about a machine and each of its
// statuses go on the machine's timeline with the write that records them. A
// lifecycle step writes its deployment, the machine's state with its
// "state" event, and the commands, tokens and events it makes at once
// (StartDeployment, AdvanceDeployment), and a write from a stale version of
// a deployment is ErrConflict.
//
// A machine's record has one writer per part (see Machine): the spec is
// written only through UpdateMachine (machines.Service), which refuses a
// busy machine in the same transaction when asked (IfIdle, *BusyError); the
// status only by the lifecycle's StartDeployment, AdvanceDeployment and
// AdoptBindings; the observed part by agents' reports (Admit records a
// join's binding and moves BindSeq on, RecordBoot, an inventory's status).
// An adoption names the BindSeq it read and is ErrConflict when another
// binding came meanwhile. Times are kept at least to the millisecond
// and come back in UTC. store/storetest checks all of it through these
// interfaces alone; every implementation runs it (storetest.Run).
package store
