//go:build !linux

package helper

import "errors"

// systemReboot is not implemented outside Linux.
func systemReboot() error {
	return errors.New("reboot is not implemented on this operating system")
}
