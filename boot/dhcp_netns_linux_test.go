package boot

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// TestProxyDHCPBroadcastOnAnInterface runs the proxyDHCP with its production
// defaults (ports 67 and 4011 on 0.0.0.0, replies to 255.255.255.255:68) bound to one
// veth of a test namespace, and a client in a second namespace that, like firmware,
// has no address yet. It proves the broadcast path, the port 4011 follow-up once the
// client has an address, and that a DISCOVER arriving on another interface of the
// server's namespace is never even read.
func TestProxyDHCPBroadcastOnAnInterface(t *testing.T) {
	srvNS := newNetns(t, "s")
	cliNS := newNetns(t, "c")
	veth(t, srvNS, "boot0", cliNS, "pxe0")
	veth(t, srvNS, "other0", cliNS, "other1")
	srvNS.ip(t, "addr", "add", "10.99.0.1/24", "dev", "boot0")
	srvNS.ip(t, "addr", "add", "10.98.0.1/24", "dev", "other0")

	srv := &ProxyDHCP{Interface: "boot0", ServerIP: netip.MustParseAddr("10.99.0.1"), URL: "http://10.99.0.1:8080", Table: tableOf(t, testMAC)}
	if err := srvNS.do(t, srv.Listen); err != nil {
		t.Fatalf("Listen in the server namespace: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { cancel(); <-done }()

	// The client's sockets, opened in its namespace: port 68 on each interface.
	var pxe0, other1 *net.UDPConn
	err := cliNS.do(t, func() error {
		var err error
		if pxe0, err = listenUDP("0.0.0.0:68", "pxe0"); err != nil {
			return err
		}
		other1, err = listenUDP("0.0.0.0:68", "other1")
		return err
	})
	if err != nil {
		t.Fatalf("client sockets: %v", err)
	}
	defer pxe0.Close()
	defer other1.Close()

	bcast := netip.MustParseAddrPort("255.255.255.255:67")
	discover := pxeRequest(t, testMAC, 7, "PXEClient:Arch:00007:UNDI:003000")
	read := func(c *net.UDPConn, wait time.Duration) (*dhcpv4.DHCPv4, netip.AddrPort, error) {
		c.SetReadDeadline(time.Now().Add(wait))
		buf := make([]byte, 1500)
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return nil, from, err
		}
		p, err := dhcpv4.FromBytes(buf[:n])
		return p, from, err
	}

	// On another interface of the server's namespace: not heard.
	if _, err := other1.WriteToUDPAddrPort(discover.ToBytes(), bcast); err != nil {
		t.Fatal(err)
	}
	// On the served interface: an OFFER by broadcast.
	if _, err := pxe0.WriteToUDPAddrPort(discover.ToBytes(), bcast); err != nil {
		t.Fatal(err)
	}
	offer, from, err := read(pxe0, 2*time.Second)
	if err != nil {
		t.Fatalf("no OFFER by broadcast: %v", err)
	}
	if from != netip.MustParseAddrPort("10.99.0.1:67") {
		t.Errorf("OFFER from %s, want 10.99.0.1:67", from)
	}
	if offer.MessageType() != dhcpv4.MessageTypeOffer || offer.BootFileName != "ipxe.efi" || !offer.ServerIPAddr.Equal(net.IPv4(10, 99, 0, 1)) {
		t.Errorf("OFFER %s", offer.Summary())
	}
	if _, _, err := read(other1, 300*time.Millisecond); err == nil {
		t.Error("the other interface got an answer")
	}
	if st := srv.Stats(); st.Received != 1 || st.Offers != 1 {
		t.Errorf("stats %+v: the server read a packet from another interface", st)
	}

	// The follow-up, from the address the site DHCP server gave, to port 4011.
	cliNS.ip(t, "addr", "add", "10.99.0.50/24", "dev", "pxe0")
	req := pxeRequest(t, testMAC, 7, "PXEClient", dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithClientIP(net.IPv4(10, 99, 0, 50)))
	if _, err := pxe0.WriteToUDPAddrPort(req.ToBytes(), netip.MustParseAddrPort("10.99.0.1:4011")); err != nil {
		t.Fatal(err)
	}
	ack, from, err := read(pxe0, 2*time.Second)
	if err != nil {
		t.Fatalf("no ACK from port 4011: %v", err)
	}
	if from != netip.MustParseAddrPort("10.99.0.1:4011") || ack.MessageType() != dhcpv4.MessageTypeAck || ack.BootFileName != "ipxe.efi" {
		t.Errorf("ACK from %s: %s", from, ack.Summary())
	}
}
