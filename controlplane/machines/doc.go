// Package machines is the control plane's machine logic that sits between
// the store and the agents: what a site agent is told (its spec's boot,
// bmc_hosts and http_proxy sections, from the site's machines), what the
// control plane makes of what a site agent reports (machine.booted steps
// attached to machines, boot.nonce events kept hashed for the discovery
// attestor), and the files a deploy writes into the installed OS.
//
// # Who changes a machine
//
// Service is the api's only way to change a machine. It owns the spec (name,
// MACs, BMC, firmware, approval, the operator's boot override), validates
// what the operator gives, and routes deploy and cancel to the lifecycle
// controller. While a deployment runs, a spec change, a manual bmc.power or
// bmc.bootdev and a delete are refused with MACHINE_BUSY naming the
// deployment ("machine m_… is deploying (dep_…): cancel it first"), checked
// in the store's transaction; approval stays allowed, since a deploy in a
// site with manual approval waits for it. PickSiteAgent and NewCommand are
// shared with the lifecycle, so both pick the same site agent and make
// commands the same way.
//
// # Spec sections
//
// A node of role site is sent, on its Welcome and whenever they change:
//
//	boot        protocol.BootSection: one entry per MAC of every machine of
//	            the site that has a boot mode (kernel, initrd and cmdline
//	            empty: the site's [boot] defaults)
//	bmc_hosts   protocol.BMCHostsSection: every machine's BMC of the site,
//	            password included: the spec goes only over the mTLS session
//	            of a site node of that site
//	http_proxy  protocol.HTTPProxySection, when the site has one; the
//	            gateway's host:port is always among its allowed destinations
//
// Their revision is the site's spec revision, which every change to a
// machine of the site (add, boot mode, BMC, delete) or to its proxy moves
// on in the same transaction. Nodes of role node and ramdisk get no
// sections; their revision is the node's own.
//
// # Events
//
// machine.booted is attached to the machine of the reporting site with
// that MAC (its last boot stage, and its timeline); an unknown MAC is only
// stored. boot.nonce is stored as the SHA-256 of the nonce with the MAC,
// the site, the machine and the expiry, which must lie in the future and
// at most protocol.MaxBootNonceLifetime ahead (plus MaxClockSkew); the
// stored event carries the hash in place of the nonce. Malformed data is
// logged and acknowledged: replaying it would not make it valid.
package machines
