// Package nodeagent is bcd node and bcd doctor.
//
// bcd node runs on every installed server: it loads config.toml and the identity bcd
// join stored (refusing one whose role is not node), opens the journal, serves a
// small JSON status on its unix socket (socket_path; the only thing it listens on —
// it opens no TCP port), and keeps the agent session to the gateway, running the
// node's command kinds: node.reboot (reported RUNNING, recorded in the journal with
// the boot id, then SUCCEEDED from the next boot, or FAILED "the node did not reboot"
// when the boot id did not change) and daemon.upgrade, and applies the daemon
// section of its spec: both are self-update (agent/daemonupdate), after which Run
// closes everything and returns daemonupdate.ErrExec for cmd/bcd to exec the
// entrypoint. Every other kind is answered UNSUPPORTED.
//
// bcd doctor runs a list of checks together (config, identity, tpm, gateway,
// update; helper on a node with [helper], libvirt where libvirt's qemu.conf
// is) and reports each by name on its own line. bcd update's table
// (WriteUpdateStatus) and the Manager both commands read the slots with
// (UpdateManager) are here too.
package nodeagent
