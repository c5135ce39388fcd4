package helper

import "syscall"

// systemReboot flushes the file systems and restarts the machine at once,
// as nodeagent.SystemRebooter does for a root node (copied: nodeagent
// imports this package, so this one cannot import it).
func systemReboot() error {
	syscall.Sync()
	return syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART)
}
