//go:build !linux

package nodeagent

import "errors"

// SystemRebooter is not implemented outside Linux.
var SystemRebooter Rebooter = RebooterFunc(func() error {
	return errors.New("node.reboot is not implemented on this operating system")
})
