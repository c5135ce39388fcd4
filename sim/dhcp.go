package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// Firmware kinds a machine boots with, as option 93 and the class identifier say.
const (
	FirmwareBIOS = "bios" // arch 0, PXEClient:Arch:00000:UNDI:002001
	FirmwareUEFI = "uefi" // arch 7, PXEClient:Arch:00007:UNDI:003000
)

// dhcpBus is the one socket on 0.0.0.0:68 that hears the broadcast offers of every
// machine, and hands each to the machine waiting for its transaction id.
type dhcpBus struct {
	conn *net.UDPConn
	mu   sync.Mutex
	wait map[uint32]chan *dhcpv4.DHCPv4
}

// reusable sets SO_REUSEADDR (many machines bind port 68 on their own addresses
// beside the bus's wildcard bind) and SO_BROADCAST (a DISCOVER goes to
// 255.255.255.255).
func reusable(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); serr != nil {
			return
		}
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

func listenUDP(addr string) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: reusable}
	pc, err := lc.ListenPacket(context.Background(), "udp4", addr)
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}

func newDHCPBus() (*dhcpBus, error) {
	c, err := listenUDP("0.0.0.0:68")
	if err != nil {
		return nil, fmt.Errorf("sim: the DHCP client port: %w", err)
	}
	c.SetReadBuffer(4 << 20)
	b := &dhcpBus{conn: c, wait: map[uint32]chan *dhcpv4.DHCPv4{}}
	go b.run()
	return b, nil
}

func (b *dhcpBus) run() {
	buf := make([]byte, 1500)
	for {
		n, _, err := b.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		b.deliver(buf[:n])
	}
}

func (b *dhcpBus) deliver(pkt []byte) {
	m, err := dhcpv4.FromBytes(pkt)
	if err != nil || m.OpCode != dhcpv4.OpcodeBootReply {
		return
	}
	b.mu.Lock()
	x := m.TransactionID
	ch := b.wait[uint32(x[0])<<24|uint32(x[1])<<16|uint32(x[2])<<8|uint32(x[3])]
	b.mu.Unlock()
	if ch != nil {
		select {
		case ch <- m:
		default:
		}
	}
}

func (b *dhcpBus) register(xid uint32) chan *dhcpv4.DHCPv4 {
	ch := make(chan *dhcpv4.DHCPv4, 4)
	b.mu.Lock()
	b.wait[xid] = ch
	b.mu.Unlock()
	return ch
}

func (b *dhcpBus) unregister(xid uint32) {
	b.mu.Lock()
	delete(b.wait, xid)
	b.mu.Unlock()
}

func (b *dhcpBus) close() { b.conn.Close() }

// pxeClient is one machine's DHCP side: its own socket on its address, port 68
// (where the 4011 answers come back), and the bus for broadcast offers.
type pxeClient struct {
	bus  *dhcpBus
	conn *net.UDPConn
	mac  net.HardwareAddr
	ip   netip.Addr
	guid []byte // option 97: type 0 and the 16-byte SMBIOS UUID
	fw   string
	// Retransmits counts the packets sent again for want of an answer.
	Retransmits int
}

// offer is what firmware keeps of a proxy offer or ACK.
type offer struct {
	server netip.Addr // siaddr
	file   string     // the file field or option 67
	msg    dhcpv4.MessageType
}

func (c *pxeClient) arch() (uint16, string) {
	if c.fw == FirmwareUEFI {
		return 7, "PXEClient:Arch:00007:UNDI:003000"
	}
	return 0, "PXEClient:Arch:00000:UNDI:002001"
}

// packet builds a request as firmware (ipxe false) or iPXE (ipxe true) sends it.
func (c *pxeClient) packet(mt dhcpv4.MessageType, xid uint32, ipxe bool, ciaddr net.IP) (*dhcpv4.DHCPv4, error) {
	arch, class := c.arch()
	mods := []dhcpv4.Modifier{
		dhcpv4.WithHwAddr(c.mac),
		dhcpv4.WithTransactionID(dhcpv4.TransactionID{byte(xid >> 24), byte(xid >> 16), byte(xid >> 8), byte(xid)}),
		dhcpv4.WithMessageType(mt),
		dhcpv4.WithGeneric(dhcpv4.OptionMaximumDHCPMessageSize, []byte{0x05, 0xc0}),
		dhcpv4.WithRequestedOptions(dhcpv4.OptionSubnetMask, dhcpv4.OptionRouter, dhcpv4.OptionDomainNameServer,
			dhcpv4.OptionHostName, dhcpv4.OptionVendorSpecificInformation, dhcpv4.OptionClassIdentifier,
			dhcpv4.OptionTFTPServerName, dhcpv4.OptionBootfileName),
		dhcpv4.WithGeneric(dhcpv4.OptionClassIdentifier, []byte(class)),
		dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{byte(arch >> 8), byte(arch)}),
		dhcpv4.WithGeneric(dhcpv4.OptionClientNetworkInterfaceIdentifier, []byte{1, 2, 1}),
		dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, c.guid),
	}
	if ipxe {
		// iPXE sends its user class raw ("iPXE"), not RFC 3004 encoded.
		mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")))
	}
	if mt == dhcpv4.MessageTypeDiscover {
		mods = append(mods, dhcpv4.WithBroadcast(true))
	}
	if ciaddr != nil {
		mods = append(mods, dhcpv4.WithClientIP(ciaddr))
	}
	return dhcpv4.New(mods...)
}

// errNoOffer is a DHCP round that got no usable answer within its retransmits.
var errNoOffer = errors.New("no proxyDHCP offer")

// exchange sends a request to dst and waits for the answer of the same xid,
// retransmitting as PXE firmware does (4, 8, 16 s; sim starts at 1 s, since a
// loopback answer that takes a second is already lost).
func (c *pxeClient) exchange(ctx context.Context, dst netip.AddrPort, build func(xid uint32) (*dhcpv4.DHCPv4, error), tries int) (offer, error) {
	xid := rand.Uint32()
	req, err := build(xid)
	if err != nil {
		return offer{}, err
	}
	raw := req.ToBytes()
	ch := c.bus.register(xid)
	defer c.bus.unregister(xid)
	wait := time.Second
	for try := 0; try < tries; try++ {
		if try > 0 {
			c.Retransmits++
		}
		if _, err := c.conn.WriteToUDPAddrPort(raw, dst); err != nil {
			return offer{}, fmt.Errorf("dhcp to %s: %w", dst, err)
		}
		t := time.NewTimer(wait)
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				return offer{}, ctx.Err()
			case <-t.C:
			case m := <-ch:
				if m.ClientHWAddr.String() != c.mac.String() {
					continue
				}
				t.Stop()
				o := offer{msg: m.MessageType(), file: m.BootFileName}
				if v := m.Options.Get(dhcpv4.OptionBootfileName); len(v) > 0 {
					o.file = string(v)
				}
				o.server, _ = netip.AddrFromSlice(m.ServerIPAddr.To4())
				if !o.server.IsValid() || o.server.IsUnspecified() || o.file == "" {
					return o, fmt.Errorf("%w: the answer names no boot server and file", errNoOffer)
				}
				return o, nil
			}
			break
		}
		wait *= 2
		if wait > 8*time.Second {
			wait = 8 * time.Second
		}
	}
	return offer{}, errNoOffer
}

// readDirect hands packets that arrive on the machine's own socket (the unicast
// answers to its 4011 requests) to the bus, so one wait covers both.
func (c *pxeClient) readDirect() {
	buf := make([]byte, 1500)
	for {
		n, _, err := c.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		c.bus.deliver(buf[:n])
	}
}

// Discover is one DHCP round: DISCOVER broadcast, the proxy's OFFER, and the
// follow-up REQUEST to the boot server's port 4011 from the machine's address (as
// EDK2 and iPXE send it), whose ACK names the boot file.
func (c *pxeClient) Discover(ctx context.Context, ipxe bool) (offer, error) {
	bcast := netip.MustParseAddrPort("255.255.255.255:67")
	o, err := c.exchange(ctx, bcast, func(xid uint32) (*dhcpv4.DHCPv4, error) {
		return c.packet(dhcpv4.MessageTypeDiscover, xid, ipxe, nil)
	}, 6)
	if err != nil {
		return o, err
	}
	ack, err := c.exchange(ctx, netip.AddrPortFrom(o.server, 4011), func(xid uint32) (*dhcpv4.DHCPv4, error) {
		return c.packet(dhcpv4.MessageTypeRequest, xid, ipxe, c.ip.AsSlice())
	}, 4)
	if err != nil {
		// A boot server that does not answer 4011 leaves the offer's file.
		return o, nil
	}
	return ack, nil
}
