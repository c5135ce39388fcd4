// Package ramdisk is bcd ramdisk: the agent inside the PXE ramdisk a site agent
// boots. It has no config.toml: everything comes from the kernel command line the
// site rendered into the machine's iPXE script (bcd.gateway_url, bcd.server_name,
// bcd.site, the three pins, bcd.boot_nonce, and optionally bcd.proxy and bcd.log;
// ParseParams), and a parameter that is missing or malformed stops it with exit 2.
//
// In order, Agent.Run mounts what u-root's init has not (proc, sysfs, devtmpfs, a
// tmpfs on /run), loads the kernel modules the hardware announces by modalias
// (ramdisk/kmod), runs DHCP on every NIC with a link (ramdisk/netup) until the
// gateway, or the site's HTTP proxy in front of it, accepts a connection, and joins
// through the discovery attestor as role ramdisk with the boot nonce and the
// machine's claims (MACs, DMI, disks, CPUs, memory, GPUs). A deferral is retried
// with the same CSR while the console says the machine waits for approval. The
// identity and journal live in /run/bcd, a tmpfs, and die with the boot, as the
// nonce does.
//
// Then it runs its session's commands: inventory, deploy.image (through deploy/),
// disk.wipe, diag.dcgm, machine.kexec, machine.reboot and machine.poweroff. A
// command that takes the machine down reports its success first and waits, for at
// most FlushTimeout, until the gateway has acknowledged it: once the machine is
// gone, nothing would replay the journal.
//
// Logs are JSON lines on the console (stderr, which u-root's init points at
// /dev/console), and from Info up also events of kind "log" to the control plane,
// queued from the start so that what happened before the join arrives after it.
package ramdisk
