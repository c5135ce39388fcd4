package boot

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/insomniacslk/dhcp/dhcpv4"
)

// captures holds the testbed's packet captures (testdata/captures/README.md), kept
// in the repository so that no test reads a path outside it; only
// UPDATE_TESTDATA=1 reads them, to refresh testdata/dhcp.
var captures = filepath.Join("testdata", "captures")

// goldenRequest is one DHCP request of real firmware, captured in the QEMU testbed
// (testdata/captures/README.md) and kept in testdata/dhcp as its UDP payload.
type goldenRequest struct {
	file    string // under testdata/dhcp
	capture string // pcap file under testdata/captures
	index   int    // UDP record in it
	src     string // where it came from
	pxePort bool   // sent to 4011
}

var goldenRequests = []goldenRequest{
	{"seabios-ipxe-discover.bin", "pxe-bios-ipxe-uefi-ovmf-and-ipxe.pcap", 0, "0.0.0.0:68", false},
	{"seabios-ipxe-request.bin", "pxe-bios-ipxe-uefi-ovmf-and-ipxe.pcap", 3, "0.0.0.0:68", false},
	{"seabios-ipxe-4011.bin", "pxe-bios-ipxe-uefi-ovmf-and-ipxe.pcap", 5, "10.99.0.115:68", true},
	{"udhcpc-discover.bin", "pxe-bios-ipxe-uefi-ovmf-and-ipxe.pcap", 7, "0.0.0.0:68", false},
	{"ipxe-efi-discover.bin", "pxe-bios-ipxe-uefi-ovmf-and-ipxe.pcap", 22, "0.0.0.0:68", false},
	{"ipxe-efi-4011.bin", "pxe-bios-ipxe-uefi-ovmf-and-ipxe.pcap", 27, "10.99.0.131:68", true},
	{"ovmf-pxe-discover.bin", "pxe-bios-ipxe-uefi-ovmf-and-ipxe.pcap", 33, "0.0.0.0:68", false},
	{"ovmf-pxe-request.bin", "pxe-bios-ipxe-uefi-ovmf-and-ipxe.pcap", 36, "0.0.0.0:68", false},
	{"ovmf-pxe-4011.bin", "pxe-bios-ipxe-uefi-ovmf-and-ipxe.pcap", 38, "10.99.0.132:4011", true},
	{"seabios-ipxe-8-discover.bin", "pxe-8-bios-ipxe-concurrent.pcap", 11, "0.0.0.0:68", false},
}

// readGolden returns a golden request's payload, first extracting it from its
// capture under UPDATE_TESTDATA=1.
func readGolden(t testing.TB, g goldenRequest) []byte {
	t.Helper()
	path := filepath.Join("testdata", "dhcp", g.file)
	if os.Getenv("UPDATE_TESTDATA") == "1" {
		recs, err := readPcap(filepath.Join(captures, g.capture))
		if err != nil {
			t.Fatal(err)
		}
		r := recs[g.index]
		if r.Src.String() != g.src {
			t.Fatalf("%s record %d comes from %s, want %s: the capture changed", g.capture, g.index, r.Src, g.src)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, r.Payload, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (UPDATE_TESTDATA=1 extracts it from %s)", err, g.capture)
	}
	return b
}

// TestProxyDHCPGolden replays the requests of real firmware (SeaBIOS with QEMU's iPXE
// ROM, OVMF's own EDK2 PXE, iPXE EFI, and busybox udhcpc from the booted ramdisk)
// and checks each gets the answer that boots it, sent where that firmware listens.
func TestProxyDHCPGolden(t *testing.T) {
	macs := []net.HardwareAddr{mustMAC("52:54:00:99:00:10"), mustMAC("52:54:00:99:00:20"), mustMAC("52:54:00:99:00:21")}
	for i := 0x10; i <= 0x17; i++ {
		macs = append(macs, net.HardwareAddr{0x52, 0x54, 0x00, 0x99, 0x01, byte(i)})
	}
	recs := map[string]bool{}
	for _, g := range goldenRequests {
		recs[g.file] = true
	}
	s := &ProxyDHCP{ServerIP: testServerIP, URL: testURL, Table: tableOf(t, macs...), BroadcastAddr: netip.MustParseAddrPort("255.255.255.255:68")}
	if err := s.setup(); err != nil {
		t.Fatal(err)
	}
	s.dhcpPort = 67
	bcast := netip.MustParseAddrPort("255.255.255.255:68")
	type want struct {
		answer answer
		dst    netip.AddrPort
	}
	noGUID := func(a answer) answer { a.GUID = make([]byte, 17); return a }
	for _, tc := range []struct {
		file string
		want *want
	}{
		// SeaBIOS's ROM is iPXE already (user class iPXE): straight to the script.
		{"seabios-ipxe-discover.bin", &want{noGUID(offer(testURL+"/ipxe/52:54:00:99:00:10.ipxe", nil)), bcast}},
		{"seabios-ipxe-8-discover.bin", nil}, // a MAC without an entry
		// Its REQUEST goes to the site DHCP server.
		{"seabios-ipxe-request.bin", nil},
		// iPXE follows up on 4011 from its new address; the answer goes back there.
		{"seabios-ipxe-4011.bin", &want{answer{Type: "ACK", YourIP: "0.0.0.0", ServerIP: "10.99.0.1", ClientIP: "10.99.0.115",
			Broadcast: true, File: testURL + "/ipxe/52:54:00:99:00:10.ipxe", ServerID: "10.99.0.1", VendorClass: "PXEClient",
			GUID: make([]byte, 17), Vendor43: []byte{71, 4, 0x80, 0, 0, 0, 255}}, netip.MustParseAddrPort("10.99.0.115:68")}},
		{"ipxe-efi-discover.bin", &want{noGUID(offer(testURL+"/ipxe/52:54:00:99:00:20.ipxe", nil)), bcast}},
		{"ipxe-efi-4011.bin", &want{answer{Type: "ACK", YourIP: "0.0.0.0", ServerIP: "10.99.0.1", ClientIP: "10.99.0.131",
			Broadcast: true, File: testURL + "/ipxe/52:54:00:99:00:20.ipxe", ServerID: "10.99.0.1", VendorClass: "PXEClient",
			GUID: make([]byte, 17)}, netip.MustParseAddrPort("10.99.0.131:68")}},
		// OVMF's EDK2 PXE (arch 7, no user class) gets iPXE EFI over TFTP, with no
		// option 43 so that it asks again on 4011 as it does with dnsmasq.
		{"ovmf-pxe-discover.bin", &want{noGUID(offer("ipxe.efi", nil)), bcast}},
		{"ovmf-pxe-request.bin", nil},
		{"ovmf-pxe-4011.bin", &want{answer{Type: "ACK", YourIP: "0.0.0.0", ServerIP: "10.99.0.1", ClientIP: "10.99.0.132",
			SName: "10.99.0.1", File: "ipxe.efi", ServerID: "10.99.0.1", VendorClass: "PXEClient",
			GUID: make([]byte, 17)}, netip.MustParseAddrPort("10.99.0.132:4011")}},
		// The ramdisk's own DHCP client is no PXE client.
		{"udhcpc-discover.bin", nil},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var g goldenRequest
			for _, x := range goldenRequests {
				if x.file == tc.file {
					g = x
				}
			}
			b := readGolden(t, g)
			req, err := dhcpv4.FromBytes(b)
			if err != nil {
				t.Fatalf("golden packet does not parse: %v", err)
			}
			reply, dst, ok := s.handle(b, nil, g.pxePort, netip.MustParseAddrPort(g.src))
			if tc.want == nil {
				if ok {
					t.Fatalf("answered %s to %s", dst, req.ClientHWAddr)
				}
				return
			}
			if !ok {
				t.Fatalf("no answer to %s", req.Summary())
			}
			if dst != tc.want.dst {
				t.Errorf("sent to %s, want %s", dst, tc.want.dst)
			}
			p, err := dhcpv4.FromBytes(reply)
			if err != nil {
				t.Fatal(err)
			}
			if p.TransactionID != req.TransactionID || !bytes.Equal(p.ClientHWAddr, req.ClientHWAddr) {
				t.Errorf("reply xid %s chaddr %s, want %s %s", p.TransactionID, p.ClientHWAddr, req.TransactionID, req.ClientHWAddr)
			}
			if diff := cmp.Diff(tc.want.answer, summarize(p)); diff != "" {
				t.Errorf("reply (-want +got):\n%s", diff)
			}
		})
	}
}
