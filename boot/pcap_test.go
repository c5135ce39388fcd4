package boot

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
)

// udpRecord is one UDP datagram of a capture.
type udpRecord struct {
	Src, Dst netip.AddrPort
	Payload  []byte
}

// readPcap reads the UDP/IPv4 datagrams of a classic pcap file with Ethernet link
// type: just enough of libpcap's format to turn the testbed's captures into golden
// files.
func readPcap(path string) ([]udpRecord, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) < 24 {
		return nil, fmt.Errorf("%s: too short for a pcap header", path)
	}
	var bo binary.ByteOrder
	switch binary.LittleEndian.Uint32(b) {
	case 0xa1b2c3d4, 0xa1b23c4d:
		bo = binary.LittleEndian
	case 0xd4c3b2a1, 0x4d3cb2a1:
		bo = binary.BigEndian
	default:
		return nil, fmt.Errorf("%s: not a pcap file", path)
	}
	if lt := bo.Uint32(b[20:]); lt != 1 {
		return nil, fmt.Errorf("%s: link type %d, want Ethernet", path, lt)
	}
	var out []udpRecord
	for off := 24; off+16 <= len(b); {
		incl := int(bo.Uint32(b[off+8:]))
		off += 16
		if incl > len(b)-off {
			return nil, fmt.Errorf("%s: truncated record", path)
		}
		frame := b[off : off+incl]
		off += incl
		if len(frame) < 14 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 {
			continue
		}
		ip := frame[14:]
		if len(ip) < 20 || ip[0]>>4 != 4 || ip[9] != 17 {
			continue
		}
		ihl := int(ip[0]&0xf) * 4
		total := int(binary.BigEndian.Uint16(ip[2:]))
		if total > len(ip) || ihl+8 > total {
			continue
		}
		udp := ip[ihl:total]
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(udp))
		dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(udp[2:]))
		out = append(out, udpRecord{Src: src, Dst: dst, Payload: append([]byte(nil), udp[8:]...)})
	}
	return out, nil
}
