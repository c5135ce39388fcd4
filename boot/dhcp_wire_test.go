package boot

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// wireCases are requests that reach every branch of decide and appendReply, as
// datagrams, with the port they arrive on.
func wireCases(t testing.TB) (cases [][]byte, pxe []bool) {
	add := func(b []byte, p bool) { cases, pxe = append(cases, b), append(pxe, p) }
	for _, g := range goldenRequests {
		add(readGolden(t, g), g.pxePort)
	}
	local := mustMAC("52:54:00:00:00:0f")
	unknown := mustMAC("52:54:00:00:00:ee")
	ipxeUC := dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE"))
	rfc3004 := dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte{3, 'f', 'o', 'o', 4, 'i', 'P', 'X', 'E'})
	relay := []dhcpv4.Modifier{dhcpv4.WithGatewayIP(net.IPv4(10, 0, 0, 1)), dhcpv4.WithGeneric(dhcpv4.OptionRelayAgentInformation, []byte{1, 3, 'e', 't', 'h'})}
	for _, mac := range []net.HardwareAddr{testMAC, local, unknown} {
		for _, c := range []struct {
			arch  uint16
			class string
			mods  []dhcpv4.Modifier
		}{
			{0, "PXEClient:Arch:00000:UNDI:002001", nil},
			{0, "PXEClient:Arch:00000:UNDI:002001", []dhcpv4.Modifier{ipxeUC}},
			{7, "PXEClient:Arch:00007:UNDI:003000", nil},
			{7, "PXEClient:Arch:00007:UNDI:003010", []dhcpv4.Modifier{rfc3004}},
			{9, "PXEClient:Arch:00009:UNDI:003000", nil},
			{6, "PXEClient:Arch:00006:UNDI:003000", nil},
			{11, "PXEClient:Arch:00011:UNDI:003000", relay},
			{16, "HTTPClient:Arch:00016:UNDI:003001", nil},
			{19, "HTTPClient:Arch:00019:UNDI:003001", relay},
			{42, "PXEClient:Arch:00042:UNDI:003000", nil},
			{7, "MSFT 5.0", nil},
			{7, "PXEClient", []dhcpv4.Modifier{dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 9)),
				dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{71, 4, 0x80, 0, 0, 0, 255})}},
			{0, "PXEClient", []dhcpv4.Modifier{dhcpv4.WithMessageType(dhcpv4.MessageTypeInform)}},
			{7, "PXEClient", []dhcpv4.Modifier{dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease)}},
			{7, "PXEClient", []dhcpv4.Modifier{dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, []byte{0, 1})}},
			{7, "PXEClient", []dhcpv4.Modifier{dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{0})}},
			{7, "PXEClient", []dhcpv4.Modifier{dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{})}},
			{7, "PXEClient", []dhcpv4.Modifier{dhcpv4.WithGeneric(dhcpv4.OptionDHCPMessageType, []byte{1, 1})}},
			{7, "PXEClient", []dhcpv4.Modifier{dhcpv4.WithGeneric(dhcpv4.GenericOptionCode(optIPXEEncap), []byte{})}},
		} {
			p := pxeRequest(t, mac, c.arch, c.class, c.mods...)
			b := p.ToBytes()
			add(b, false)
			add(b, true)
		}
	}
	// No option 93, iPXE or not.
	p := pxeRequest(t, testMAC, 0, "PXEClient", ipxeUC)
	p.Options.Del(dhcpv4.OptionClientSystemArchitectureType)
	add(p.ToBytes(), false)
	p.Options.Del(dhcpv4.OptionUserClassInformation)
	add(p.ToBytes(), false)
	// A BOOTREPLY, a hardware address that is not Ethernet's, truncated packets, no
	// End, a bad cookie, an option past the end.
	b := pxeRequest(t, testMAC, 7, "PXEClient").ToBytes()
	reply := bytes.Clone(b)
	reply[0] = 2
	add(reply, false)
	hlen := bytes.Clone(b)
	hlen[2] = 20
	add(hlen, false)
	for _, n := range []int{0, 1, 100, 239, 240, 241, 250} {
		add(b[:n], false)
	}
	noEnd := bytes.Clone(b)
	noEnd[bytes.LastIndexByte(noEnd, 255)] = 0
	add(noEnd, false)
	cookie := bytes.Clone(b)
	cookie[237] = 0
	add(cookie, false)
	add(append(bytes.Clone(b[:optionsStart]), 60, 200, 'P'), false)
	// RFC 3396: options repeated, which the fast path leaves to dhcpv4.
	rep := bytes.Clone(b[:optionsStart])
	rep = append(rep, 53, 1, 1, 60, 5, 'P', 'X', 'E', 'C', 'l', 60, 4, 'i', 'e', 'n', 't', 93, 2, 0, 7, 97, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 97, 8, 9, 10, 11, 12, 13, 14, 15, 16, 255)
	add(rep, false)
	rep2 := bytes.Clone(b[:optionsStart])
	rep2[24] = 10 // giaddr
	rep2 = append(rep2, 53, 1, 3, 60, 9, 'P', 'X', 'E', 'C', 'l', 'i', 'e', 'n', 't', 93, 2, 0, 0, 82, 255)
	rep2 = append(rep2, bytes.Repeat([]byte{1}, 255)...)
	rep2 = append(rep2, 82, 3, 1, 1, 'x', 43, 2, 71, 4, 43, 5, 0x80, 0, 0, 0, 255, 255)
	add(rep2, true)
	return cases, pxe
}

func wireServer(t testing.TB) *ProxyDHCP {
	var tab MemTable
	if err := tab.Set(map[string]Entry{testMAC.String(): {Mode: ModeRamdisk}, "52:54:00:00:00:0f": {Mode: ModeLocal}}); err != nil {
		t.Fatal(err)
	}
	s := &ProxyDHCP{ServerIP: testServerIP, URL: testURL + "/", Table: &tab, BroadcastAddr: netip.MustParseAddrPort("255.255.255.255:68")}
	if err := s.setup(); err != nil {
		t.Fatal(err)
	}
	s.dhcpPort = 67
	return s
}

// checkAgainstReference holds handle to the dhcpv4-based server it replaced: the same
// answer byte for byte, to the same place, and silence where it was silent.
func checkAgainstReference(t *testing.T, s *ProxyDHCP, b []byte, pxePort bool) {
	t.Helper()
	src := netip.MustParseAddrPort("10.99.0.7:68")
	wantReply, wantDst, why, wantOK := refHandle(s, b, pxePort, src)
	before := s.Stats()
	reply, dst, ok := s.handle(b, make([]byte, 0, 8), pxePort, src)
	after := s.Stats()
	if ok != wantOK || dst != wantDst || !bytes.Equal(reply, wantReply) {
		t.Fatalf("packet %x on 4011=%v:\n got %v %s %x\nwant %v %s %x (%s)", b, pxePort, ok, dst, reply, wantOK, wantDst, wantReply, why)
	}
	// The silence is counted where the old reason says.
	malformed := after.Malformed - before.Malformed
	ignored := after.Ignored - before.Ignored
	switch {
	case ok:
		if malformed+ignored != 0 {
			t.Fatalf("an answered packet counted malformed %d ignored %d", malformed, ignored)
		}
	case why == "parse" || why == whyMalformed:
		if malformed != 1 || ignored != 0 {
			t.Fatalf("%s: counted malformed %d ignored %d: %x", why, malformed, ignored, b)
		}
	default:
		if malformed != 0 || ignored != 1 {
			t.Fatalf("%s: counted malformed %d ignored %d: %x", why, malformed, ignored, b)
		}
	}
}

func TestFastPathMatchesReference(t *testing.T) {
	s := wireServer(t)
	cases, pxe := wireCases(t)
	for i, b := range cases {
		checkAgainstReference(t, s, b, pxe[i])
	}
	st := s.Stats()
	var sum uint64
	for _, n := range st.IgnoredByReason {
		sum += n
	}
	if sum != st.Ignored {
		t.Errorf("IgnoredByReason %v adds up to %d, Ignored is %d", st.IgnoredByReason, sum, st.Ignored)
	}
	for _, r := range []string{IgnoredNotPXE, IgnoredNoEntry, IgnoredNoBinary, IgnoredRequest67, IgnoredOther} {
		if st.IgnoredByReason[r] == 0 {
			t.Errorf("no packet ignored for %s: %v", r, st.IgnoredByReason)
		}
	}
	if st.Offers == 0 || st.Acks == 0 || st.Malformed == 0 {
		t.Errorf("stats %+v", st)
	}
}

// FuzzFastPathMatchesReference: for any datagram, the proxy answers as the
// dhcpv4-based server did.
func FuzzFastPathMatchesReference(f *testing.F) {
	cases, pxe := wireCases(f)
	for i, b := range cases {
		f.Add(b, pxe[i])
	}
	s := wireServer(f)
	f.Fuzz(func(t *testing.T, b []byte, pxePort bool) {
		checkAgainstReference(t, s, b, pxePort)
	})
}

// TestHandleAllocations: answering a PXE ROM allocates only the observer's event,
// and with no observer nothing.
func TestHandleAllocations(t *testing.T) {
	s := wireServer(t)
	b := pxeRequest(t, testMAC, 0, "PXEClient:Arch:00000:UNDI:002001").ToBytes()
	out := make([]byte, 0, 1024)
	src := netip.MustParseAddrPort("0.0.0.0:68")
	if n := testing.AllocsPerRun(100, func() {
		if _, _, ok := s.handle(b, out, false, src); !ok {
			t.Fatal("no answer")
		}
	}); n != 0 {
		t.Errorf("%v allocations per answer without an observer, want 0", n)
	}
}
