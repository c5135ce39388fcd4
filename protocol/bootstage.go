package protocol

import "time"

// Stages of a machine.booted event (MachineBooted.Stage), in the order a machine
// goes through them.
const (
	StageDHCP   = "dhcp"   // the proxyDHCP's OFFER on port 67
	StagePXE    = "pxe"    // the proxyDHCP's ACK on port 4011
	StageTFTP   = "tftp"   // an iPXE binary, over TFTP or UEFI HTTP boot
	StageScript = "script" // the machine's iPXE script
	StageKernel = "kernel" // the ramdisk kernel
	StageInitrd = "initrd" // the ramdisk initramfs
)

// BootNonceLifetime is how long a boot nonce the site agent reports stays good
// (BootNonce.ExpiresAt is the mint time plus this).
const BootNonceLifetime = 30 * time.Minute
