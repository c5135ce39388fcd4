package site

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/better-compute/bcd/protocol"
)

// arpTable is the kernel's IPv4 neighbour table. A machine that fetched a file by
// TFTP right after the network's own DHCP server gave it an address has talked to
// no server of ours that saw its MAC, but this host learned the MAC to answer it.
const arpTable = "/proc/net/arp"

// neighborMAC looks ip up in the neighbour table; nil when it is not there (or on
// a system without /proc/net/arp).
func neighborMAC(ip netip.Addr) net.HardwareAddr {
	mac, _ := neighborEntry(ip)
	return mac
}

// neighborEntry looks ip up in the neighbour table: its MAC and the interface
// the entry is on; nil and "" when it is not there. Only IPv4 (/proc/net/arp):
// an IPv6 client has no entry, so it gets no nonce.
func neighborEntry(ip netip.Addr) (net.HardwareAddr, string) {
	ip = ip.Unmap()
	if !ip.Is4() {
		return nil, ""
	}
	b, err := os.ReadFile(arpTable)
	if err != nil {
		return nil, ""
	}
	return parseARPEntry(bytes.NewReader(b), ip)
}

// parseARP finds ip's complete entry in /proc/net/arp's format:
//
//	IP address       HW type     Flags       HW address            Mask     Device
//	10.20.0.50       0x1         0x2         52:54:00:12:34:56     *        br0
func parseARP(r io.Reader, ip netip.Addr) net.HardwareAddr {
	mac, _ := parseARPEntry(r, ip)
	return mac
}

// parseARPEntry is parseARP with the entry's device.
func parseARPEntry(r io.Reader, ip netip.Addr) (net.HardwareAddr, string) {
	sc := bufio.NewScanner(r)
	sc.Scan() // the header
	want := ip.String()
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// Flags 0x0 is an incomplete entry (asked, never answered).
		if len(f) < 4 || f[0] != want || f[2] == "0x0" {
			continue
		}
		mac, err := protocol.ParseMAC(f[3])
		if err != nil || bytes.Equal(mac, make([]byte, 6)) {
			continue
		}
		dev := ""
		if len(f) >= 6 {
			dev = f[5]
		}
		return mac, dev
	}
	return nil, ""
}
