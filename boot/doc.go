// Package boot is the site agent's network boot server: a proxyDHCP (ProxyDHCP), a
// read-only TFTP server for the iPXE binaries (TFTPServer) and an HTTP server for the
// per-machine iPXE scripts, the ramdisk kernel and initramfs (HTTPServer). Each runs
// alone and is tested alone on loopback with real clients; bcd site wires them to
// its control plane session.
//
// Policy lives behind small interfaces: the servers ask a Table what a MAC should
// boot, tell an Observer about every machine they serve (so the site agent can
// report "machine booted"), and the HTTP server asks a NonceMinter for the boot nonce
// of each ramdisk script it renders.
//
// # The boot sequence
//
//	firmware PXE  ──DHCPDISCOVER (opt 60 PXEClient, 93 arch)──▶ ProxyDHCP :67
//	              ◀──OFFER: siaddr, file = undionly.kpxe / ipxe.efi ── (broadcast, or to the relay)
//	              ──REQUEST to :4011 (EDK2, iPXE)──▶ ProxyDHCP :4011 ──▶ ACK with the same file
//	              ──RRQ undionly.kpxe──▶ TFTPServer :69
//	iPXE          ──DHCPDISCOVER (user class iPXE)──▶ ProxyDHCP: file = {url}/ipxe/{mac}.ipxe
//	              ──GET /ipxe/{mac}.ipxe──▶ HTTPServer: ramdisk, local or unknown script
//	              ──GET /ramdisk/vmlinuz, /ramdisk/initrd──▶ HTTPServer
//
// The proxyDHCP never hands out an address (yiaddr is always 0) and stays silent for
// a client that is not PXE or whose MAC has no entry, so it coexists with the
// network's own DHCP server.
//
// The TFTP server is bcd's own sender (tftp.go, tftp_proto.go; one epoll loop on
// Linux), not a library's: pin/tftp/v3 is only the client the tests and the
// benchmarks fetch with, and the guard test keeps it out of the bcd binary.
package boot
