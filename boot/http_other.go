//go:build !linux

package boot

import "net"

// setCork does nothing where there is no TCP_CORK.
func setCork(net.Conn, bool) bool { return false }

// setNotsentLowat does nothing where there is no TCP_NOTSENT_LOWAT.
func setNotsentLowat(net.Conn, int) {}

// httpUnsentBudget is only used with TCP_NOTSENT_LOWAT.
func httpUnsentBudget() int64 { return 256 << 20 }
