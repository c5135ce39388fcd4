package boot

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// FuzzHandleDHCP: no datagram crashes the proxyDHCP, and whatever it answers is a
// well-formed proxy reply to that client that offers no address. Every MAC has an
// entry so that the fuzzer reaches the reply path.
func FuzzHandleDHCP(f *testing.F) {
	for _, g := range goldenRequests {
		f.Add(readGolden(f, g), g.pxePort)
	}
	f.Add(pxeRequest(f, testMAC, 16, "HTTPClient:Arch:00016:UNDI:003001").ToBytes(), false)
	f.Add(pxeRequest(f, testMAC, 11, "PXEClient:Arch:00011:UNDI:003000", dhcpv4.WithGatewayIP(net.IPv4(10, 0, 0, 1))).ToBytes(), false)
	f.Add([]byte{}, false)
	s := &ProxyDHCP{
		ServerIP:      testServerIP,
		URL:           testURL,
		Table:         TableFunc(func(net.HardwareAddr) (Entry, bool) { return Entry{Mode: ModeRamdisk}, true }),
		BroadcastAddr: netip.MustParseAddrPort("255.255.255.255:68"),
	}
	if err := s.setup(); err != nil {
		f.Fatal(err)
	}
	s.dhcpPort = 67
	src := netip.MustParseAddrPort("10.99.0.7:68")
	f.Fuzz(func(t *testing.T, b []byte, pxePort bool) {
		reply, dst, ok := s.handle(b, nil, pxePort, src)
		if !ok {
			return
		}
		req, err := dhcpv4.FromBytes(b)
		if err != nil {
			t.Fatalf("answered a packet that does not parse: %v", err)
		}
		p, err := dhcpv4.FromBytes(reply)
		if err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
		if !p.YourIPAddr.Equal(net.IPv4zero) {
			t.Fatalf("offered address %s", p.YourIPAddr)
		}
		if !p.ServerIPAddr.Equal(net.IP(testServerIP.AsSlice())) {
			t.Fatalf("siaddr %s", p.ServerIPAddr)
		}
		if p.TransactionID != req.TransactionID || !bytes.Equal(p.ClientHWAddr, req.ClientHWAddr) {
			t.Fatal("reply for another transaction or client")
		}
		if !dst.IsValid() || dst.Port() == 0 {
			t.Fatalf("destination %s", dst)
		}
	})
}
