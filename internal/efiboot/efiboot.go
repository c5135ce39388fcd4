// Package efiboot keeps a UEFI machine's boot order the way bcd needs it: the
// network entry that reaches the site agent first, then one entry for the OS a
// deploy installed, so that the site agent keeps deciding at every boot whether
// the machine runs the ramdisk or its disk (the local iPXE script exits with an
// error, and the firmware moves on to the next entry: the OS).
//
// The ramdisk applies it after a deploy (Prepare, then Plan.Apply); the
// installed OS restores it when something else put itself first — grub-install,
// an OS update, an operator's efibootmgr — with Keep, run by
// bcd-boot-order.service at boot and at shutdown. Variables are read and written
// through u-root's efivarfs package (the kernel's /sys/firmware/efi/efivars);
// EFI_LOAD_OPTION and device paths are decoded here, with bounds checks on
// every length (u-root's boot.BootVar indexes a short variable out of range and
// ends a description at the first zero byte rather than the first zero UTF-16
// unit), and fuzzed.
package efiboot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/google/uuid"
	"github.com/u-root/u-root/pkg/efivarfs"
)

// GlobalGUID is EFI_GLOBAL_VARIABLE: Boot####, BootOrder and BootCurrent live under it.
var GlobalGUID = uuid.MustParse("8be4df61-93ca-11d2-aa0d-00e098032b8c")

// bootAttrs are the attributes firmware and efibootmgr give Boot#### and BootOrder.
const bootAttrs = efivarfs.AttributeNonVolatile | efivarfs.AttributeBootserviceAccess | efivarfs.AttributeRuntimeAccess

// LoadOptionActive is EFI_LOAD_OPTION's LOAD_OPTION_ACTIVE attribute.
const LoadOptionActive = 0x1

// OSPrefix starts the description of the entry a deploy writes: an entry with it
// is bcd's, and a redeploy replaces it rather than adding another.
const OSPrefix = "bcd: "

// Device path node types and subtypes (UEFI 2.10, 10.3).
const (
	typeMessaging   = 0x03
	typeMedia       = 0x04
	typeEnd         = 0x7f
	subEndEntire    = 0xff
	subMsgMAC       = 11
	subMsgIPv4      = 12
	subMsgIPv6      = 13
	subMsgURI       = 24
	subMediaHD      = 1
	subMediaFile    = 4
	maxDescription  = 1024 // UTF-16 units: longer is not a description firmware wrote
	maxBootVariable = 1 << 16
)

// LoadOption is an EFI_LOAD_OPTION (the value of a Boot#### variable).
type LoadOption struct {
	Attributes  uint32
	Description string
	// FilePath is the device path list, End node included, as stored.
	FilePath []byte
	Optional []byte
}

// ParseLoadOption decodes an EFI_LOAD_OPTION. Every length is checked against
// the variable's size; the device path must be well formed and end with an End
// node.
func ParseLoadOption(b []byte) (LoadOption, error) {
	var o LoadOption
	if len(b) < 8 {
		return o, fmt.Errorf("load option of %d bytes: shorter than its header", len(b))
	}
	if len(b) > maxBootVariable {
		return o, fmt.Errorf("load option of %d bytes: longer than %d", len(b), maxBootVariable)
	}
	o.Attributes = binary.LittleEndian.Uint32(b[0:4])
	pathLen := int(binary.LittleEndian.Uint16(b[4:6]))
	i := 6
	var units []uint16
	for {
		if i+2 > len(b) {
			return o, errors.New("load option: description not terminated")
		}
		u := binary.LittleEndian.Uint16(b[i:])
		i += 2
		if u == 0 {
			break
		}
		if len(units) == maxDescription {
			return o, fmt.Errorf("load option: description longer than %d characters", maxDescription)
		}
		units = append(units, u)
	}
	o.Description = string(utf16.Decode(units))
	if pathLen > len(b)-i {
		return o, fmt.Errorf("load option: file path list of %d bytes, %d left in the variable", pathLen, len(b)-i)
	}
	o.FilePath = append([]byte(nil), b[i:i+pathLen]...)
	if _, err := parseNodes(o.FilePath); err != nil {
		return o, fmt.Errorf("load option %q: %w", o.Description, err)
	}
	o.Optional = append([]byte(nil), b[i+pathLen:]...)
	return o, nil
}

// Marshal encodes the load option as firmware stores it.
func (o LoadOption) Marshal() []byte {
	var b bytes.Buffer
	var hdr [6]byte
	binary.LittleEndian.PutUint32(hdr[0:4], o.Attributes)
	binary.LittleEndian.PutUint16(hdr[4:6], uint16(len(o.FilePath)))
	b.Write(hdr[:])
	b.Write(utf16z(o.Description))
	b.Write(o.FilePath)
	b.Write(o.Optional)
	return b.Bytes()
}

func utf16z(s string) []byte {
	u := append(utf16.Encode([]rune(s)), 0)
	out := make([]byte, 2*len(u))
	for i, c := range u {
		binary.LittleEndian.PutUint16(out[2*i:], c)
	}
	return out
}

// node is one device path node: its type, subtype and data (header excluded).
type node struct {
	typ, sub byte
	data     []byte
}

// parseNodes splits the first device path instance of a list into its nodes,
// End node excluded.
func parseNodes(p []byte) ([]node, error) {
	var nodes []node
	for {
		if len(p) < 4 {
			return nil, errors.New("device path: no End node")
		}
		l := int(binary.LittleEndian.Uint16(p[2:4]))
		if l < 4 || l > len(p) {
			return nil, fmt.Errorf("device path: node of length %d with %d bytes left", l, len(p))
		}
		n := node{typ: p[0], sub: p[1], data: p[4:l]}
		if n.typ == typeEnd {
			// 0xff ends the whole list, 0x01 only this instance: bcd needs the first.
			return nodes, nil
		}
		nodes = append(nodes, n)
		p = p[l:]
	}
}

// Kind says what an entry boots.
type Kind string

const (
	KindPXE4  Kind = "pxe-ipv4" // MAC then IPv4: PXE over IPv4
	KindPXE6  Kind = "pxe-ipv6"
	KindHTTP  Kind = "http" // a URI node: UEFI HTTP boot
	KindNIC   Kind = "nic"  // a MAC node and nothing that says which protocol (an option ROM's entry)
	KindDisk  Kind = "disk" // a hard drive media node (HD(…)) or a file on one
	KindOther Kind = "other"
)

// Network reports whether the kind boots from the network.
func (k Kind) Network() bool { return k == KindPXE4 || k == KindPXE6 || k == KindHTTP || k == KindNIC }

// Describe classifies a load option's device path and returns the MAC of its
// NIC, if it names one.
func (o LoadOption) Describe() (Kind, net.HardwareAddr) {
	nodes, err := parseNodes(o.FilePath)
	if err != nil {
		return KindOther, nil
	}
	var mac net.HardwareAddr
	var v4, v6, uri, hd bool
	for _, n := range nodes {
		switch {
		case n.typ == typeMessaging && n.sub == subMsgMAC && len(n.data) >= 33:
			// 32 bytes of address, padded, then the interface type: 1 is Ethernet.
			if n.data[32] == 1 || n.data[32] == 0 {
				mac = append(net.HardwareAddr(nil), n.data[:6]...)
			}
		case n.typ == typeMessaging && n.sub == subMsgIPv4:
			v4 = true
		case n.typ == typeMessaging && n.sub == subMsgIPv6:
			v6 = true
		case n.typ == typeMessaging && n.sub == subMsgURI:
			uri = true
		case n.typ == typeMedia && n.sub == subMediaHD:
			hd = true
		}
	}
	switch {
	case uri:
		return KindHTTP, mac
	case mac != nil && v4:
		return KindPXE4, mac
	case mac != nil && v6:
		return KindPXE6, mac
	case mac != nil:
		return KindNIC, mac
	case hd:
		return KindDisk, nil
	}
	return KindOther, nil
}

// HardDriveFile is the device path of a file on a GPT partition, in the short
// form efibootmgr writes and firmware expands (HD(…)/File(…)): partition number,
// first sector and length in sectors, the partition's unique GUID as stored on
// disk (mixed-endian), and a path with backslashes.
func HardDriveFile(partition uint32, startLBA, sizeLBA uint64, partGUID [16]byte, file string) []byte {
	var b bytes.Buffer
	hd := make([]byte, 42)
	hd[0], hd[1] = typeMedia, subMediaHD
	binary.LittleEndian.PutUint16(hd[2:4], 42)
	binary.LittleEndian.PutUint32(hd[4:8], partition)
	binary.LittleEndian.PutUint64(hd[8:16], startLBA)
	binary.LittleEndian.PutUint64(hd[16:24], sizeLBA)
	copy(hd[24:40], partGUID[:])
	hd[40] = 0x02 // partition format: GPT
	hd[41] = 0x02 // signature type: GUID
	b.Write(hd)
	name := utf16z(strings.ReplaceAll(file, "/", `\`))
	var fh [4]byte
	fh[0], fh[1] = typeMedia, subMediaFile
	binary.LittleEndian.PutUint16(fh[2:4], uint16(4+len(name)))
	b.Write(fh[:])
	b.Write(name)
	b.Write([]byte{typeEnd, subEndEntire, 4, 0})
	return b.Bytes()
}

// Entry is one Boot#### variable.
type Entry struct {
	Number uint16
	Option LoadOption
	// Raw is the variable's value as read.
	Raw []byte
	// Err is why the value could not be decoded; such an entry is kept as it is.
	Err error
}

// Name is the variable's name, Boot0003.
func (e Entry) Name() string { return BootName(e.Number) }

// BootName is the Boot#### variable name of a number.
func BootName(n uint16) string { return fmt.Sprintf("Boot%04X", n) }

// Table is what the firmware holds: BootOrder, BootCurrent and every Boot#### entry.
type Table struct {
	Order      []uint16
	Current    uint16
	HasCurrent bool
	Entries    map[uint16]Entry
}

// Read reads the boot variables.
func Read(v efivarfs.EFIVar) (*Table, error) {
	t := &Table{Entries: map[uint16]Entry{}}
	_, order, err := v.Get(efivarfs.VariableDescriptor{Name: "BootOrder", GUID: GlobalGUID})
	switch {
	case errors.Is(err, efivarfs.ErrVarNotExist):
	case err != nil:
		return nil, fmt.Errorf("read BootOrder: %w", err)
	default:
		if t.Order, err = ParseOrder(order); err != nil {
			return nil, err
		}
	}
	_, cur, err := v.Get(efivarfs.VariableDescriptor{Name: "BootCurrent", GUID: GlobalGUID})
	if err == nil && len(cur) == 2 {
		t.Current, t.HasCurrent = binary.LittleEndian.Uint16(cur), true
	}
	descs, err := v.List()
	if err != nil {
		return nil, fmt.Errorf("list EFI variables: %w", err)
	}
	for _, d := range descs {
		n, ok := bootNumber(d)
		if !ok {
			continue
		}
		_, raw, err := v.Get(d)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", d.Name, err)
		}
		e := Entry{Number: n, Raw: raw}
		e.Option, e.Err = ParseLoadOption(raw)
		t.Entries[n] = e
	}
	return t, nil
}

func bootNumber(d efivarfs.VariableDescriptor) (uint16, bool) {
	if d.GUID != GlobalGUID || len(d.Name) != 8 || !strings.HasPrefix(d.Name, "Boot") {
		return 0, false
	}
	hex := d.Name[4:]
	if strings.ToUpper(hex) != hex {
		return 0, false
	}
	n, err := strconv.ParseUint(hex, 16, 16)
	return uint16(n), err == nil
}

// ParseOrder decodes BootOrder: little-endian 16-bit numbers.
func ParseOrder(b []byte) ([]uint16, error) {
	if len(b)%2 != 0 {
		return nil, fmt.Errorf("BootOrder of %d bytes: not a list of 16-bit numbers", len(b))
	}
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out, nil
}

func marshalOrder(order []uint16) []byte {
	b := make([]byte, 2*len(order))
	for i, n := range order {
		binary.LittleEndian.PutUint16(b[2*i:], n)
	}
	return b
}

// FormatOrder is BootOrder as efibootmgr prints it: 0003,0001,0000.
func FormatOrder(order []uint16) string {
	s := make([]string, len(order))
	for i, n := range order {
		s[i] = fmt.Sprintf("%04X", n)
	}
	return strings.Join(s, ",")
}

// describe names an entry for a log line: Boot0003 "UEFI PXEv4 (MAC:525400311802)".
func (t *Table) describe(n uint16) string {
	e, ok := t.Entries[n]
	if !ok {
		return BootName(n) + " (missing)"
	}
	return fmt.Sprintf("%s %q", e.Name(), e.Option.Description)
}

// networkLeader picks the entry that must boot first: the network entry this
// boot came through (BootCurrent), else the first network entry in BootOrder
// for one of the machine's NICs, IPv4 PXE before the others, else the first
// network entry at all.
func (t *Table) networkLeader(macs []net.HardwareAddr) (uint16, bool) {
	isNet := func(n uint16) (Kind, net.HardwareAddr, bool) {
		e, ok := t.Entries[n]
		if !ok || e.Err != nil {
			return "", nil, false
		}
		k, mac := e.Option.Describe()
		return k, mac, k.Network()
	}
	if t.HasCurrent {
		if _, _, ok := isNet(t.Current); ok {
			return t.Current, true
		}
	}
	mine := func(mac net.HardwareAddr) bool {
		for _, m := range macs {
			if bytes.Equal(m, mac) {
				return true
			}
		}
		return len(macs) == 0
	}
	candidates := append([]uint16(nil), t.Order...)
	for _, n := range t.numbers() {
		if !contains(candidates, n) {
			candidates = append(candidates, n)
		}
	}
	for _, want := range []func(Kind, net.HardwareAddr) bool{
		func(k Kind, mac net.HardwareAddr) bool { return k == KindPXE4 && mine(mac) },
		func(k Kind, mac net.HardwareAddr) bool { return mine(mac) },
		func(Kind, net.HardwareAddr) bool { return true },
	} {
		for _, n := range candidates {
			if k, mac, ok := isNet(n); ok && want(k, mac) {
				return n, true
			}
		}
	}
	return 0, false
}

func (t *Table) numbers() []uint16 {
	ns := make([]uint16, 0, len(t.Entries))
	for n := range t.Entries {
		ns = append(ns, n)
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
	return ns
}

func contains(list []uint16, n uint16) bool {
	for _, m := range list {
		if m == n {
			return true
		}
	}
	return false
}

// without returns list without any of drop, in order.
func without(list []uint16, drop ...uint16) []uint16 {
	out := make([]uint16, 0, len(list))
	for _, n := range list {
		if !contains(drop, n) {
			out = append(out, n)
		}
	}
	return out
}

func (t *Table) free() (uint16, bool) {
	for n := 0; n <= 0xffff; n++ {
		if _, used := t.Entries[uint16(n)]; !used {
			return uint16(n), true
		}
	}
	return 0, false
}
