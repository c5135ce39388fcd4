package main

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/better-compute/bcd/boot"
)

// TestPXEPacketsAgainstProxyDHCP sends the load generator's DISCOVER and 4011
// REQUEST to a real boot.ProxyDHCP on loopback and reads its answers with the
// load generator's parser: what the benchmark sends is what the server answers.
func TestPXEPacketsAgainstProxyDHCP(t *testing.T) {
	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	mac := benchMAC(7)
	var table boot.MemTable
	if err := table.Set(map[string]boot.Entry{net.HardwareAddr(mac[:]).String(): {Mode: boot.ModeRamdisk}}); err != nil {
		t.Fatal(err)
	}
	srv := &boot.ProxyDHCP{
		ServerIP:      netip.MustParseAddr("127.0.0.1"),
		URL:           "http://127.0.0.1:8080",
		Table:         &table,
		Addr:          "127.0.0.1:0",
		PXEAddr:       "127.0.0.1:0",
		BroadcastAddr: client.LocalAddr().(*net.UDPAddr).AddrPort(),
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	dhcp, pxe := srv.Addrs()

	ask := func(pkt []byte, to netip.AddrPort) pxeReply {
		t.Helper()
		if _, err := client.WriteToUDPAddrPort(pkt, to); err != nil {
			t.Fatal(err)
		}
		client.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 2048)
		n, _, err := client.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("no answer: %v (stats %+v)", err, srv.Stats())
		}
		r, ok := parsePXEReply(buf[:n])
		if !ok {
			t.Fatalf("answer not parsed: % x", buf[:n])
		}
		return r
	}
	offer := ask(appendPXE(nil, msgDiscover, 0x1234_5601, mac, netip.Addr{}, [4]byte{}, fwBIOS), dhcp)
	if offer.xid != 0x1234_5601 || offer.msg != msgOffer || !offer.usable {
		t.Errorf("offer %+v", offer)
	}
	ack := ask(appendPXE(nil, msgRequest, 0x1234_5701, mac, netip.MustParseAddr("127.0.0.1"), [4]byte{0x80, 0, 0, 0}, fwBIOS), pxe)
	if ack.xid != 0x1234_5701 || ack.msg != msgAck || !ack.usable || ack.item != [4]byte{0x80, 0, 0, 0} {
		t.Errorf("ack %+v", ack)
	}
	if st := srv.Stats(); st.Offers != 1 || st.Acks != 1 {
		t.Errorf("server stats %+v", st)
	}
}

// TestAppendPXEIsDHCP checks the hand-built packets with a general DHCP codec.
func TestAppendPXEIsDHCP(t *testing.T) {
	mac := benchMAC(0x0102)
	b := appendPXE(nil, msgRequest, 42, mac, netip.MustParseAddr("10.77.1.2"), [4]byte{0x80, 0, 0, 0}, fwBIOS)
	if len(b) < minPacket {
		t.Errorf("%d bytes, below BOOTP's %d", len(b), minPacket)
	}
	p, err := dhcpv4.FromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	if p.TransactionID != [4]byte{0, 0, 0, 42} || p.MessageType() != dhcpv4.MessageTypeRequest ||
		p.ClientHWAddr.String() != "02:bc:be:00:01:02" || !p.ClientIPAddr.Equal(net.IPv4(10, 77, 1, 2)) ||
		p.ClassIdentifier() != pxeClass || p.IsBroadcast() {
		t.Errorf("request: %s", p.Summary())
	}
	if got := p.Options.Get(dhcpv4.OptionVendorSpecificInformation); string(got) != "\x47\x04\x80\x00\x00\x00\xff" {
		t.Errorf("option 43 % x", got)
	}
	d, err := dhcpv4.FromBytes(appendPXE(nil, msgDiscover, 43, mac, netip.Addr{}, [4]byte{}, fwBIOS))
	if err != nil {
		t.Fatal(err)
	}
	if d.MessageType() != dhcpv4.MessageTypeDiscover || !d.IsBroadcast() || !d.ClientIPAddr.IsUnspecified() || d.Options.Has(dhcpv4.OptionVendorSpecificInformation) {
		t.Errorf("discover: %s", d.Summary())
	}
}

// dnsmasqOffer is the proxy OFFER dnsmasq 2.90 sent the benchmark's DISCOVER
// (captured with tcpdump): no siaddr and no file's server, but a boot menu whose
// item the ROM asks for on port 4011.
func dnsmasqOffer(t testing.TB) []byte {
	mac := benchMAC(0)
	p, err := dhcpv4.New(
		dhcpv4.WithReply(&dhcpv4.DHCPv4{OpCode: dhcpv4.OpcodeBootRequest, HWType: 1, ClientHWAddr: mac[:], TransactionID: [4]byte{0, 0, 1, 0}}),
		dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer),
		dhcpv4.WithGeneric(dhcpv4.OptionClassIdentifier, []byte("PXEClient")),
		dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{6, 1, 3, 10, 4, 0, 80, 88, 69, 8, 7, 128, 0, 1, 10, 88, 0, 1, 9, 6, 128, 0, 3, 80, 88, 69, 255}),
	)
	if err != nil {
		t.Fatal(err)
	}
	p.ServerIPAddr = net.IPv4zero
	p.BootFileName = "undionly.kpxe"
	return p.ToBytes()
}

func TestParseDnsmasqOffer(t *testing.T) {
	r, ok := parsePXEReply(dnsmasqOffer(t))
	if !ok || r.msg != msgOffer || r.xid != 0x100 || !r.usable || r.item != [4]byte{0x80, 0, 0, 0} {
		t.Errorf("parsed %+v, ok %v", r, ok)
	}
	// Without the menu, an offer without siaddr boots nothing.
	b := dnsmasqOffer(t)
	p, _ := dhcpv4.FromBytes(b)
	p.Options.Del(dhcpv4.OptionVendorSpecificInformation)
	if r, ok := parsePXEReply(p.ToBytes()); !ok || r.usable {
		t.Errorf("an offer with neither siaddr nor menu parsed as %+v, ok %v", r, ok)
	}
}

// FuzzParsePXEReply: the parser reads whatever arrives at port 68.
func FuzzParsePXEReply(f *testing.F) {
	f.Add(dnsmasqOffer(f))
	f.Add(appendPXE(nil, msgDiscover, 1, benchMAC(1), netip.Addr{}, [4]byte{}, fwBIOS))
	f.Add([]byte{2})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, ok := parsePXEReply(b)
		if ok && r.msg == 0 {
			t.Errorf("ok without a message type")
		}
		firstMenuItem(b)
	})
}

// TestUEFIOfferWithoutFileIsUsable: dnsmasq answers an EFI client with a
// PXEClient offer naming the boot server and no file, and the firmware then asks
// that server on 4011 (../shared/captures/pxe-bios-ipxe-uefi-ovmf-and-ipxe.pcap).
func TestUEFIOfferWithoutFileIsUsable(t *testing.T) {
	b := make([]byte, bootpLen)
	b[0] = opBootReply
	copy(b[20:24], []byte{10, 99, 0, 1})
	b = append(b, magicCookie...)
	b = append(b, optMsgType, 1, msgOffer, optClassID, 9)
	b = append(b, "PXEClient"...)
	b = append(b, optEnd)
	r, ok := parsePXEReply(b)
	if !ok || !r.usable {
		t.Errorf("PXEClient offer with siaddr: ok %v, usable %v", ok, r.usable)
	}
	copy(b[20:24], []byte{0, 0, 0, 0}) // no boot server: nothing to ask
	if r, _ := parsePXEReply(b); r.usable {
		t.Error("an offer without siaddr is usable")
	}
}
