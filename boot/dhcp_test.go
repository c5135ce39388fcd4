package boot

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"

	"github.com/better-compute/bcd/protocol"
)

var (
	testServerIP = netip.MustParseAddr("10.99.0.1")
	testURL      = "http://10.99.0.1:8080"
	testMAC      = mustMAC("52:54:00:12:34:56")
	testGUID     = append([]byte{0}, 0x33, 0x22, 0x11, 0x00, 0x55, 0x44, 0x77, 0x66, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff)
)

func mustMAC(s string) net.HardwareAddr {
	m, err := protocol.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// recorder is an Observer that keeps what it hears.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) Observe(e Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) all() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

func tableOf(t testing.TB, macs ...net.HardwareAddr) *MemTable {
	t.Helper()
	var tab MemTable
	m := map[string]Entry{}
	for _, mac := range macs {
		m[mac.String()] = Entry{Mode: ModeRamdisk}
	}
	if err := tab.Set(m); err != nil {
		t.Fatal(err)
	}
	return &tab
}

// proxyHarness runs a ProxyDHCP on loopback whose broadcasts go to client.
type proxyHarness struct {
	srv       *ProxyDHCP
	conn      *net.UDPConn // where the server's broadcasts land
	dhcp, pxe netip.AddrPort
	events    *recorder
}

func startProxy(t testing.TB, configure func(*ProxyDHCP)) *proxyHarness {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h := &proxyHarness{conn: conn, events: &recorder{}}
	h.srv = &ProxyDHCP{
		ServerIP:      testServerIP,
		URL:           testURL,
		Table:         tableOf(t, testMAC),
		Observer:      h.events,
		Addr:          "127.0.0.1:0",
		PXEAddr:       "127.0.0.1:0",
		BroadcastAddr: conn.LocalAddr().(*net.UDPAddr).AddrPort(),
	}
	if configure != nil {
		configure(h.srv)
	}
	if err := h.srv.Listen(); err != nil {
		t.Fatal(err)
	}
	h.dhcp, h.pxe = h.srv.Addrs()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return h
}

// client is nclient4, the DHCP client of insomniacslk/dhcp, on the harness's socket.
func (h *proxyHarness) client(t testing.TB, mac net.HardwareAddr) *nclient4.Client {
	t.Helper()
	c, err := nclient4.NewWithConn(h.conn, mac, nclient4.WithServerAddr(net.UDPAddrFromAddrPort(h.dhcp)),
		nclient4.WithTimeout(300*time.Millisecond), nclient4.WithRetry(1))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// pxeRequest is a PXE client's DISCOVER (or, with modifiers, any message).
func pxeRequest(t testing.TB, mac net.HardwareAddr, arch uint16, class string, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	base := []dhcpv4.Modifier{
		dhcpv4.WithHwAddr(mac),
		dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover),
		dhcpv4.WithGeneric(dhcpv4.OptionClassIdentifier, []byte(class)),
		dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{byte(arch >> 8), byte(arch)}),
		dhcpv4.WithGeneric(dhcpv4.OptionClientNetworkInterfaceIdentifier, []byte{1, 2, 1}),
		dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, testGUID),
	}
	p, err := dhcpv4.New(append(base, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// answer is what a test checks of a reply.
type answer struct {
	Type        string
	YourIP      string
	ServerIP    string
	ClientIP    string
	Broadcast   bool
	SName, File string
	ServerID    string
	VendorClass string
	GUID        []byte
	Vendor43    []byte
}

func summarize(p *dhcpv4.DHCPv4) answer {
	return answer{
		Type:        p.MessageType().String(),
		YourIP:      p.YourIPAddr.String(),
		ServerIP:    p.ServerIPAddr.String(),
		ClientIP:    p.ClientIPAddr.String(),
		Broadcast:   p.IsBroadcast(),
		SName:       p.ServerHostName,
		File:        p.BootFileName,
		ServerID:    net.IP(p.Options[optServerID]).String(),
		VendorClass: string(p.Options[optClassID]),
		GUID:        p.Options[optClientGUID],
		Vendor43:    p.Options[optVendorSpecific],
	}
}

func offer(file string, vendor43 []byte) answer {
	a := answer{Type: "OFFER", YourIP: "0.0.0.0", ServerIP: "10.99.0.1", ClientIP: "0.0.0.0", Broadcast: true,
		File: file, ServerID: "10.99.0.1", VendorClass: "PXEClient", GUID: testGUID, Vendor43: vendor43}
	if len(file) > 0 && file[0] != 'h' {
		a.SName = "10.99.0.1"
	}
	return a
}

func TestProxyDHCPPicksTheBootFile(t *testing.T) {
	script := testURL + "/ipxe/" + testMAC.String() + ".ipxe"
	discovery := []byte{6, 1, 8, 255}
	httpOffer := offer(testURL+"/ipxe/ipxe.efi", nil)
	httpOffer.VendorClass = "HTTPClient"
	for _, tc := range []struct {
		name      string
		arch      uint16
		class     string
		mods      []dhcpv4.Modifier
		configure func(*ProxyDHCP)
		want      answer
	}{
		{name: "BIOS PXE ROM", arch: 0, class: "PXEClient:Arch:00000:UNDI:002001", want: offer("undionly.kpxe", discovery)},
		{name: "UEFI x64 (7)", arch: 7, class: "PXEClient:Arch:00007:UNDI:003000", want: offer("ipxe.efi", nil)},
		{name: "UEFI x64 (9)", arch: 9, class: "PXEClient:Arch:00009:UNDI:003000", want: offer("ipxe.efi", nil)},
		{name: "UEFI IA32 (6)", arch: 6, class: "PXEClient:Arch:00006:UNDI:003000", want: offer("ipxe.efi", nil)},
		{name: "UEFI x64 with snponly", arch: 7, class: "PXEClient:Arch:00007:UNDI:003000",
			configure: func(s *ProxyDHCP) { s.EFIBinary = "snponly.efi" }, want: offer("snponly.efi", nil)},
		{name: "UEFI arm64", arch: 11, class: "PXEClient:Arch:00011:UNDI:003000", want: offer("ipxe-arm64.efi", nil)},
		{name: "UEFI HTTP boot", arch: 16, class: "HTTPClient:Arch:00016:UNDI:003001", want: httpOffer},
		{name: "iPXE user class, BIOS", arch: 0, class: "PXEClient:Arch:00000:UNDI:002001",
			mods: []dhcpv4.Modifier{dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE"))}, want: offer(script, nil)},
		{name: "iPXE user class RFC 3004", arch: 7, class: "PXEClient:Arch:00007:UNDI:003010",
			mods: []dhcpv4.Modifier{dhcpv4.WithUserClass("iPXE", true)}, want: offer(script, nil)},
		{name: "iPXE option 175, UEFI", arch: 7, class: "PXEClient:Arch:00007:UNDI:003010",
			mods: []dhcpv4.Modifier{dhcpv4.WithGeneric(dhcpv4.GenericOptionCode(175), []byte{0xb1, 0x05, 0x01, 0x80, 0x86, 0x10, 0x0e})}, want: offer(script, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startProxy(t, tc.configure)
			c := h.client(t, testMAC)
			req := pxeRequest(t, testMAC, tc.arch, tc.class, tc.mods...)
			reply, err := c.SendAndRead(context.Background(), net.UDPAddrFromAddrPort(h.dhcp), req, nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if reply.TransactionID != req.TransactionID {
				t.Errorf("xid %s, want %s", reply.TransactionID, req.TransactionID)
			}
			if diff := cmp.Diff(tc.want, summarize(reply)); diff != "" {
				t.Errorf("reply (-want +got):\n%s", diff)
			}
			if got := h.srv.Stats(); got.Offers != 1 || got.Received != 1 {
				t.Errorf("stats %+v, want one packet, one offer", got)
			}
		})
	}
}

func TestProxyDHCPStaysSilent(t *testing.T) {
	other := mustMAC("52:54:00:ff:ff:ff")
	for _, tc := range []struct {
		name string
		mac  net.HardwareAddr
		req  func(t testing.TB) *dhcpv4.DHCPv4
	}{
		{name: "not a PXE client", mac: testMAC, req: func(t testing.TB) *dhcpv4.DHCPv4 {
			return pxeRequest(t, testMAC, 0, "udhcp 1.35.0")
		}},
		{name: "no vendor class", mac: testMAC, req: func(t testing.TB) *dhcpv4.DHCPv4 {
			return pxeRequest(t, testMAC, 0, "", dhcpv4.WithoutOption(dhcpv4.OptionClassIdentifier))
		}},
		{name: "MAC without an entry", mac: other, req: func(t testing.TB) *dhcpv4.DHCPv4 {
			return pxeRequest(t, other, 0, "PXEClient:Arch:00000:UNDI:002001")
		}},
		{name: "architecture without a binary", mac: testMAC, req: func(t testing.TB) *dhcpv4.DHCPv4 {
			return pxeRequest(t, testMAC, 2, "PXEClient:Arch:00002:UNDI:002001")
		}},
		{name: "REQUEST to the site DHCP server on 67", mac: testMAC, req: func(t testing.TB) *dhcpv4.DHCPv4 {
			return pxeRequest(t, testMAC, 0, "PXEClient:Arch:00000:UNDI:002001",
				dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 99, 0, 254))))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := startProxy(t, nil)
			c := h.client(t, tc.mac)
			reply, err := c.SendAndRead(context.Background(), net.UDPAddrFromAddrPort(h.dhcp), tc.req(t), nil)
			if !errors.Is(err, nclient4.ErrNoResponse) {
				t.Fatalf("got %v, %v; want no response", reply, err)
			}
			if got := h.srv.Stats(); got.Ignored == 0 || got.Offers != 0 || got.Acks != 0 {
				t.Errorf("stats %+v, want ignored and nothing sent", got)
			}
			if ev := h.events.all(); len(ev) != 0 {
				t.Errorf("observer heard %v", ev)
			}
		})
	}
}

// TestProxyDHCPFollowUp is the second half of EDK2's and iPXE's exchange: a REQUEST
// to port 4011 from the address the site DHCP gave, carrying only "PXEClient".
func TestProxyDHCPFollowUp(t *testing.T) {
	h := startProxy(t, nil)
	c := h.client(t, testMAC)
	req := pxeRequest(t, testMAC, 7, "PXEClient",
		dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
		dhcpv4.WithClientIP(net.IPv4(127, 0, 0, 1)),
		dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{71, 4, 0x80, 0, 0, 0, 255}))
	reply, err := c.SendAndRead(context.Background(), net.UDPAddrFromAddrPort(h.pxe), req, nil)
	if err != nil {
		t.Fatalf("no answer on the PXE port: %v", err)
	}
	want := answer{Type: "ACK", YourIP: "0.0.0.0", ServerIP: "10.99.0.1", ClientIP: "127.0.0.1",
		SName: "10.99.0.1", File: "ipxe.efi", ServerID: "10.99.0.1", VendorClass: "PXEClient", GUID: testGUID,
		Vendor43: []byte{71, 4, 0x80, 0, 0, 0, 255}}
	if diff := cmp.Diff(want, summarize(reply)); diff != "" {
		t.Errorf("reply (-want +got):\n%s", diff)
	}
	ev := h.events.all()
	if len(ev) != 1 {
		t.Fatalf("observer heard %d events, want 1", len(ev))
	}
	got := ev[0]
	got.Time = time.Time{}
	wantEv := Event{Served: ServedAck, MAC: testMAC, IP: netip.MustParseAddr("127.0.0.1"), Arch: 7,
		GUID: "00112233-4455-6677-8899-aabbccddeeff", File: "ipxe.efi"}
	if diff := cmp.Diff(wantEv, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("event (-want +got):\n%s", diff)
	}
	// The same request on port 67 is another server's business.
	if _, err := c.SendAndRead(context.Background(), net.UDPAddrFromAddrPort(h.dhcp), req, nil); !errors.Is(err, nclient4.ErrNoResponse) {
		t.Errorf("a REQUEST on the DHCP port was answered: %v", err)
	}
}

// TestProxyDHCPRelay: a DISCOVER relayed from another subnet (giaddr set) is
// answered to the relay agent's server port, not broadcast.
func TestProxyDHCPRelay(t *testing.T) {
	h := startProxy(t, nil)
	relay, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: int(h.dhcp.Port())})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	req := pxeRequest(t, testMAC, 0, "PXEClient:Arch:00000:UNDI:002001",
		dhcpv4.WithGatewayIP(net.IPv4(127, 0, 0, 2)),
		dhcpv4.WithGeneric(dhcpv4.OptionRelayAgentInformation, []byte{1, 3, 'e', 't', '0'}))
	if _, err := relay.WriteToUDPAddrPort(req.ToBytes(), h.dhcp); err != nil {
		t.Fatal(err)
	}
	relay.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1500)
	n, from, err := relay.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("the relay heard nothing: %v", err)
	}
	if from != h.dhcp {
		t.Errorf("reply from %s, want the server's DHCP socket %s", from, h.dhcp)
	}
	reply, err := dhcpv4.FromBytes(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	if !reply.GatewayIPAddr.Equal(net.IPv4(127, 0, 0, 2)) || reply.BootFileName != "undionly.kpxe" {
		t.Errorf("reply giaddr %s file %q", reply.GatewayIPAddr, reply.BootFileName)
	}
	if got := string(reply.Options[optRelayAgentInfo]); got != "\x01\x03et0" {
		t.Errorf("relay agent information %q not echoed", got)
	}
	// Nothing was broadcast to the client's own port.
	h.conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, _, err := h.conn.ReadFromUDPAddrPort(buf); err == nil {
		t.Error("a relayed request was also answered by broadcast")
	}
}

// TestProxyDHCPMalformed: garbage is dropped and counted, and the server still
// answers afterwards.
func TestProxyDHCPMalformed(t *testing.T) {
	h := startProxy(t, nil)
	bad := pxeRequest(t, testMAC, 0, "PXEClient:Arch:00000:UNDI:002001").ToBytes()
	badArch := pxeRequest(t, testMAC, 0, "PXEClient", dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{7})).ToBytes()
	badGUID := pxeRequest(t, testMAC, 0, "PXEClient", dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, []byte{0, 1, 2})).ToBytes()
	packets := [][]byte{
		{},
		[]byte("hello"),
		bad[:100],                      // cut in the header
		append(bad[:240:240], 53, 200), // an option longer than the packet
		badArch,
		badGUID,
	}
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(h.dhcp))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, p := range packets {
		if _, err := c.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	cl := h.client(t, testMAC)
	if _, err := cl.SendAndRead(context.Background(), net.UDPAddrFromAddrPort(h.dhcp), pxeRequest(t, testMAC, 0, "PXEClient:Arch:00000:UNDI:002001"), nil); err != nil {
		t.Fatalf("no answer after malformed packets: %v", err)
	}
	// The answer can overtake the accounting of a bad packet that another
	// listener's loop is still deciding on: wait until every packet read is
	// accounted for.
	got := h.srv.Stats()
	for deadline := time.Now().Add(5 * time.Second); got.Received != got.Malformed+got.Ignored+got.Offers+got.Acks ||
		got.Received < uint64(len(packets))+1; got = h.srv.Stats() {
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if got.Malformed != uint64(len(packets)) || got.Offers != 1 {
		t.Errorf("stats %+v, want %d malformed and 1 offer", got, len(packets))
	}
}

func TestProxyDHCPConfiguration(t *testing.T) {
	for _, tc := range []struct {
		name string
		srv  *ProxyDHCP
	}{
		{"no server IP", &ProxyDHCP{URL: testURL, Table: &MemTable{}, BroadcastAddr: netip.MustParseAddrPort("127.0.0.1:68")}},
		{"IPv6 server IP", &ProxyDHCP{ServerIP: netip.MustParseAddr("::1"), URL: testURL, Table: &MemTable{}, BroadcastAddr: netip.MustParseAddrPort("127.0.0.1:68")}},
		{"no table", &ProxyDHCP{ServerIP: testServerIP, URL: testURL, BroadcastAddr: netip.MustParseAddrPort("127.0.0.1:68")}},
		{"no URL", &ProxyDHCP{ServerIP: testServerIP, Table: &MemTable{}, BroadcastAddr: netip.MustParseAddrPort("127.0.0.1:68")}},
		{"URL too long", &ProxyDHCP{ServerIP: testServerIP, Table: &MemTable{}, URL: "http://boot.example.com/" + strings.Repeat("a", 100), BroadcastAddr: netip.MustParseAddrPort("127.0.0.1:68")}},
		{"broadcast without an interface", &ProxyDHCP{ServerIP: testServerIP, URL: testURL, Table: &MemTable{}}},
		{"interface that does not exist", &ProxyDHCP{Interface: "bcd-nonexistent0", ServerIP: testServerIP, URL: testURL, Table: &MemTable{}}},
		{"server IP not on the interface", &ProxyDHCP{Interface: "lo", ServerIP: testServerIP, URL: testURL, Table: &MemTable{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.srv.Listen(); err == nil {
				t.Error("Listen accepted it")
			} else {
				t.Log(err)
			}
		})
	}
}

// TestProxyDHCPLocalEntry: a machine whose entry is local gets its local script only
// when iPXE asks; firmware PXE and HTTP boot get a boot file no server has, so they
// fail at once and the firmware moves on to its disk.
func TestProxyDHCPLocalEntry(t *testing.T) {
	script := testURL + "/ipxe/" + testMAC.String() + ".ipxe"
	httpOffer := offer(testURL+"/ipxe/"+LocalBootFile, nil)
	httpOffer.VendorClass = "HTTPClient"
	for _, tc := range []struct {
		name  string
		arch  uint16
		class string
		mods  []dhcpv4.Modifier
		want  answer
	}{
		{name: "iPXE", arch: 7, class: "PXEClient:Arch:00007:UNDI:003010",
			mods: []dhcpv4.Modifier{dhcpv4.WithUserClass("iPXE", true)}, want: offer(script, nil)},
		{name: "UEFI PXE", arch: 7, class: "PXEClient:Arch:00007:UNDI:003000", want: offer(LocalBootFile, nil)},
		{name: "UEFI HTTP boot", arch: 16, class: "HTTPClient:Arch:00016:UNDI:003001", want: httpOffer},
		{name: "BIOS PXE ROM", arch: 0, class: "PXEClient:Arch:00000:UNDI:002001", want: offer(LocalBootFile, []byte{6, 1, 8, 255})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startProxy(t, func(s *ProxyDHCP) {
				var tab MemTable
				if err := tab.Set(map[string]Entry{testMAC.String(): {Mode: ModeLocal}}); err != nil {
					t.Fatal(err)
				}
				s.Table = &tab
			})
			c := h.client(t, testMAC)
			reply, err := c.SendAndRead(context.Background(), net.UDPAddrFromAddrPort(h.dhcp), pxeRequest(t, testMAC, tc.arch, tc.class, tc.mods...), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if diff := cmp.Diff(tc.want, summarize(reply)); diff != "" {
				t.Errorf("reply (-want +got):\n%s", diff)
			}
		})
	}
}
