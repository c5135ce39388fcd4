// Package helper is bcd helper, the root half of an unprivileged bcd node
// (spec "Running bcd node unprivileged"), and the node's client of it.
//
// bcd node runs as [helper] user (bcd) and asks bcd helper, running as root
// beside it, for the few things only root may do. The socket is [helper]
// socket (default /run/bcd-helper/helper.sock, in the helper's own root-owned
// runtime directory, never in /run/bcd, which the node owns). The wire is
// HTTP/1.1 over that socket: POST /v1/<op> with a JSON body, a JSON answer,
// and on failure an Error ({"code", "message"}) with a 4xx or 5xx status.
//
// Every operation is narrow and validated; there is no generic "run this":
//
//	reboot            sync and reboot(2) the machine (node.reboot)
//	update.resume     self-update's Resume for the node's running version
//	update.verify     step 1 under the helper's own [update] pins and floor
//	update.swap       verify again, install <data_dir>/staging/bcd-<v> (a
//	                  regular file with one link that the node's uid owns)
//	                  into root's [update] slots_dir and swap
//	update.confirm    the new binary's first Welcome
//	update.swap-back  the node's deadline passed without a Welcome
//	tpm.create        a new node key in the TPM (its BCD TPM NODE KEY record)
//	tpm.load          a record's public key, checking the TPM takes it
//	tpm.sign          sign a digest with a record's key
//
// The helper serves a caller only when SO_PEERCRED shows the node user's uid
// and gid (or root) and /proc/<pid>/exe is an installed bcd: [update]
// entrypoint, bcd-a or bcd-b in [update] slots_dir, or the helper's own
// binary. It refuses to start on a config.toml, socket directory or slots
// path that anyone but root could change.
//
// The node's side: KeyStore (the node key through tpm.*, or a PKCS#8 key of
// the node's own when the helper has no TPM) and NewUpdater (self-update's
// Privileged half through update.*, the download into <data_dir>/staging
// and the exec staying in the node). nodeagent.Node uses them, and
// the reboot operation, whenever config.toml has [helper].
//
// Not implemented, because this bcd does not have the features yet: the CDI
// specs and allocation env files, sshd files and reloads, the bcd_instances
// and bcd_taps nftables tables, GPU resets, libvirt.* and ch.* operations.
// tpm.certify is not an operation either: only bcd join certifies a node key,
// and it runs as root with the TPM open itself.
package helper
