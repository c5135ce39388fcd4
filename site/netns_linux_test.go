package site_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/testbed"
)

// TestProxyDHCPInNetns runs bcd site's proxyDHCP with its production defaults
// (ports 67 and 4011, broadcast replies, the interface found from server_ip) inside
// a network namespace, with the boot table from site-spec.json and no gateway, and
// answers a DHCPDISCOVER that OVMF's PXE firmware sent in the testbed, replayed from
// a second namespace over a veth.
func TestProxyDHCPInNetns(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedTool(t, "ip")
	raw, err := os.ReadFile(filepath.Join("testdata", "ovmf-pxe-discover.bin"))
	if err != nil {
		t.Fatal(err)
	}
	discover, err := dhcpv4.FromBytes(raw)
	if err != nil {
		t.Fatal(err)
	}
	suffix := os.Getpid() % 100000
	srvNS, err := testbed.NewNetns(fmt.Sprintf("bcdsite%ds", suffix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srvNS.Close() })
	cliNS, err := testbed.NewNetns(fmt.Sprintf("bcdsite%dc", suffix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cliNS.Close() })
	if err := testbed.Veth(srvNS, "boot0", "10.99.0.1/24", cliNS, "pxe0", ""); err != nil {
		t.Fatal(err)
	}

	f := newFixture(t, protocol.RoleSite, false)
	appendFile(t, f.cfgPath, `
[boot]
listen = "10.99.0.1:8080"
url = "http://10.99.0.1:8080"
server_ip = "10.99.0.1"
proxy_dhcp = true
`)
	f.cfg = loadConfig(t, f.cfgPath)
	// The gateway is down; the table is the one the last gateway sent.
	f.g.Server.Close()
	saved := map[string]any{"version": 1, "received_at": time.Now().UTC(), "spec": protocol.Spec{Revision: 1, Sections: map[string]json.RawMessage{
		protocol.SectionBoot: section(t, protocol.BootSection{Entries: []protocol.BootEntry{{MAC: discover.ClientHWAddr.String(), Mode: protocol.BootRamdisk}}}),
	}}}
	b, _ := json.Marshal(saved)
	if err := os.WriteFile(filepath.Join(f.dataDir, "site-spec.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}

	s, log := newSite(f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// Run opens its listeners on the goroutine that calls it: inside the namespace.
	go func() { done <- srvNS.Do(func() error { return s.Run(ctx) }) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitFor(t, "the proxyDHCP", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run: %v\n%s", err, log.String())
		default:
		}
		return s.Addrs().DHCP.IsValid()
	})

	var client *net.UDPConn
	err = cliNS.Do(func() error {
		lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1); serr == nil {
					serr = syscall.BindToDevice(int(fd), "pxe0")
				}
			})
			if err != nil {
				return err
			}
			return serr
		}}
		pc, err := lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:68")
		if err != nil {
			return err
		}
		client = pc.(*net.UDPConn)
		return nil
	})
	if err != nil {
		t.Fatalf("client socket: %v", err)
	}
	defer client.Close()
	if _, err := client.WriteToUDP(raw, &net.UDPAddr{IP: net.IPv4bcast, Port: 67}); err != nil {
		t.Fatal(err)
	}
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	for {
		n, from, err := client.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("no answer to the firmware's DISCOVER: %v\n%s", err, log.String())
		}
		offer, err := dhcpv4.FromBytes(buf[:n])
		if err != nil || offer.TransactionID != discover.TransactionID {
			continue
		}
		if offer.MessageType() != dhcpv4.MessageTypeOffer || offer.BootFileName != "ipxe.efi" ||
			!offer.ServerIPAddr.Equal(net.IPv4(10, 99, 0, 1)) || !from.IP.Equal(net.IPv4(10, 99, 0, 1)) {
			t.Errorf("answer from %s: %s", from, offer.Summary())
		}
		break
	}
}
