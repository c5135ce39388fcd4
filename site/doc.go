// Package site is bcd site, the agent of a data-centre site: it keeps the site's
// session with the gateway (agent.Session, the journal) and serves the site's
// provisioning network from the desired state the control plane sends.
//
// From the spec it applies three sections:
//
//   - boot (protocol.BootSection): the boot table. The boot/ servers answer only
//     MACs with an entry; a ramdisk entry's empty kernel, initrd or cmdline take
//     [boot]'s kernel, initrd (else {url}/ramdisk/vmlinuz and /ramdisk/initrd when
//     ramdisk_dir is set) and cmdline (an entry's cmdline is appended to it).
//   - http_proxy (protocol.HTTPProxySection): the HTTP forward proxy of
//     site/httpproxy on its listen address, allowing the section's destinations
//     plus the gateway's host:port and [boot] url's host:port. Its URL goes onto
//     every ramdisk command line as bcd.proxy (server_ip replaces an unspecified
//     listen host).
//   - bmc_hosts (protocol.BMCHostsSection): the BMCs, kept by bmc.Store. The
//     bmc.power, bmc.bootdev and bmc.inventory commands are decoded here
//     (bmcexec.go) and run on a bmc.Driver: the bcx-ipmi plugin of [plugins] dir
//     (bmc/pluginhost: verified against the pins file, sandboxed, supervised),
//     started on the first command. A
//     plugin that cannot run fails the command with PluginFailed and the reason;
//     without a [plugins] section the bmc.* kinds answer UNSUPPORTED.
//
// A section missing from a spec is empty desired state (no entries, no proxy, no
// BMCs); a section that does not decode keeps what the site had. Every other
// command kind is UNSUPPORTED.
//
// With a [boot] section it runs the boot HTTP server on [boot] listen (default:
// every address on the port of [boot] url), TFTP when tftp is set, and the
// proxyDHCP when proxy_dhcp is true, on [boot] interface or the interface holding
// server_ip. Without one it logs "no [boot] section: serving no PXE machine" and
// keeps its session, BMC commands and proxy.
//
// Every ramdisk script carries the site's bcd.* parameters and a fresh boot nonce
// (128 random bits, base64url). The nonce's boot.nonce event (protocol.BootNonce,
// valid protocol.BootNonceLifetime) is journaled, and sent when the session is up,
// before the script is returned; if it cannot be journaled the script is refused
// with 503. What the boot servers hand out is reported as machine.booted events
// (protocol.MachineBooted), at most one per MAC and stage per interval: EventInterval
// after the first, doubling while the serves go on (up to 30 s), each event's Count
// the serves it stands for; the flushes of a storm's bursts are spread over the
// interval rather than sent at one tick. TFTP,
// kernel and initrd requests carry no MAC: they are attributed to the MAC last
// seen from the same address (proxyDHCP's port 4011 exchange, the script request)
// within 15 minutes, else to the one the kernel's neighbour table (/proc/net/arp)
// holds for the address, and not reported otherwise.
//
// Like bcd node it updates itself (agent/daemonupdate) from the daemon section or
// daemon.upgrade; before the exec Run closes the boot servers' sockets, the
// plugins, the status socket and the journal, so the new binary can bind and
// open them, and returns daemonupdate.ErrExec.
//
// Like bcd node it answers a JSON status on its unix socket (socket_path, 0600,
// GET /v1/status): the session, the spec revision, the boot table's and BMC hosts'
// sizes, the servers' addresses and the machine.booted events not sent.
//
// Files under data_dir, beside identity.json, node.key and journal.db:
//
//	site-spec.json  0600, atomic: the last spec the gateway sent, without
//	                bmc_hosts; applied at start so a restart during a gateway
//	                outage keeps booting machines
//	bmc-hosts.json  0600, atomic: the BMC hosts with their credentials, each
//	                password sealed (AES-256-GCM) under bmc-hosts.key (bmc.Store)
//	bmc-hosts.key   0600: the keyring that seals them, made on first use
package site
