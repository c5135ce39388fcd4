// Package labfault holds the faults a lab release of bcd is built with, to prove
// that self-update survives a bad release (spec "Self-update" steps 3 and 4):
//
//   - labfault_nowelcome: bcd node and bcd site start as usual but never dial the
//     gateway, so an update to this build never reaches its first Welcome and
//     the deadline swaps back;
//   - labfault_crash: bcd node and bcd site exit 1 at once, before anything, so
//     under systemd the build crash-loops until bcd-rollback.service restores
//     the previous slot.
//
// Only the lab's test releases are built with these tags; a release for real
// hosts is built without them, and then both faults are constant false and
// compiled out.
package labfault
