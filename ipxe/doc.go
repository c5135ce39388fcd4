// Package ipxe holds the iPXE scripts the site agent serves (text/template files
// embedded with go:embed, each beside the struct it renders) and what the boot server
// expects of the iPXE binaries it hands out over TFTP.
//
// # Scripts
//
// A machine that runs iPXE fetches {url}/ipxe/{mac}.ipxe and gets one of three
// scripts:
//
//   - Ramdisk: kernel, initrd and a command line carrying the site's bcd.*
//     parameters and a boot nonce minted for this render. The kernel line always
//     names the initrd (initrd=initrd): UEFI's EFI stub loads the initrd by that
//     name and the kernel ignores it under BIOS, so one script serves both.
//     A failed download retries the whole script after a pause, which also mints a
//     fresh nonce.
//   - Local: boot the installed disk. Under BIOS, sanboot --no-describe --drive 0x80
//     boots the first disk's MBR; if that fails, exit hands back to the BIOS, which
//     tries its next boot device. Under UEFI there is no portable way to boot a disk
//     from iPXE, so the script exits with status 1: EDK2's boot manager treats a boot
//     option that returns an error as failed and moves on to the next one in
//     BootOrder (the disk), whereas one that returns success drops into the boot
//     manager menu. The machine's BootOrder must therefore list the disk after the
//     network. Some firmware behaves better after snponly.efi than after ipxe.efi
//     (iPXE's own drivers can leave the NIC claimed), which is why the UEFI binary is
//     configurable.
//   - Unknown: the MAC has no boot entry; the script says so, sleeps and fetches
//     itself again, so a machine powered on before its entry exists boots as soon as
//     the entry appears.
//
// Every value rendered into a script goes onto an iPXE command line and most onto
// the kernel command line: each must be one printable ASCII word without quotes,
// backslashes, '$' (iPXE would expand ${...}) or '#'. Render refuses anything else
// and names the field, never echoing the value (a nonce is a credential).
//
// # Binaries
//
// The repository builds no iPXE. The TFTP root (tftp_root in [boot]) holds:
//
//	undionly.kpxe   x86 BIOS, chain-loaded by the NIC's PXE ROM (Debian: /usr/lib/ipxe/undionly.kpxe)
//	ipxe.efi        x86-64 UEFI, iPXE's own NIC drivers (Debian: /usr/lib/ipxe/ipxe.efi)
//	snponly.efi     x86-64 UEFI through the firmware's network stack (Debian: /usr/lib/ipxe/snponly.efi)
//	ipxe-arm64.efi  arm64 UEFI (not in Debian's ipxe package for amd64: the operator's own build)
//
// Debian's ipxe package provides the first three; `make ipxe` copies them. Find
// reports which of them a root lacks.
package ipxe
