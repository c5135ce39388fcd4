package deploy

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// HostMachine is the running Linux kernel: kexec_file_load(2) and reboot(2). Every
// step syncs filesystems first, since nothing runs after it.
type HostMachine struct{}

// KexecLoad loads the kernel with kexec_file_load, which verifies the image itself
// (and its signature where the kernel enforces one).
func (HostMachine) KexecLoad(kernel, initrd *os.File, cmdline string) error {
	initrdFD, flags := -1, 0
	if initrd == nil {
		flags |= unix.KEXEC_FILE_NO_INITRAMFS
	} else {
		initrdFD = int(initrd.Fd())
	}
	if err := unix.KexecFileLoad(int(kernel.Fd()), initrdFD, cmdline, flags); err != nil {
		return fmt.Errorf("kexec_file_load: %w", err)
	}
	return nil
}

// KexecExec jumps to the loaded kernel.
func (HostMachine) KexecExec() error {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_KEXEC); err != nil {
		return fmt.Errorf("reboot(LINUX_REBOOT_CMD_KEXEC): %w", err)
	}
	return nil
}

// Reboot restarts the machine.
func (HostMachine) Reboot() error {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); err != nil {
		return fmt.Errorf("reboot(LINUX_REBOOT_CMD_RESTART): %w", err)
	}
	return nil
}

// PowerOff turns the machine off.
func (HostMachine) PowerOff() error {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		return fmt.Errorf("reboot(LINUX_REBOOT_CMD_POWER_OFF): %w", err)
	}
	return nil
}
