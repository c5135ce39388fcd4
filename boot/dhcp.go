package boot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/better-compute/bcd/ipxe"
)

// DHCP options the proxyDHCP reads or writes.
const (
	optVendorSpecific = 43  // PXE vendor options
	optMessageType    = 53  //
	optServerID       = 54  //
	optClassID        = 60  // PXEClient:Arch:…, HTTPClient:…
	optRelayAgentInfo = 82  // echoed to relay agents (RFC 3046)
	optUserClass      = 77  // iPXE sends "iPXE"
	optClientArch     = 93  // RFC 4578 client system architecture
	optClientGUID     = 97  // RFC 4578 client machine identifier
	optIPXEEncap      = 175 // iPXE's encapsulated options: only iPXE sends it
)

// PXE vendor sub-options inside option 43.
const (
	pxeDiscoveryControl = 6   // 8: skip boot server discovery, boot the file in this packet
	pxeBootItem         = 71  // the boot server item a 4011 request asks for; echoed
	pxeEnd              = 255 //
)

// Client system architectures (option 93, IANA "Processor Architecture Types").
const (
	archBIOS       = 0
	archEFIIA32    = 6
	archEFIBC      = 7 // x86-64 UEFI, as EDK2 and iPXE send it
	archEFIx64     = 9
	archEFIARM64   = 11
	archEFIx64HTTP = 16
	archARM64HTTP  = 19
)

// DHCPStats counts what a ProxyDHCP did with the packets it read.
type DHCPStats struct {
	Received  uint64 // packets read
	Malformed uint64 // not a DHCP packet, or a PXE option of the wrong length: dropped
	Ignored   uint64 // not for us: not PXE, no boot entry, an architecture without a binary, a REQUEST on 67 (the site DHCP server's)
	// IgnoredByReason splits Ignored by the Ignored* reasons; every reason is
	// present, and the values add up to Ignored.
	IgnoredByReason map[string]uint64
	Offers          uint64 // OFFERs sent (port 67)
	Acks            uint64 // ACKs sent (port 4011)
	SendErrors      uint64 // replies the kernel refused
	ReadErrors      uint64 // failed reads other than the socket closing
}

type dhcpCounters struct {
	received, malformed, ignored, offers, acks, sendErrors, readErrors atomic.Uint64
	// ignoredBy counts ignored packets by silence; silMalformed counts in malformed.
	ignoredBy [silNoEntry + 1]atomic.Uint64
}

// count counts a silence as malformed or as ignored for its reason.
func (c *dhcpCounters) count(why silence) {
	if why == silMalformed {
		c.malformed.Add(1)
		return
	}
	c.ignoredBy[why].Add(1)
	c.ignored.Add(1)
}

// ignoredByReason is the export of the Ignored* reasons.
func (c *dhcpCounters) ignoredByReason() map[string]uint64 {
	n := func(w silence) uint64 { return c.ignoredBy[w].Load() }
	return map[string]uint64{
		IgnoredNotPXE:    n(silNotPXE),
		IgnoredNoEntry:   n(silNoEntry),
		IgnoredNoBinary:  n(silArch) + n(silNoArch),
		IgnoredRequest67: n(silRequest67),
		IgnoredOther:     n(silNotOurs),
	}
}

// ProxyDHCP is a proxyDHCP server (PXE specification 2.1, the "PXE Proxy DHCP"
// service): it answers PXE clients whose MAC has a boot entry with where to get their
// boot file, and never hands out an address, so it runs beside the network's own
// DHCP server. The zero value of every optional field means the default.
type ProxyDHCP struct {
	// Interface is the network interface to serve, by name, looked up once by
	// Listen. Both sockets are bound to it (SO_BINDTODEVICE): packets from other
	// interfaces are never read, and every reply leaves through it, so relay
	// agents must be reachable there. Required unless BroadcastAddr is set.
	Interface string
	// ServerIP is this host's IPv4 address on Interface: siaddr and option 54 of
	// every reply, and so the TFTP server the firmware downloads from. Required.
	ServerIP netip.Addr
	// URL is the HTTP boot server's base URL ([boot] url, such as
	// http://10.20.0.2:8080). iPXE clients get {URL}/ipxe/{mac}.ipxe, UEFI HTTP boot
	// clients {URL}/ipxe/{EFIBinary}. Required; the script URL must fit the
	// 127-byte file field.
	URL string
	// Table says which MACs boot. Required.
	Table Table
	// Observer hears of every OFFER and ACK sent; nil discards.
	Observer Observer
	// Logger logs each packet's fate at debug level only (per-packet logging costs
	// a third of a server's rate) and unexpected failures at warn; nil discards.
	Logger *slog.Logger

	// Addr is the UDP address for DHCP; empty means 0.0.0.0:67, which with
	// Interface hears the broadcasts of that interface only. Relay agents are
	// answered on its port.
	Addr string
	// PXEAddr is the UDP address for the follow-up requests of PXE clients; empty
	// means 0.0.0.0:4011.
	PXEAddr string
	// BroadcastAddr is where replies to clients without an address go. The zero
	// value means 255.255.255.255:68, where firmware listens. Tests on loopback
	// point it at their client.
	BroadcastAddr netip.AddrPort

	// BIOSBinary, EFIBinary and ARM64Binary are the TFTP file names by
	// architecture: option 93 value 0, values 6, 7 and 9, and value 11. Empty means
	// ipxe.BIOS, ipxe.EFI and ipxe.ARM64; set EFIBinary to ipxe.SNPOnly to boot
	// through the firmware's network stack.
	BIOSBinary, EFIBinary, ARM64Binary string

	// Workers is how many goroutines read and answer on each socket; 0 means
	// one. More do not answer faster: they take turns at the socket's read lock,
	// and each packet then wakes one to find nothing (the shipped bcd site at 1
	// and 16 in flight beside dnsmasq: p99 0.6-0.8 ms with one, 1.5-1.8 ms with
	// two). The two sockets (67 and 4011) and batching already spread a storm.
	Workers int
	// Batch is how many datagrams a worker takes from its socket in one read
	// (recvmmsg) and sends in one write (sendmmsg); a read takes what is queued and
	// never waits for more. 0 means 16; 1 reads and writes one datagram a syscall.
	Batch int
	// ThreadNice, when not 0, gives each reader its own thread at this nice
	// value (negative: ahead of the rest), which waits for its socket itself.
	// In a storm the answer then does not wait behind the site agent's other
	// work (events, its session, serve on the same machine) for a time slice.
	// Setting a negative value needs CAP_SYS_NICE; without it the readers run
	// at the process's priority and the failure is logged once.
	ThreadNice int

	stats dhcpCounters

	mu        sync.Mutex
	dhcpConn  *net.UDPConn
	pxeConn   *net.UDPConn
	dhcpPort  uint16
	broadcast netip.AddrPort
	serverIP4 [4]byte
	// What every reply needs, computed once by setup.
	serverName                                               string // ServerIP as text: sname of TFTP replies
	biosFile, efiFile, arm64File, efiHTTPFile, arm64HTTPFile string
	localHTTPFile                                            string
	oob                                                      []byte // IP_PKTINFO making ServerIP the source of every reply
	base                                                     string // URL without a trailing slash
	log                                                      *slog.Logger
	warned                                                   atomic.Bool
	niceWarned                                               atomic.Bool
}

// Stats returns the counters so far. Each is exact; read while packets arrive, they
// are not one instant's (Ignored may be read before IgnoredByReason catches up).
func (s *ProxyDHCP) Stats() DHCPStats {
	return DHCPStats{
		Received:        s.stats.received.Load(),
		Malformed:       s.stats.malformed.Load(),
		Ignored:         s.stats.ignored.Load(),
		IgnoredByReason: s.stats.ignoredByReason(),
		Offers:          s.stats.offers.Load(),
		Acks:            s.stats.acks.Load(),
		SendErrors:      s.stats.sendErrors.Load(),
		ReadErrors:      s.stats.readErrors.Load(),
	}
}

// ListenAndServe listens, then serves until ctx is done.
func (s *ProxyDHCP) ListenAndServe(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	return s.Serve(ctx)
}

// Listen checks the configuration, looks the interface up once, and opens both
// sockets.
func (s *ProxyDHCP) Listen() error {
	if err := s.setup(); err != nil {
		return err
	}
	var ifindex int
	if s.Interface != "" {
		ifi, err := net.InterfaceByName(s.Interface)
		if err != nil {
			return fmt.Errorf("proxyDHCP interface %q: %w", s.Interface, err)
		}
		if err := hasAddr(ifi, s.ServerIP); err != nil {
			return err
		}
		ifindex = ifi.Index
	}
	addr := cmpOr(s.Addr, "0.0.0.0:67")
	dc, err := listenUDP(addr, s.Interface)
	if err != nil {
		return fmt.Errorf("proxyDHCP: listening on %s: %w", addr, err)
	}
	paddr := cmpOr(s.PXEAddr, "0.0.0.0:4011")
	pc, err := listenUDP(paddr, s.Interface)
	if err != nil {
		dc.Close()
		return fmt.Errorf("proxyDHCP: listening on %s: %w", paddr, err)
	}
	// A burst of machines powered on together must queue, not drop.
	_ = dc.SetReadBuffer(1 << 20)
	_ = pc.SetReadBuffer(1 << 20)
	s.mu.Lock()
	s.dhcpConn, s.pxeConn = dc, pc
	s.dhcpPort = dc.LocalAddr().(*net.UDPAddr).AddrPort().Port()
	if s.Interface != "" {
		s.oob = pktinfo(ifindex, s.ServerIP)
	}
	s.mu.Unlock()
	return nil
}

// setup validates the fields and computes what every packet needs.
func (s *ProxyDHCP) setup() error {
	if !s.ServerIP.Is4() {
		return errors.New("proxyDHCP: ServerIP must be an IPv4 address")
	}
	if s.Table == nil {
		return errors.New("proxyDHCP: no boot Table")
	}
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("proxyDHCP: URL must be an http:// or https:// URL")
	}
	s.base = strings.TrimSuffix(s.URL, "/")
	if n := len(s.base) + len("/ipxe/aa:bb:cc:dd:ee:ff.ipxe"); n > 127 {
		return fmt.Errorf("proxyDHCP: URL is too long: the script URL would be %d bytes, the DHCP file field holds 127", n)
	}
	for _, name := range []string{s.BIOSBinary, s.EFIBinary, s.ARM64Binary} {
		if strings.ContainsAny(name, "/\x00") || len(name) > 100 {
			return fmt.Errorf("proxyDHCP: boot file name %q is not a plain file name", name)
		}
	}
	s.broadcast = s.BroadcastAddr
	if !s.broadcast.IsValid() {
		if s.Interface == "" {
			// Without a device, a broadcast would leave by the default route.
			return errors.New("proxyDHCP: Interface is required to broadcast replies")
		}
		s.broadcast = netip.AddrPortFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), 68)
	}
	s.serverIP4 = s.ServerIP.As4()
	s.serverName = s.ServerIP.String()
	s.biosFile = cmpOr(s.BIOSBinary, ipxe.BIOS)
	s.efiFile = cmpOr(s.EFIBinary, ipxe.EFI)
	s.arm64File = cmpOr(s.ARM64Binary, ipxe.ARM64)
	s.efiHTTPFile = s.base + "/ipxe/" + s.efiFile
	s.arm64HTTPFile = s.base + "/ipxe/" + s.arm64File
	s.localHTTPFile = s.base + "/ipxe/" + LocalBootFile
	s.log = s.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return nil
}

func hasAddr(ifi *net.Interface, ip netip.Addr) error {
	addrs, err := ifi.Addrs()
	if err != nil {
		return fmt.Errorf("proxyDHCP interface %s: %w", ifi.Name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if got, ok := netip.AddrFromSlice(n.IP); ok && got.Unmap() == ip {
				return nil
			}
		}
	}
	return fmt.Errorf("proxyDHCP: %s is not an address of interface %s", ip, ifi.Name)
}

// Addrs returns the local addresses of the DHCP and PXE sockets once Listen has
// opened them.
func (s *ProxyDHCP) Addrs() (dhcp, pxe netip.AddrPort) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dhcpConn == nil {
		return netip.AddrPort{}, netip.AddrPort{}
	}
	return s.dhcpConn.LocalAddr().(*net.UDPAddr).AddrPort(), s.pxeConn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// Serve answers on the sockets Listen opened until ctx is done, then closes them.
func (s *ProxyDHCP) Serve(ctx context.Context) error {
	s.mu.Lock()
	dc, pc := s.dhcpConn, s.pxeConn
	s.mu.Unlock()
	if dc == nil {
		return errors.New("proxyDHCP: Serve before Listen")
	}
	workers := max(s.Workers, 1)
	var wg sync.WaitGroup
	batch := s.Batch
	if batch <= 0 {
		batch = dhcpBatch
	}
	stop := -1
	if s.ThreadNice != 0 {
		fd, err := newStopFD()
		if err != nil {
			return fmt.Errorf("proxyDHCP: %w", err)
		}
		stop = fd
		defer closeStopFD(stop)
	}
	for range workers {
		if batch == 1 {
			wg.Go(func() { s.loop(dc, false) })
			wg.Go(func() { s.loop(pc, true) })
			continue
		}
		wg.Go(func() { s.batchLoop(dc, false, batch, stop) })
		wg.Go(func() { s.batchLoop(pc, true, batch, stop) })
	}
	<-ctx.Done()
	if stop >= 0 {
		// Before the sockets close: a reader waiting in ppoll on a descriptor
		// number that close frees must leave before the number is reused.
		signalStop(stop)
	}
	dc.Close()
	pc.Close()
	wg.Wait()
	return nil
}

func (s *ProxyDHCP) loop(c *net.UDPConn, pxePort bool) {
	// Room for any datagram, so that an oversized one is seen whole and rejected
	// rather than parsed truncated; the reply is built in out, reused.
	buf := make([]byte, 64<<10)
	out := make([]byte, 0, 1024)
	for {
		n, src, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.stats.readErrors.Add(1)
			s.log.Warn("proxyDHCP: read failed", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		reply, dst, ok := s.handleSafe(buf[:n], out[:0], pxePort, src)
		if !ok {
			continue
		}
		if err := send(c, reply, s.oob, dst); err != nil {
			s.stats.sendErrors.Add(1)
			if !s.warned.Swap(true) {
				s.log.Warn("proxyDHCP: sending a reply failed (further failures are only counted)", "to", dst, "err", err)
			}
		}
		if cap(reply) <= 64<<10 {
			out = reply[:0] // keep a buffer that grew for a long relay option
		}
	}
}

// handleSafe is handle that survives a bug in the DHCP codec: one bad packet must
// not take the boot server down for every machine.
func (s *ProxyDHCP) handleSafe(b, out []byte, pxePort bool, src netip.AddrPort) (reply []byte, dst netip.AddrPort, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			s.stats.malformed.Add(1)
			s.log.Error("proxyDHCP: a packet crashed the handler and was dropped", "from", src, "panic", r)
			reply, ok = nil, false
		}
	}()
	return s.handle(b, out, pxePort, src)
}

// handle decides the answer to one datagram: the reply, appended to out, and where
// it goes, or ok false for silence. It never panics on any input (FuzzHandleDHCP),
// and on the answering path it allocates nothing but the observer's event.
func (s *ProxyDHCP) handle(b, out []byte, pxePort bool, src netip.AddrPort) (reply []byte, dst netip.AddrPort, ok bool) {
	s.stats.received.Add(1)
	debug := s.log.Enabled(context.Background(), slog.LevelDebug)
	var req request
	repeated, err := parseRequest(b, &req)
	if err == nil && repeated {
		// RFC 3396 concatenation: rare enough to leave to dhcpv4.
		var p *dhcpv4.DHCPv4
		if p, err = dhcpv4.FromBytes(b); err == nil {
			requestFromDHCPv4(p, &req)
		}
	}
	if err != nil {
		s.stats.malformed.Add(1)
		if debug {
			s.log.Debug("proxyDHCP: dropping a malformed packet", "from", src, "err", err)
		}
		return nil, dst, false
	}
	d, why := s.decide(&req, pxePort)
	if why != answered {
		s.stats.count(why)
		if debug {
			s.log.Debug("proxyDHCP: not answering", "from", src, "mac", req.macCopy(), "reason", why.String())
		}
		return nil, dst, false
	}
	reply = s.appendReply(out, &req, &d, pxePort)
	dst = s.destination(&req, pxePort, src)
	served := ServedOffer
	if d.ack {
		served = ServedAck
		s.stats.acks.Add(1)
	} else {
		s.stats.offers.Add(1)
	}
	if debug {
		s.log.Debug("proxyDHCP: answering", "served", served, "mac", req.macCopy(), "arch", d.arch, "ipxe", d.ipxe, "file", d.file, "to", dst)
	}
	if s.Observer != nil {
		ev := Event{
			Time:   time.Now(),
			Served: served,
			MAC:    req.macCopy(),
			Arch:   d.arch,
			GUID:   smbiosUUID(req.guid),
			IPXE:   d.ipxe,
			File:   d.file,
		}
		if ip := netip.AddrFrom4(req.ciaddr); !ip.IsUnspecified() {
			ev.IP = ip
		}
		s.Observer.Observe(ev)
	}
	return reply, dst, true
}

// decision is what to answer a request that gets an answer.
type decision struct {
	ack         bool   // ACK rather than OFFER
	arch        int    // option 93, -1 when absent
	ipxe        bool   // the client is already iPXE
	file        string // file field: a TFTP file name or a URL
	vendorClass string // option 60 of the reply
	tftp        bool   // file is a TFTP name: set sname too
	discovery   bool   // BIOS: tell the PXE ROM to skip boot server discovery
}

// silence is why a request gets no answer.
type silence uint8

const (
	answered silence = iota
	silMalformed
	silNotOurs
	silRequest67
	silNotPXE
	silNoArch
	silArch
	silNoEntry
)

// Reasons for silence, for the debug log.
const (
	whyMalformed = "malformed PXE option"
	whyNotOurs   = "not a request this server answers"
	whyRequest67 = "a REQUEST on port 67: the site DHCP server's"
	whyNotPXE    = "not a PXE client"
	whyNoArch    = "no client architecture (option 93)"
	whyArch      = "no boot file for this architecture"
	whyNoEntry   = "no boot entry for this MAC"
)

func (w silence) String() string {
	return [...]string{"", whyMalformed, whyNotOurs, whyRequest67, whyNotPXE, whyNoArch, whyArch, whyNoEntry}[w]
}

// Reasons in DHCPStats.IgnoredByReason.
const (
	IgnoredNotPXE    = "not-pxe"       // no PXEClient or HTTPClient vendor class
	IgnoredNoEntry   = "no-entry"      // the MAC has no boot entry
	IgnoredNoBinary  = "no-binary"     // an architecture without a boot file, or none given by a non-iPXE client
	IgnoredRequest67 = "request-on-67" // a REQUEST on port 67, for the site DHCP server
	IgnoredOther     = "other"         // not a BOOTREQUEST, not Ethernet, or a message type the port does not answer
)

// LocalBootFile is the boot file a machine whose entry is local gets from firmware
// PXE: no server has it, so the firmware fails fast and boots its next option.
const LocalBootFile = "bcd-boot-local-disk"

func (s *ProxyDHCP) decide(req *request, pxePort bool) (decision, silence) {
	d := decision{arch: -1}
	if req.op != byte(dhcpv4.OpcodeBootRequest) || req.hlen != 6 {
		return d, silNotOurs
	}
	switch mt := dhcpv4.MessageType(req.msgType); {
	case pxePort && (mt == dhcpv4.MessageTypeRequest || mt == dhcpv4.MessageTypeInform):
		d.ack = true
	case !pxePort && mt == dhcpv4.MessageTypeDiscover:
	case !pxePort && mt == dhcpv4.MessageTypeRequest:
		return d, silRequest67
	default:
		return d, silNotOurs
	}
	http := bytes.HasPrefix(req.class, []byte("HTTPClient"))
	if !http && !bytes.HasPrefix(req.class, []byte("PXEClient")) {
		return d, silNotPXE
	}
	if a := req.arch; a != nil {
		if len(a) < 2 || len(a)%2 != 0 {
			return d, silMalformed
		}
		d.arch = int(a[0])<<8 | int(a[1])
	}
	if req.guid != nil && len(req.guid) != 17 {
		return d, silMalformed
	}
	d.ipxe = req.ipxeEncap || isIPXEUserClass(req.userClass)
	if d.arch < 0 && !d.ipxe {
		return d, silNoArch
	}
	d.vendorClass = "PXEClient"
	if http {
		d.vendorClass = "HTTPClient"
	}
	mac := req.mac()
	switch {
	case d.ipxe:
		// Already iPXE: straight to its script, or it would chain-load iPXE forever.
		// Built only once the table says the MAC boots.
	case d.arch == archBIOS:
		d.file, d.tftp, d.discovery = s.biosFile, true, true
	case d.arch == archEFIIA32 || d.arch == archEFIBC || d.arch == archEFIx64:
		d.file, d.tftp = s.efiFile, true
	case d.arch == archEFIARM64:
		d.file, d.tftp = s.arm64File, true
	case d.arch == archEFIx64HTTP:
		d.file, d.vendorClass = s.efiHTTPFile, "HTTPClient"
	case d.arch == archARM64HTTP:
		d.file, d.vendorClass = s.arm64HTTPFile, "HTTPClient"
	default:
		return d, silArch
	}
	// The table last: it is the only part that may take a lock.
	e, ok := s.lookup(req)
	if !ok {
		return d, silNoEntry
	}
	if d.ipxe {
		d.file = s.base + "/ipxe/" + mac.String() + ".ipxe"
	}
	if e.Mode == ModeLocal && !d.ipxe {
		// A machine that should boot its disk gets iPXE only when iPXE is what asks
		// (its local script exits to the disk). Firmware's own PXE or HTTP boot gets
		// a boot file that does not exist: it fails at once and moves to its next
		// boot option. Silence would cost each option its whole DHCP timeout, and
		// chain-loading iPXE only to exit again a whole iPXE boot (UEFI lists PXEv4,
		// PXEv6, HTTPv4 and HTTPv6 for each NIC before the disk).
		if d.vendorClass == "HTTPClient" {
			d.file = s.localHTTPFile
		} else {
			d.file = LocalBootFile
		}
	}
	return d, answered
}

// lookup finds the entry of req's MAC. A MemTable is asked by value, so that req
// stays on the stack; any other Table gets a copy it may keep.
func (s *ProxyDHCP) lookup(req *request) (Entry, bool) {
	if t, ok := s.Table.(*MemTable); ok {
		return t.lookup([6]byte(req.chaddr[:6]))
	}
	return s.Table.Lookup(net.HardwareAddr(bytes.Clone(req.chaddr[:6])))
}

// isIPXEUserClass reports whether option 77 says iPXE: raw, as iPXE sends it, or
// RFC 3004 encoded.
func isIPXEUserClass(uc []byte) bool {
	if string(uc) == "iPXE" {
		return true
	}
	for len(uc) > 0 {
		n := int(uc[0])
		if n == 0 || n+1 > len(uc) {
			return false
		}
		if string(uc[1:1+n]) == "iPXE" {
			return true
		}
		uc = uc[1+n:]
	}
	return false
}

// destination is where a reply goes: to the relay agent for a relayed request, to
// the client's address once it has one (port 4011), else broadcast where the
// client listens: firmware takes its offer from 255.255.255.255:68.
func (s *ProxyDHCP) destination(req *request, pxePort bool, src netip.AddrPort) netip.AddrPort {
	if gi := netip.AddrFrom4(req.giaddr); !gi.IsUnspecified() {
		return netip.AddrPortFrom(gi, s.dhcpPort)
	}
	if pxePort && src.IsValid() && !src.Addr().Unmap().IsUnspecified() {
		return netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	}
	return s.broadcast
}

// subOption finds code in a sequence of PXE vendor sub-options.
func subOption(b []byte, code byte) []byte {
	for len(b) >= 2 {
		c, n := b[0], int(b[1])
		if c == pxeEnd {
			return nil
		}
		if c == 0 {
			b = b[1:]
			continue
		}
		if 2+n > len(b) {
			return nil
		}
		if c == code {
			return b[2 : 2+n]
		}
		b = b[2+n:]
	}
	return nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
