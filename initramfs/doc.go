// Package initramfs builds the PXE ramdisk: a u-root initramfs whose uinit is
// `bcd ramdisk`, with the u-root commands an operator needs to debug a machine, the
// external tools the ramdisk's job kinds call, and the Debian kernel's NIC, storage
// and filesystem modules. build.sh does the work; tools.go pins the u-root commands
// in go.mod so the u-root tool can build them.
package initramfs
