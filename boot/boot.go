package boot

import (
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/protocol"
)

// Boot modes of an Entry.
const (
	ModeRamdisk = "ramdisk" // boot the bcd ramdisk over HTTP
	ModeLocal   = "local"   // boot the installed disk
)

// Entry is what a machine should boot.
type Entry struct {
	Mode string // ModeRamdisk or ModeLocal
	// Kernel and Initrd are the ramdisk's URLs; empty means the HTTP server's
	// defaults. Cmdline is appended to the default kernel arguments.
	Kernel, Initrd, Cmdline string
}

// Table tells the servers what each machine should boot. Lookup is called for every
// packet and request, from many goroutines at once: it must be safe for concurrent
// use and must not block.
type Table interface {
	Lookup(mac net.HardwareAddr) (Entry, bool)
}

// TableFunc adapts a function to Table.
type TableFunc func(mac net.HardwareAddr) (Entry, bool)

// Lookup calls f.
func (f TableFunc) Lookup(mac net.HardwareAddr) (Entry, bool) { return f(mac) }

// MemTable is a Table held in memory, replaced whole by Set; the zero value is empty
// and ready to use. Lookups read a snapshot without a lock: in a boot storm every
// packet looks a MAC up, from every core.
type MemTable struct {
	entries atomic.Pointer[map[[6]byte]Entry]
}

// Set replaces the table's entries. Keys are MACs as protocol.ParseMAC accepts them.
func (t *MemTable) Set(entries map[string]Entry) error {
	m := make(map[[6]byte]Entry, len(entries))
	for k, e := range entries {
		mac, err := protocol.ParseMAC(k)
		if err != nil {
			return err
		}
		if e.Mode != ModeRamdisk && e.Mode != ModeLocal {
			return fmt.Errorf("boot entry for %s: mode %q is neither %q nor %q", mac, e.Mode, ModeRamdisk, ModeLocal)
		}
		m[[6]byte(mac)] = e
	}
	t.entries.Store(&m)
	return nil
}

// Lookup finds mac's entry.
func (t *MemTable) Lookup(mac net.HardwareAddr) (Entry, bool) {
	if len(mac) != 6 {
		return Entry{}, false
	}
	return t.lookup([6]byte(mac))
}

func (t *MemTable) lookup(mac [6]byte) (Entry, bool) {
	m := t.entries.Load()
	if m == nil {
		return Entry{}, false
	}
	e, ok := (*m)[mac]
	return e, ok
}

// What a server handed a machine, in Event.Served.
const (
	ServedOffer  = "dhcp-offer"  // proxyDHCP OFFER on port 67
	ServedAck    = "dhcp-ack"    // proxyDHCP ACK (the port 4011 follow-up)
	ServedTFTP   = "tftp"        // a TFTP transfer completed
	ServedScript = "script"      // an iPXE script
	ServedKernel = "kernel"      // the ramdisk kernel
	ServedInitrd = "initrd"      // the ramdisk initramfs
	ServedBinary = "http-binary" // an iPXE binary over HTTP (UEFI HTTP boot)
)

// Event is one thing a server handed one machine.
type Event struct {
	Time   time.Time
	Served string           // one of the Served* constants
	MAC    net.HardwareAddr // nil where the protocol does not carry it (TFTP, kernel, initrd)
	IP     netip.Addr       // the client's address, when it has one
	// Arch is the client's DHCP option 93 architecture (0 BIOS, 7 x64 UEFI, 11
	// arm64 UEFI, 16 x64 UEFI HTTP, …), or -1 when unknown.
	Arch int
	// GUID is the client machine identifier of DHCP option 97 (the SMBIOS system
	// UUID) in the form /sys/class/dmi/id/product_uuid shows it, or empty.
	GUID  string
	IPXE  bool   // the DHCP client was already iPXE
	File  string // the boot file name or URL, the TFTP file, or the HTTP path
	Mode  string // scripts: the entry's mode, or "" for a MAC without an entry
	Nonce string // ramdisk scripts: the boot nonce rendered into it
}

// Observer hears about every machine served. Observe is called from the servers'
// goroutines, many at once, on the hot path: it must be safe for concurrent use and
// must not block (queue and return).
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f.
func (f ObserverFunc) Observe(e Event) { f(e) }

// NonceMinter mints the boot nonce of a ramdisk script for mac. The site agent
// records it and reports it to the control plane, whose discovery attestor accepts
// the ramdisk that presents it.
type NonceMinter interface {
	MintNonce(mac net.HardwareAddr) (string, error)
}

// NonceMinterFunc adapts a function to NonceMinter.
type NonceMinterFunc func(mac net.HardwareAddr) (string, error)

// MintNonce calls f.
func (f NonceMinterFunc) MintNonce(mac net.HardwareAddr) (string, error) { return f(mac) }

// smbiosUUID formats DHCP option 97 (type 0, then 16 bytes) the way Linux shows the
// SMBIOS system UUID: firmware sends the first three fields little-endian.
func smbiosUUID(opt []byte) string {
	if len(opt) != 17 || opt[0] != 0 {
		return ""
	}
	b := opt[1:]
	zero := true
	for _, c := range b {
		if c != 0 {
			zero = false
		}
	}
	if zero {
		return ""
	}
	var sb strings.Builder
	sb.Grow(36)
	const hexdigits = "0123456789abcdef"
	order := [16]int{3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15}
	for i, j := range order {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			sb.WriteByte('-')
		}
		sb.WriteByte(hexdigits[b[j]>>4])
		sb.WriteByte(hexdigits[b[j]&0xf])
	}
	return sb.String()
}

// servable refuses to send a client anything but a regular file with one link:
// a FIFO or device is not a boot file, and a hard link in the served directory
// may name a file anywhere on the host, which os.Root (it confines names) does not
// stop.
func servable(path string, fi fs.FileInfo) error {
	if err := secretfile.Regular(path, fi); err != nil {
		return err
	}
	return secretfile.OneLink(path, fi)
}
