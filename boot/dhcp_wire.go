package boot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// The proxyDHCP reads and writes its packets here, without dhcpv4's Options map:
// parsing into a map and marshalling one back cost 34 allocations and most of the
// 3.8 µs a packet took (BenchmarkHandleDHCP), which in a boot storm is the core the
// site agent has. What it accepts and what it answers are dhcpv4's, byte for byte:
// dhcp_ref_test.go keeps the dhcpv4-based server and the tests compare the two.

// BOOTP/DHCP fixed header (RFC 2131 section 2).
const (
	hdrLen       = 236 // op … file
	cookieLen    = 4
	optionsStart = hdrLen + cookieLen
	bootpMinLen  = 300 // RFC 951: relay agents and servers drop shorter messages
	opBootReply  = 2
	flagBcast    = 0x8000
)

var magicCookie = [4]byte{99, 130, 83, 99}

var (
	errShort     = errors.New("malformed DHCP packet: shorter than the BOOTP header")
	errCookie    = errors.New("malformed DHCP packet: no DHCP magic cookie")
	errOptLength = errors.New("malformed DHCP packet: an option runs past the end of the packet")
	errNoEnd     = errors.New("malformed DHCP packet: no End option")
)

// request is a DHCP request as the proxy reads it: the fixed fields and the options
// it looks at, the options as sub-slices of the datagram (nil when absent, empty but
// not nil when present with no data), valid only as long as the datagram.
type request struct {
	op, htype, hlen byte
	xid             [4]byte
	flags           uint16
	ciaddr, giaddr  [4]byte
	chaddr          [16]byte
	msgType         byte // option 53 when it is one byte long, else 0 (none)
	class           []byte
	userClass       []byte
	arch            []byte
	guid            []byte
	relay           []byte
	vendor          []byte
	ipxeEncap       bool
}

// mac is the client hardware address, as dhcpv4 cuts it (hlen capped at 16).
func (r *request) mac() net.HardwareAddr {
	n := int(r.hlen)
	if n > 16 {
		n = 16
	}
	return net.HardwareAddr(r.chaddr[:n])
}

// macCopy is mac on the heap, for what keeps it (logs, events): the request itself
// stays on the stack.
func (r *request) macCopy() net.HardwareAddr { return bytes.Clone(r.mac()) }

// parseRequest reads b as dhcpv4.FromBytes would and fills r. repeated reports an
// option the proxy uses that appears more than once: RFC 3396 concatenates those,
// which parseRequest leaves to dhcpv4 (requestFromDHCPv4) rather than copy.
func parseRequest(b []byte, r *request) (repeated bool, err error) {
	if len(b) < optionsStart {
		return false, errShort
	}
	r.op, r.htype, r.hlen = b[0], b[1], b[2]
	copy(r.xid[:], b[4:8])
	r.flags = binary.BigEndian.Uint16(b[10:12])
	copy(r.ciaddr[:], b[12:16])
	copy(r.giaddr[:], b[24:28])
	copy(r.chaddr[:], b[28:44])
	if [4]byte(b[hdrLen:optionsStart]) != magicCookie {
		return false, errCookie
	}
	var seen uint16
	o := b[optionsStart:]
	if len(o) == 0 {
		return false, nil // dhcpv4 wants End only after some option
	}
	for len(o) > 0 {
		code := o[0]
		if code == 0 { // pad
			o = o[1:]
			continue
		}
		if code == 255 {
			return repeated, nil
		}
		if len(o) < 2 || 2+int(o[1]) > len(o) {
			return false, errOptLength
		}
		data := o[2 : 2+int(o[1]) : 2+int(o[1])]
		o = o[2+len(data):]
		var slot *[]byte
		var bit uint16
		switch code {
		case optMessageType:
			bit = 1 << 0
			if len(data) == 1 {
				r.msgType = data[0]
			} else {
				r.msgType = 0
			}
		case optClassID:
			slot, bit = &r.class, 1<<1
		case optUserClass:
			slot, bit = &r.userClass, 1<<2
		case optClientArch:
			slot, bit = &r.arch, 1<<3
		case optClientGUID:
			slot, bit = &r.guid, 1<<4
		case optRelayAgentInfo:
			slot, bit = &r.relay, 1<<5
		case optVendorSpecific:
			slot, bit = &r.vendor, 1<<6
		case optIPXEEncap:
			r.ipxeEncap = true
		}
		if bit != 0 {
			if seen&bit != 0 {
				repeated = true
			}
			seen |= bit
		}
		if slot != nil {
			*slot = data
		}
	}
	return false, errNoEnd
}

// requestFromDHCPv4 is r from a packet dhcpv4 parsed, for the rare request that
// repeats an option.
func requestFromDHCPv4(p *dhcpv4.DHCPv4, r *request) {
	*r = request{op: byte(p.OpCode), htype: byte(p.HWType), hlen: byte(len(p.ClientHWAddr)), xid: p.TransactionID, flags: p.Flags}
	copy(r.ciaddr[:], p.ClientIPAddr.To4())
	copy(r.giaddr[:], p.GatewayIPAddr.To4())
	copy(r.chaddr[:], p.ClientHWAddr)
	if mt := p.Options[optMessageType]; len(mt) == 1 {
		r.msgType = mt[0]
	}
	get := func(code uint8) []byte {
		v, ok := p.Options[code]
		if ok && v == nil {
			return []byte{}
		}
		return v
	}
	r.class, r.userClass, r.arch = get(optClassID), get(optUserClass), get(optClientArch)
	r.guid, r.relay, r.vendor = get(optClientGUID), get(optRelayAgentInfo), get(optVendorSpecific)
	_, r.ipxeEncap = p.Options[optIPXEEncap]
}

// appendReply appends the answer to r that d decided, as dhcpv4's ToBytes lays it
// out: options in code order, 82 last (RFC 3046), End, padded to 300 bytes.
func (s *ProxyDHCP) appendReply(b []byte, r *request, d *decision, pxePort bool) []byte {
	start := len(b)
	flags := r.flags
	var ciaddr [4]byte
	if pxePort {
		ciaddr = r.ciaddr
	} else {
		flags |= flagBcast
	}
	b = append(b, opBootReply, r.htype, 6, 0)
	b = append(b, r.xid[:]...)
	b = append(b, 0, 0, byte(flags>>8), byte(flags))
	b = append(b, ciaddr[:]...)
	b = append(b, 0, 0, 0, 0) // yiaddr: never an address, this is a proxy
	b = append(b, s.serverIP4[:]...)
	b = append(b, r.giaddr[:]...)
	b = append(b, r.chaddr[:6]...)
	b = append(b, make([]byte, 10+64+128)...)
	fixed := b[start:]
	if d.tftp {
		copy(fixed[44:44+63], s.serverName)
	}
	copy(fixed[108:108+127], d.file)
	b = append(b, magicCookie[:]...)

	switch {
	case d.ack:
		if item := subOption(r.vendor, pxeBootItem); len(item) == 4 {
			b = append(b, optVendorSpecific, 7, pxeBootItem, 4)
			b = append(b, item...)
			b = append(b, pxeEnd)
		}
	case d.discovery:
		b = append(b, optVendorSpecific, 4, pxeDiscoveryControl, 1, 8, pxeEnd)
	}
	mt := byte(dhcpv4.MessageTypeOffer)
	if d.ack {
		mt = byte(dhcpv4.MessageTypeAck)
	}
	b = append(b, optMessageType, 1, mt)
	b = append(b, optServerID, 4)
	b = append(b, s.serverIP4[:]...)
	b = appendOption(b, optClassID, d.vendorClass)
	if r.guid != nil {
		b = appendOption(b, optClientGUID, r.guid)
	}
	if r.relay != nil && r.giaddr != [4]byte{} {
		b = appendOption(b, optRelayAgentInfo, r.relay)
	}
	b = append(b, 255)
	for len(b)-start < bootpMinLen {
		b = append(b, 0)
	}
	return b
}

// appendOption appends one option, split into 255-byte pieces as RFC 3396 has it.
func appendOption[T []byte | string](b []byte, code byte, data T) []byte {
	if len(data) == 0 {
		return append(b, code, 0)
	}
	for len(data) > 0 {
		n := min(len(data), 255)
		b = append(b, code, byte(n))
		b = append(b, data[:n]...)
		data = data[n:]
	}
	return b
}
