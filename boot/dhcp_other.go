//go:build !linux

package boot

import (
	"errors"
	"net"
	"net/netip"
)

// listenUDP opens a UDP socket. Binding to a device needs Linux.
func listenUDP(addr, iface string) (*net.UDPConn, error) {
	if iface != "" {
		return nil, errors.New("binding to an interface is only supported on Linux")
	}
	a, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		return nil, err
	}
	return net.ListenUDP("udp4", a)
}

func pktinfo(int, netip.Addr) []byte { return nil }

func send(c *net.UDPConn, b, _ []byte, dst netip.AddrPort) error {
	_, err := c.WriteToUDPAddrPort(b, dst)
	return err
}
