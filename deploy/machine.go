package deploy

import "os"

// Machine is what ends a deploy: loading the installed kernel and jumping to it, or
// rebooting, or powering off. The running kernel does it (HostMachine); tests inject
// one that records what it was asked instead of taking the machine down.
type Machine interface {
	// KexecLoad loads kernel and initrd (nil for none) with cmdline for a later
	// KexecExec. It does not jump, so a deploy can still fail, and report, after it.
	KexecLoad(kernel, initrd *os.File, cmdline string) error
	// KexecExec jumps to the loaded kernel. It returns only on failure.
	KexecExec() error
	// Reboot and PowerOff return only on failure.
	Reboot() error
	PowerOff() error
}
