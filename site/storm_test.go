package site_test

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/site"
)

// TestBootStormCoalesced: 10,000 DHCP packets from 200 machines through the site's
// real proxyDHCP, reporter, journal and session reach the gateway as a bounded number
// of machine.booted events per machine and stage, whose counts add up to what the
// proxy served, and the site's EventStats say the same.
func TestBootStormCoalesced(t *testing.T) {
	const machines, packets = 200, 10000
	f := newFixture(t, protocol.RoleSite, true)
	var entries []protocol.BootEntry
	macs := make([]net.HardwareAddr, machines)
	for i := range macs {
		macs[i] = net.HardwareAddr{0x52, 0x54, 0, 0xaa, byte(i >> 8), byte(i)}
		entries = append(entries, protocol.BootEntry{MAC: macs[i].String(), Mode: protocol.BootRamdisk})
	}
	f.setSpec(protocol.Spec{Revision: 1, Sections: map[string]json.RawMessage{
		protocol.SectionBoot: section(t, protocol.BootSection{Entries: entries})}})
	s, _, _ := f.start(t, nil)
	// The boot servers listen once the spec is applied, after start returns.
	waitFor(t, "the proxyDHCP sockets", func() bool { a := s.Addrs(); return a.DHCP.IsValid() && a.PXE.IsValid() })
	waitFor(t, "the boot table", func() bool { return f.discover(t, s, macs[0].String(), 200*time.Millisecond) != nil })
	before, _ := s.DHCPStats()

	discover := func(mac net.HardwareAddr) []byte {
		p, err := dhcpv4.New(dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover),
			dhcpv4.WithGeneric(dhcpv4.OptionClassIdentifier, []byte("PXEClient:Arch:00000:UNDI:002001")),
			dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{0, 0}))
		if err != nil {
			t.Fatal(err)
		}
		return p.ToBytes()
	}
	request := func(mac net.HardwareAddr) []byte {
		p, err := dhcpv4.New(dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
			dhcpv4.WithClientIP(net.IPv4(127, 0, 0, 1)),
			dhcpv4.WithGeneric(dhcpv4.OptionClassIdentifier, []byte("PXEClient:Arch:00000:UNDI:002001")),
			dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{0, 0}))
		if err != nil {
			t.Fatal(err)
		}
		return p.ToBytes()
	}
	// Nine DISCOVERs to port 67 for each REQUEST to 4011, in windows of 64, each
	// window waiting (briefly) for the proxy to have read it: loopback drops what
	// overflows a socket buffer, and what counts is what the proxy served.
	go func() { // the answers are not looked at: keep the client's buffer empty
		buf := make([]byte, 1500)
		for {
			if _, _, err := f.dhcpCli.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
		}
	}()
	addrs := s.Addrs()
	start := time.Now()
	for i := 0; i < packets; i += 64 {
		for j := i; j < i+64 && j < packets; j++ {
			mac := macs[j%machines]
			pkt, dst := discover(mac), addrs.DHCP
			if (j/machines)%10 == 9 {
				pkt, dst = request(mac), addrs.PXE
			}
			binary.BigEndian.PutUint32(pkt[4:8], uint32(j))
			if _, err := f.dhcpCli.WriteToUDPAddrPort(pkt, dst); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(time.Second)
		for st, _ := s.DHCPStats(); st.Received-before.Received < uint64(min(i+64, packets)) && time.Now().Before(deadline); st, _ = s.DHCPStats() {
			time.Sleep(time.Millisecond)
		}
	}
	elapsed := time.Since(start)
	f.dhcpCli.SetReadDeadline(time.Now()) // ends the reader

	after, _ := s.DHCPStats()
	served := map[string]uint64{protocol.StageDHCP: after.Offers - before.Offers, protocol.StagePXE: after.Acks - before.Acks}
	if served[protocol.StageDHCP] < packets*9/10*9/10 || served[protocol.StagePXE] < packets/10*9/10 {
		t.Fatalf("the proxy served only %v of %d packets (stats %+v)", served, packets, after)
	}
	// Every serve reaches the gateway inside some event's count.
	counted := func() (map[string]uint64, map[string]int) {
		sum, events := map[string]uint64{}, map[string]int{}
		for _, ev := range f.rec.events(protocol.EventMachineBooted) {
			var mb protocol.MachineBooted
			if err := json.Unmarshal(ev.Data, &mb); err != nil {
				t.Fatal(err)
			}
			n := max(mb.Count, 1)
			sum[mb.Stage] += uint64(n)
			events[mb.MAC+" "+mb.Stage]++
		}
		return sum, events
	}
	// The first discover's serve, before the storm, is in the counts too.
	served[protocol.StageDHCP] += before.Offers
	var sum map[string]uint64
	var events map[string]int
	deadline := time.Now().Add(20 * time.Second)
	for {
		sum, events = counted()
		if sum[protocol.StageDHCP] == served[protocol.StageDHCP] && sum[protocol.StagePXE] == served[protocol.StagePXE] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway's counts %v, the proxy served %v; EventStats %+v", sum, served, s.EventStats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// At most one event per interval per machine and stage, plus the first and
	// the flush of the last burst.
	bound := int(elapsed/site.DefaultEventInterval) + 3
	total := 0
	for k, n := range events {
		total += n
		if n > bound {
			t.Errorf("%s: %d events in %s, want at most %d", k, n, elapsed.Round(time.Millisecond), bound)
		}
	}
	if len(events) != 2*machines {
		t.Errorf("events for %d machine-stages, want %d", len(events), 2*machines)
	}
	es := s.EventStats()
	servedAll := served[protocol.StageDHCP] + served[protocol.StagePXE]
	// A serve not coalesced opened an event: at least one per machine-stage, at
	// most every event (the others are flushes of coalesced serves).
	if own := servedAll - es.Coalesced; es.Journaled != uint64(total) || own < uint64(len(events)) || own > uint64(total) || es.Dropped != 0 {
		t.Errorf("EventStats %+v: want %d journaled, %d to %d serves not coalesced, none dropped", es, total, len(events), total)
	}
	t.Logf("%d serves in %s → %d events (%s)", servedAll, elapsed.Round(time.Millisecond), total, fmt.Sprint(es))
}
