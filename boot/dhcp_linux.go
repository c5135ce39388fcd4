package boot

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"
)

// listenUDP opens a UDP socket that may broadcast and, with iface, is bound to that
// device: it reads only what arrives there and its broadcasts leave there.
func listenUDP(addr, iface string) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1); serr != nil {
				serr = fmt.Errorf("SO_BROADCAST: %w", serr)
				return
			}
			if iface != "" {
				if serr = syscall.SetsockoptString(int(fd), syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, iface); serr != nil {
					serr = fmt.Errorf("SO_BINDTODEVICE %s: %w", iface, serr)
				}
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp4", addr)
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}

// pktinfo is the IP_PKTINFO control message that sends a datagram out of ifindex
// with src as its source address, whatever address the socket is bound to.
func pktinfo(ifindex int, src netip.Addr) []byte {
	b := make([]byte, syscall.CmsgSpace(syscall.SizeofInet4Pktinfo))
	h := (*syscall.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level = syscall.IPPROTO_IP
	h.Type = syscall.IP_PKTINFO
	h.SetLen(syscall.CmsgLen(syscall.SizeofInet4Pktinfo))
	pi := (*syscall.Inet4Pktinfo)(unsafe.Pointer(&b[syscall.CmsgLen(0)]))
	pi.Ifindex = int32(ifindex)
	pi.Spec_dst = src.As4()
	return b
}

func send(c *net.UDPConn, b, oob []byte, dst netip.AddrPort) error {
	_, _, err := c.WriteMsgUDPAddrPort(b, oob, dst)
	return err
}
