package main

import (
	"encoding/binary"
	"net/netip"
)

// DHCP as a PXE ROM speaks it, built and read by hand: the load generator shares
// two cores with the server it measures, so it must not spend them on a general
// DHCP codec's allocations.

const (
	opBootRequest = 1
	opBootReply   = 2

	msgDiscover = 1
	msgOffer    = 2
	msgRequest  = 3
	msgAck      = 5

	bootpLen   = 236 // the fixed BOOTP header, before the magic cookie
	minPacket  = 300 // BOOTP's minimum; firmware pads to it
	optPad     = 0
	optEnd     = 255
	optMsgType = 53
	optVendor  = 43 // PXE vendor options
	optFile    = 67
	optClassID = 60

	pxeBootMenu = 9  // vendor sub-option: boot menu items (type, description)
	pxeBootItem = 71 // vendor sub-option: the item a 4011 request asks for
)

// pxeClass is option 60 of a BIOS PXE ROM (arch 0, UNDI 2.1), the client both
// dnsmasq's pxe-service=x86PC and bcd answer with undionly.kpxe.
const pxeClass = "PXEClient:Arch:00000:UNDI:002001"

// firmware is what a PXE client says of itself: option 60, option 93 and
// option 94, as ../shared/captures/pxe-bios-ipxe-uefi-ovmf-and-ipxe.pcap has
// them. Neither sends a user class: that is iPXE's, on the second round.
type firmware struct {
	Name  string  `json:"name"`
	Class string  `json:"class"`
	Arch  uint16  `json:"arch"`
	UNDI  [3]byte `json:"undi"`
}

var (
	// fwBIOS is a BIOS PXE ROM (SeaBIOS with QEMU's iPXE ROM says the same).
	fwBIOS = firmware{Name: "BIOS", Class: pxeClass, Arch: 0, UNDI: [3]byte{1, 2, 1}}
	// fwUEFI is OVMF's own EDK2 PXE: arch 7 (x86-64 UEFI), UNDI 3.0.
	fwUEFI = firmware{Name: "UEFI", Class: "PXEClient:Arch:00007:UNDI:003000", Arch: 7, UNDI: [3]byte{1, 3, 0}}
)

var magicCookie = []byte{99, 130, 83, 99}

// paramRequest is the parameter request list (option 55) of a PXE 2.1 ROM.
var paramRequest = []byte{1, 2, 3, 4, 5, 6, 11, 12, 13, 15, 16, 17, 18, 22, 23, 28, 40, 41, 42, 43, 50, 51, 54, 58, 59, 60, 66, 67, 97, 128, 129, 130, 131, 132, 133, 134, 135}

// benchMAC is the i-th MAC of the benchmark's boot table: locally administered,
// so that it can never be a real NIC's.
func benchMAC(i int) [6]byte {
	return [6]byte{0x02, 0xbc, 0xbe, 0x00, byte(i >> 8), byte(i)}
}

// appendPXE appends a PXE client's DISCOVER (msg msgDiscover, broadcast flag set,
// no address) or its follow-up REQUEST to port 4011 (msg msgRequest, from ciaddr,
// asking for item when it is non-zero) to b.
func appendPXE(b []byte, msg byte, xid uint32, mac [6]byte, ciaddr netip.Addr, item [4]byte, fw firmware) []byte {
	if fw.Class == "" {
		fw = fwBIOS
	}
	start := len(b)
	var h [bootpLen]byte
	h[0], h[1], h[2] = opBootRequest, 1, 6 // Ethernet, 6-byte address
	binary.BigEndian.PutUint32(h[4:], xid)
	if msg == msgDiscover {
		h[10] = 0x80 // broadcast: the client has no address to be answered at
	}
	if ciaddr.Is4() {
		a := ciaddr.As4()
		copy(h[12:16], a[:])
	}
	copy(h[28:34], mac[:])
	b = append(b, h[:]...)
	b = append(b, magicCookie...)
	b = append(b, optMsgType, 1, msg)
	b = append(b, 57, 2, 0x05, 0xc0) // maximum message size 1472
	b = append(b, 55, byte(len(paramRequest)))
	b = append(b, paramRequest...)
	b = append(b, 60, byte(len(fw.Class)))
	b = append(b, fw.Class...)
	b = append(b, 93, 2, byte(fw.Arch>>8), byte(fw.Arch)) // client architecture
	b = append(b, 94, 3, fw.UNDI[0], fw.UNDI[1], fw.UNDI[2])
	// Option 97, the SMBIOS UUID, derived from the MAC as a machine's would be its own.
	b = append(b, 97, 17, 0, 0x4c, 0x4c, 0x45, 0x44, 0, 0x10, 0x80, 0x30, 0xb2, 0x37)
	b = append(b, mac[:]...)
	if item != [4]byte{} {
		b = append(b, optVendor, 7, pxeBootItem, 4, item[0], item[1], item[2], item[3], optEnd)
	}
	b = append(b, optEnd)
	for len(b)-start < minPacket {
		b = append(b, optPad)
	}
	return b
}

// pxeReply is what the load generator needs of a server's answer.
type pxeReply struct {
	xid  uint32
	msg  byte // option 53
	item [4]byte
	// usable: the reply names a boot server (siaddr) and a file (the file field
	// or option 67), or offers a boot menu whose item the ROM asks a boot server
	// for on port 4011 (dnsmasq's way for BIOS), or is a PXEClient offer (option
	// 60) naming a boot server without a file, which the ROM then asks on 4011
	// (dnsmasq's way for UEFI, which has no menus; see ../shared/captures).
	// Firmware ignores anything else.
	usable bool
}

// parsePXEReply reads a BOOTREPLY. ok is false for anything else, and for a
// packet whose options run past its end.
func parsePXEReply(b []byte) (r pxeReply, ok bool) {
	if len(b) < bootpLen+len(magicCookie) || b[0] != opBootReply {
		return r, false
	}
	if string(b[bootpLen:bootpLen+4]) != string(magicCookie) {
		return r, false
	}
	r.xid = binary.BigEndian.Uint32(b[4:8])
	siaddr := [4]byte(b[20:24]) != [4]byte{}
	file := b[108] != 0
	menu, pxeClient := false, false
	opts := b[bootpLen+4:]
	for len(opts) > 0 {
		code := opts[0]
		if code == optEnd {
			break
		}
		if code == optPad {
			opts = opts[1:]
			continue
		}
		if len(opts) < 2 || len(opts) < 2+int(opts[1]) {
			return r, false
		}
		val := opts[2 : 2+int(opts[1])]
		opts = opts[2+int(opts[1]):]
		switch code {
		case optMsgType:
			if len(val) == 1 {
				r.msg = val[0]
			}
		case optFile:
			file = file || len(val) > 0
		case optClassID:
			pxeClient = string(val) == "PXEClient"
		case optVendor:
			r.item, menu = firstMenuItem(val)
		}
	}
	r.usable = siaddr && (file || pxeClient) || menu
	return r, r.msg != 0
}

// firstMenuItem returns the first boot menu item's type (sub-option 9) as the
// boot item a 4011 request names, layer 0, with menu true; or the item the
// server echoed in an ACK (sub-option 71).
func firstMenuItem(v []byte) (item [4]byte, menu bool) {
	for len(v) > 0 {
		code := v[0]
		if code == optEnd {
			break
		}
		if code == optPad {
			v = v[1:]
			continue
		}
		if len(v) < 2 || len(v) < 2+int(v[1]) {
			return item, false
		}
		val := v[2 : 2+int(v[1])]
		v = v[2+int(v[1]):]
		switch {
		case code == pxeBootMenu && len(val) >= 3:
			return [4]byte{val[0], val[1], 0, 0}, true
		case code == pxeBootItem && len(val) == 4:
			return [4]byte(val), false
		}
	}
	return item, false
}
