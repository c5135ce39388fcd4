package nodeagent

import "syscall"

// SystemRebooter flushes the file systems and restarts the machine at once
// (reboot(2) with LINUX_REBOOT_CMD_RESTART). It needs CAP_SYS_BOOT, which the unit
// keeps in its bounding set.
var SystemRebooter Rebooter = RebooterFunc(func() error {
	syscall.Sync()
	return syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART)
})
