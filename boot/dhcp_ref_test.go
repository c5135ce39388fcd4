package boot

// The proxyDHCP as it was before its zero-allocation path (dhcp_fast.go): built on
// dhcpv4.FromBytes and dhcpv4.ToBytes. Tests hold the server to it byte for byte
// (TestFastPathMatchesReference, FuzzFastPathMatchesReference), so that the fast
// path changes nothing a client sees.

import (
	"net"
	"net/netip"
	"strings"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/better-compute/bcd/ipxe"
)

// refHandle is the old handle without its counters, logging and observer: the
// reply and destination, or ok false with the reason of the silence.
func refHandle(s *ProxyDHCP, b []byte, pxePort bool, src netip.AddrPort) (reply []byte, dst netip.AddrPort, why string, ok bool) {
	req, err := dhcpv4.FromBytes(b)
	if err != nil {
		return nil, dst, "parse", false
	}
	d, why := refDecide(s, req, pxePort)
	if d == nil {
		return nil, dst, why, false
	}
	return refReply(s, req, d, pxePort).ToBytes(), refDestination(s, req, pxePort, src), "", true
}

type refDecision struct {
	ack         bool
	arch        int
	ipxe        bool
	file        string
	vendorClass string
	tftp        bool
	discovery   bool
}

func refDecide(s *ProxyDHCP, req *dhcpv4.DHCPv4, pxePort bool) (*refDecision, string) {
	if req.OpCode != dhcpv4.OpcodeBootRequest || len(req.ClientHWAddr) != 6 {
		return nil, whyNotOurs
	}
	d := &refDecision{arch: -1}
	switch mt := req.MessageType(); {
	case pxePort && (mt == dhcpv4.MessageTypeRequest || mt == dhcpv4.MessageTypeInform):
		d.ack = true
	case !pxePort && mt == dhcpv4.MessageTypeDiscover:
	default:
		return nil, whyNotOurs
	}
	class := string(req.Options[optClassID])
	http := strings.HasPrefix(class, "HTTPClient")
	if !http && !strings.HasPrefix(class, "PXEClient") {
		return nil, whyNotPXE
	}
	if a, ok := req.Options[optClientArch]; ok {
		if len(a) < 2 || len(a)%2 != 0 {
			return nil, whyMalformed
		}
		d.arch = int(a[0])<<8 | int(a[1])
	}
	if g, ok := req.Options[optClientGUID]; ok && len(g) != 17 {
		return nil, whyMalformed
	}
	d.ipxe = refIsIPXE(req.Options)
	if d.arch < 0 && !d.ipxe {
		return nil, whyNoArch
	}
	d.vendorClass = "PXEClient"
	if http {
		d.vendorClass = "HTTPClient"
	}
	mac := req.ClientHWAddr
	switch {
	case d.ipxe:
		// Already iPXE: straight to its script, or it would chain-load iPXE forever.
		d.file = s.base + "/ipxe/" + mac.String() + ".ipxe"
	case d.arch == archBIOS:
		d.file, d.tftp, d.discovery = cmpOr(s.BIOSBinary, ipxe.BIOS), true, true
	case d.arch == archEFIIA32 || d.arch == archEFIBC || d.arch == archEFIx64:
		d.file, d.tftp = cmpOr(s.EFIBinary, ipxe.EFI), true
	case d.arch == archEFIARM64:
		d.file, d.tftp = cmpOr(s.ARM64Binary, ipxe.ARM64), true
	case d.arch == archEFIx64HTTP:
		d.file, d.vendorClass = s.base+"/ipxe/"+cmpOr(s.EFIBinary, ipxe.EFI), "HTTPClient"
	case d.arch == archARM64HTTP:
		d.file, d.vendorClass = s.base+"/ipxe/"+cmpOr(s.ARM64Binary, ipxe.ARM64), "HTTPClient"
	default:
		return nil, whyArch
	}
	// The table last: it is the only part that may take a lock.
	e, ok := s.Table.Lookup(mac)
	if !ok {
		return nil, whyNoEntry
	}
	if e.Mode == ModeLocal && !d.ipxe {
		// A machine that should boot its disk gets iPXE only when iPXE is what asks
		// (its local script exits to the disk). Firmware's own PXE or HTTP boot gets
		// a boot file that does not exist: it fails at once and moves to its next
		// boot option. Silence would cost each option its whole DHCP timeout, and
		// chain-loading iPXE only to exit again a whole iPXE boot (UEFI lists PXEv4,
		// PXEv6, HTTPv4 and HTTPv6 for each NIC before the disk).
		if d.vendorClass == "HTTPClient" {
			d.file = s.base + "/ipxe/" + LocalBootFile
		} else {
			d.file = LocalBootFile
		}
	}
	return d, ""
}

func refIsIPXE(o dhcpv4.Options) bool {
	if _, ok := o[optIPXEEncap]; ok {
		return true
	}
	uc := o[optUserClass]
	if string(uc) == "iPXE" {
		return true
	}
	for len(uc) > 0 {
		n := int(uc[0])
		if n == 0 || n+1 > len(uc) {
			return false
		}
		if string(uc[1:1+n]) == "iPXE" {
			return true
		}
		uc = uc[1+n:]
	}
	return false
}

func refReply(s *ProxyDHCP, req *dhcpv4.DHCPv4, d *refDecision, pxePort bool) *dhcpv4.DHCPv4 {
	mt := dhcpv4.MessageTypeOffer
	if d.ack {
		mt = dhcpv4.MessageTypeAck
	}
	r := &dhcpv4.DHCPv4{
		OpCode:        dhcpv4.OpcodeBootReply,
		HWType:        req.HWType,
		TransactionID: req.TransactionID,
		Flags:         req.Flags,
		ClientIPAddr:  net.IPv4zero,
		YourIPAddr:    net.IPv4zero,                 // never an address: this is a proxy
		ServerIPAddr:  net.IP(s.ServerIP.AsSlice()), // firmware ignores a proxy offer without siaddr
		GatewayIPAddr: req.GatewayIPAddr,
		ClientHWAddr:  req.ClientHWAddr,
		BootFileName:  d.file,
		Options:       dhcpv4.Options{},
	}
	if pxePort {
		r.ClientIPAddr = req.ClientIPAddr
	} else {
		r.SetBroadcast()
	}
	if d.tftp {
		r.ServerHostName = s.ServerIP.String()
	}
	r.Options[optMessageType] = []byte{byte(mt)}
	r.Options[optServerID] = net.IP(s.ServerIP.AsSlice())
	r.Options[optClassID] = []byte(d.vendorClass)
	if g, ok := req.Options[optClientGUID]; ok {
		r.Options[optClientGUID] = g
	}
	if ai, ok := req.Options[optRelayAgentInfo]; ok && !refIsZero(req.GatewayIPAddr) {
		r.Options[optRelayAgentInfo] = ai
	}
	switch {
	case d.ack:
		if item := refSubOption(req.Options[optVendorSpecific], pxeBootItem); len(item) == 4 {
			r.Options[optVendorSpecific] = append([]byte{pxeBootItem, 4}, append(item, pxeEnd)...)
		}
	case d.discovery:
		r.Options[optVendorSpecific] = []byte{pxeDiscoveryControl, 1, 8, pxeEnd}
	}
	return r
}

func refDestination(s *ProxyDHCP, req *dhcpv4.DHCPv4, pxePort bool, src netip.AddrPort) netip.AddrPort {
	if gi, ok := netip.AddrFromSlice(req.GatewayIPAddr); ok && !gi.Unmap().IsUnspecified() {
		return netip.AddrPortFrom(gi.Unmap(), s.dhcpPort)
	}
	if pxePort && src.IsValid() && !src.Addr().Unmap().IsUnspecified() {
		return netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	}
	return s.broadcast
}

func refIsZero(ip net.IP) bool {
	a, ok := netip.AddrFromSlice(ip)
	return !ok || a.Unmap().IsUnspecified()
}

func refSubOption(b []byte, code byte) []byte {
	for len(b) >= 2 {
		c, n := b[0], int(b[1])
		if c == pxeEnd {
			return nil
		}
		if c == 0 {
			b = b[1:]
			continue
		}
		if 2+n > len(b) {
			return nil
		}
		if c == code {
			return append([]byte(nil), b[2:2+n]...)
		}
		b = b[2+n:]
	}
	return nil
}
