// Package daemonupdate is self-update in a running daemon, bcd node and bcd site
// alike: it wires an agent/selfupdate Manager (which decides whether a release
// is taken and keeps the slots) to the daemon's gateway session (spec
// "Self-update", steps 1–5 and the daemon.upgrade paragraph).
//
// What it does and reports:
//
//   - At start, Start reads upgrade.json (Manager.Resume). A pending update arms
//     a watchdog for its deadline (one already past swaps back at once); an
//     update the deadline or the rollback unit swapped back is reported: the
//     daemon section FAILED with reason UpdateFailed ("bcd X did not start")
//     and, when a daemon.upgrade asked for it, that command FAILED with reason
//     update-failed.
//   - The first Welcome of a pending update confirms it (the floor rises,
//     upgrade.json goes) and reports the daemon section and the daemon.upgrade
//     that asked SUCCEEDED: daemon.upgrade is self-terminating, like
//     node.reboot.
//   - A daemon section naming another version than the running one is reported
//     RUNNING, verified and staged (Prepare, with the server time of the
//     Welcome), swapped (Swap), and then the daemon closes everything and
//     execs the entrypoint (Exec). A refused release is FAILED with reason
//     ReleaseRefused and the refusal's message, and is not tried again at
//     every spec push: the same revision and content are remembered; a new
//     revision or other content tries again. The running version is
//     SUCCEEDED.
//   - daemon.upgrade is the same path for a command: RUNNING before the swap,
//     FAILED release-refused for a refusal, SUCCEEDED from the new binary.
//
// The daemon owns the order of the shutdown: when ExecRequested is closed it
// stops its session, closes its journal (bbolt holds a file lock), its status
// socket, its listeners and plugins, and returns ErrExec from Run; cmd/bcd then
// calls Exec, after Run's defers ran.
package daemonupdate
