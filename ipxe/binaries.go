package ipxe

import (
	"fmt"
	"os"
)

// File names of the iPXE binaries in a TFTP root.
const (
	BIOS    = "undionly.kpxe"  // x86 BIOS, loaded by the NIC's PXE ROM (UNDI)
	EFI     = "ipxe.efi"       // x86-64 UEFI with iPXE's own NIC drivers
	SNPOnly = "snponly.efi"    // x86-64 UEFI through the firmware's SNP network stack
	ARM64   = "ipxe-arm64.efi" // arm64 UEFI
)

// Binaries lists every binary name the boot server may hand out.
var Binaries = []string{BIOS, EFI, SNPOnly, ARM64}

// Find reports which of names (all of Binaries when none are given) root holds as
// non-empty regular files. It applies the TFTP server's rules, so a name that server
// would refuse (a symlink leaving root, a device, a directory) counts as missing.
// It fails only when root itself cannot be opened.
func Find(root string, names ...string) (present, missing []string, err error) {
	if len(names) == 0 {
		names = Binaries
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the iPXE directory: %w", err)
	}
	defer r.Close()
	for _, name := range names {
		if fi, err := r.Stat(name); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
			present = append(present, name)
		} else {
			missing = append(missing, name)
		}
	}
	return present, missing, nil
}
