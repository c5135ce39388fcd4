package site_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/pin/tftp/v3"

	"github.com/better-compute/bcd/bmc"
	"github.com/better-compute/bcd/internal/metrics"
	"github.com/better-compute/bcd/internal/metrics/metricstest"
	"github.com/better-compute/bcd/internal/metrics/sitemetrics"
	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/site"
)

// slowDriver is a BMC whose power cycle takes a while and whose inventory
// cannot be reached.
type slowDriver struct{ fakeDriver }

func (d *slowDriver) PowerCycle(ctx context.Context, h bmc.Host) error {
	time.Sleep(30 * time.Millisecond)
	return d.fakeDriver.PowerCycle(ctx, h)
}

func (d *slowDriver) Inventory(ctx context.Context, h bmc.Host) (bmc.Inventory, error) {
	return bmc.Inventory{}, &bmc.Error{Kind: bmc.KindUnreachable, Msg: "no answer from 127.0.0.1:6230", Err: errors.New("timeout")}
}

// TestSiteMetricsAfterABoot: the site agent's endpoint after real clients on
// loopback (PXE DISCOVERs and a REQUEST on 4011, packets that are not for it,
// TFTP downloads and a missing file, the script and kernel over HTTP, BMC
// commands through a driver) counts what they did, read from the servers' and
// the event reporter's own counters at scrape time. About 1 s.
func TestSiteMetricsAfterABoot(t *testing.T) {
	f := newFixture(t, protocol.RoleSite, true)
	spec := bootSpec(t, 3)
	spec.Sections[protocol.SectionBMCHosts] = bmcSpec(t).Sections[protocol.SectionBMCHosts]
	f.setSpec(spec)
	reg := metrics.NewRegistry()
	drv := &slowDriver{fakeDriver{power: bmc.PowerOn}}
	s, _, _ := f.start(t, func(s *site.Site) {
		reg.MustRegister(sitemetrics.New(s))
		s.BMCDrivers = map[string]bmc.Driver{protocol.BMCDriverIPMI: drv}
	})
	srv, err := metrics.Listen("127.0.0.1:0", reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(t.Context())
	waitFor(t, "the boot table", func() bool {
		code, body := f.get(t, "/ipxe/"+macB+".ipxe")
		return code == 200 && strings.Contains(body, "sanboot")
	})

	// Three answered DISCOVERs, one for a MAC without an entry.
	for _, mac := range []string{macA, macB, macA} {
		if reply := f.discover(t, s, mac, 2*time.Second); reply == nil || reply.MessageType() != dhcpv4.MessageTypeOffer {
			t.Fatalf("DISCOVER for %s: %v", mac, reply)
		}
	}
	if reply := f.discover(t, s, macU, 300*time.Millisecond); reply != nil {
		t.Fatalf("answered %s", macU)
	}
	// The REQUEST on 4011 a PXE client sends after the OFFER.
	hw, _ := net.ParseMAC(macA)
	req, err := dhcpv4.New(dhcpv4.WithHwAddr(hw), dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
		dhcpv4.WithGeneric(dhcpv4.OptionClassIdentifier, []byte("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{0, 0}),
		dhcpv4.WithGeneric(dhcpv4.OptionClientNetworkInterfaceIdentifier, []byte{1, 2, 1}))
	if err != nil {
		t.Fatal(err)
	}
	pxe, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(s.Addrs().PXE))
	if err != nil {
		t.Fatal(err)
	}
	defer pxe.Close()
	pxe.Write(req.ToBytes())
	pxe.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1500)
	if n, err := pxe.Read(buf); err != nil {
		t.Fatalf("no ACK on 4011: %v", err)
	} else if ack, err := dhcpv4.FromBytes(buf[:n]); err != nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("4011 answered %v %v", ack, err)
	}
	if code, body := f.get(t, "/ramdisk/vmlinuz"); code != 200 || body != "KERNEL" {
		t.Fatalf("kernel: %d %q", code, body)
	}
	// Two packets that are not DHCP.
	for range 2 {
		f.dhcpCli.WriteToUDPAddrPort([]byte("not a DHCP packet"), s.Addrs().DHCP)
	}

	cli, err := tftp.NewClient(s.Addrs().TFTP.String())
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		wt, err := cli.Receive("undionly.kpxe", "octet")
		if err != nil {
			t.Fatalf("TFTP: %v", err)
		}
		var got bytes.Buffer
		if _, err := wt.WriteTo(&got); err != nil || got.String() != "IPXE-BIOS" {
			t.Fatalf("TFTP: %q %v", got.String(), err)
		}
	}
	if _, err := cli.Receive("autoexec.ipxe", "octet"); err == nil {
		t.Fatal("TFTP sent a file the root does not hold")
	}

	waitFor(t, "the recorder", func() bool { f.rec.mu.Lock(); defer f.rec.mu.Unlock(); return f.rec.conn != nil })
	f.rec.send(t, protocol.FrameCommand, command(t, "p", protocol.KindBMCPower, protocol.BMCPowerParams{Machine: "m_a", Action: "cycle"}))
	f.rec.send(t, protocol.FrameCommand, command(t, "b", protocol.KindBMCBootdev, protocol.BMCBootdevParams{Machine: "m_a", Device: "pxe"}))
	f.rec.send(t, protocol.FrameCommand, command(t, "i", protocol.KindBMCInventory, protocol.BMCInventoryParams{Machine: "m_a"}))
	f.rec.send(t, protocol.FrameCommand, command(t, "u", protocol.KindBMCPower, protocol.BMCPowerParams{Machine: "m_zz", Action: "on"}))
	for id, state := range map[string]string{"p": protocol.StateSucceeded, "b": protocol.StateSucceeded, "i": protocol.StateFailed, "u": protocol.StateFailed} {
		waitFor(t, state+" for "+id, func() bool { return f.rec.status(id, state) != nil })
	}

	type L = metricstest.Labels
	var problems []string
	var fams metricstest.Families
	// The malformed packets are counted when a worker reads them: wait for it.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		fams = metricstest.Scrape(t, srv.URL())
		problems = nil
		check := func(name string, ls L, want float64) {
			if got, ok := fams.Sum(name, ls); !ok || got != want {
				problems = append(problems, fmt.Sprintf("%s%v = %v (present %v), want %v", name, ls, got, ok, want))
			}
		}
		check("bcd_site_dhcp_answers_total", L{"kind": "offer"}, 3)
		check("bcd_site_dhcp_answers_total", L{"kind": "ack"}, 1)
		check("bcd_site_dhcp_ignored_total", L{"reason": "no-entry"}, 1)
		check("bcd_site_dhcp_ignored_total", nil, 1)
		check("bcd_site_dhcp_malformed_total", nil, 2)
		check("bcd_site_dhcp_packets_received_total", nil, 7)
		check("bcd_site_dhcp_send_errors_total", nil, 0)
		check("bcd_site_tftp_transfers_total", nil, 2)
		check("bcd_site_tftp_bytes_total", nil, 2*float64(len("IPXE-BIOS")))
		check("bcd_site_tftp_errors_total", L{"code": "1"}, 1)
		check("bcd_site_tftp_errors_total", L{"code": "2"}, 0)
		check("bcd_site_tftp_waits_total", nil, 0)
		check("bcd_site_http_requests_total", L{"route": "kernel"}, 1)
		check("bcd_site_http_bytes_total", L{"route": "kernel"}, float64(len("KERNEL")))
		check("bcd_site_http_requests_total", L{"route": "initrd"}, 0)
		check("bcd_site_http_responses_total", L{"class": "5xx"}, 0)
		if n, _ := fams.Sum("bcd_site_http_requests_total", L{"route": "script"}); n < 1 {
			problems = append(problems, "no script request counted")
		}
		if n, _ := fams.Sum("bcd_site_http_responses_total", L{"class": "2xx"}); n < 2 {
			problems = append(problems, fmt.Sprintf("%v 2xx responses, want the script's and the kernel's at least", n))
		}
		// macA's two DISCOVERs came within the event interval: one event,
		// one coalesced serve.
		if n, _ := fams.Sum("bcd_site_events_coalesced_total", nil); n < 1 {
			problems = append(problems, "no coalesced event for macA's second DISCOVER")
		}
		if n, _ := fams.Sum("bcd_site_events_journaled_total", nil); n < 3 {
			problems = append(problems, fmt.Sprintf("%v events journaled, want dhcp, pxe and tftp at least", n))
		}
		check("bcd_site_events_dropped_total", nil, 0)
		check("bcd_site_tftp_retransmits_total", nil, 0)
		check("bcd_site_bmc_operation_duration_seconds", L{"op": site.BMCOpPowerCycle}, 1)
		check("bcd_site_bmc_operation_duration_seconds", L{"op": site.BMCOpBootdev}, 1)
		check("bcd_site_bmc_operation_duration_seconds", L{"op": site.BMCOpInventory}, 1)
		check("bcd_site_bmc_operation_duration_seconds", L{"op": site.BMCOpPowerOn}, 1)
		check("bcd_site_bmc_operation_duration_seconds", L{"op": site.BMCOpPowerReset}, 0)
		check("bcd_site_bmc_operation_failures_total", L{"op": site.BMCOpInventory, "reason": protocol.ReasonBMCUnreachable}, 1)
		check("bcd_site_bmc_operation_failures_total", L{"op": site.BMCOpPowerOn, "reason": protocol.ReasonBMCUnknownMachine}, 1)
		check("bcd_site_bmc_operation_failures_total", nil, 2)
		if sum, _ := fams.HistogramSum("bcd_site_bmc_operation_duration_seconds", L{"op": site.BMCOpPowerCycle}); sum < 0.03 || sum > 10 {
			problems = append(problems, fmt.Sprintf("the power cycle took %v s, want the driver's 30 ms or more", sum))
		}
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(problems) > 0 {
		t.Errorf("after the flow:\n%s\nscrape has: %s", strings.Join(problems, "\n"), fams.Names("bcd_site_"))
	}
}

// TestSiteMetricsWithoutBoot: a site agent without [boot] exports no boot server
// counters (not zeros that would pass for an idle server), only its BMC ones.
func TestSiteMetricsWithoutBoot(t *testing.T) {
	f := newFixture(t, protocol.RoleSite, false)
	reg := metrics.NewRegistry()
	f.start(t, func(s *site.Site) { reg.MustRegister(sitemetrics.New(s)) })
	waitFor(t, "the session", func() bool { return f.g.Sessions() > 0 })
	srv, err := metrics.Listen("127.0.0.1:0", reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(t.Context())
	fams := metricstest.Scrape(t, srv.URL())
	for _, name := range []string{"bcd_site_dhcp_answers_total", "bcd_site_tftp_transfers_total", "bcd_site_http_requests_total"} {
		if fams[name] != nil {
			t.Errorf("%s without [boot]", name)
		}
	}
	if fams.Get(t, "bcd_site_bmc_operation_duration_seconds", metricstest.Labels{"op": site.BMCOpPowerCycle}) != 0 {
		t.Error("a BMC operation counted before any ran")
	}
}
