package efiboot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/u-root/u-root/pkg/efivarfs"
)

// Device path nodes as OVMF writes them for a q35 machine: PciRoot(0x0),
// Pci(0x1,0x0) (the NIC), MAC(…), IPv4(…)/IPv6(…)/Uri(), and the firmware's own
// entries (Sata for the DVD, a bare Pci for a virtio disk, a firmware volume
// file for UiApp and the shell).
func devNode(typ, sub byte, data []byte) []byte {
	b := []byte{typ, sub, 0, 0}
	binary.LittleEndian.PutUint16(b[2:], uint16(4+len(data)))
	return append(b, data...)
}

func pciRoot() []byte { return devNode(0x02, 0x01, []byte{0xd0, 0x41, 0x03, 0x0a, 0, 0, 0, 0}) }
func pci(dev, fn byte) []byte {
	return devNode(0x01, 0x01, []byte{fn, dev})
}
func macNode(mac string) []byte {
	hw, _ := net.ParseMAC(mac)
	d := make([]byte, 33)
	copy(d, hw)
	d[32] = 1
	return devNode(0x03, 11, d)
}
func ipv4Node() []byte { return devNode(0x03, 12, make([]byte, 23)) }
func ipv6Node() []byte { return devNode(0x03, 13, make([]byte, 56)) }
func uriNode() []byte  { return devNode(0x03, 24, nil) }
func endNode() []byte  { return []byte{0x7f, 0xff, 4, 0} }
func fvFile() []byte {
	return append(devNode(0x04, 0x07, make([]byte, 16)), devNode(0x04, 0x06, make([]byte, 16))...)
}
func path(nodes ...[]byte) []byte {
	return append(bytes.Join(nodes, nil), endNode()...)
}

const (
	macA = "52:54:00:31:18:02"
	macB = "52:54:00:31:18:99"
)

// ovmf writes the variables a q35 OVMF machine with one NIC (macA) and a disk
// holds after its first boot, BootCurrent the PXEv4 entry it booted the ramdisk
// from; more are extra entries.
func ovmf(t *testing.T, current int, more map[uint16]LoadOption) DirVars {
	t.Helper()
	v := DirVars(t.TempDir())
	entries := map[uint16]LoadOption{
		0x0000: {Attributes: 0x109, Description: "UiApp", FilePath: path(fvFile())},
		0x0001: {Attributes: 1, Description: "UEFI QEMU DVD-ROM QM00005 ", FilePath: path(pciRoot(), pci(0x1f, 2), devNode(0x03, 18, make([]byte, 6)))},
		0x0002: {Attributes: 1, Description: "UEFI Misc Device", FilePath: path(pciRoot(), pci(3, 0))},
		0x0003: {Attributes: 1, Description: "UEFI PXEv4 (MAC:525400311802)", FilePath: path(pciRoot(), pci(2, 0), macNode(macA), ipv4Node())},
		0x0004: {Attributes: 1, Description: "UEFI PXEv6 (MAC:525400311802)", FilePath: path(pciRoot(), pci(2, 0), macNode(macA), ipv6Node())},
		0x0005: {Attributes: 1, Description: "UEFI HTTPv4 (MAC:525400311802)", FilePath: path(pciRoot(), pci(2, 0), macNode(macA), ipv4Node(), uriNode())},
		0x0006: {Attributes: 1, Description: "EFI Internal Shell", FilePath: path(fvFile())},
	}
	for n, o := range more {
		entries[n] = o
	}
	for n, o := range entries {
		set(t, v, BootName(n), o.Marshal())
	}
	set(t, v, "BootOrder", marshalOrder([]uint16{1, 2, 3, 4, 5, 6}))
	if current >= 0 {
		set(t, v, "BootCurrent", marshalOrder([]uint16{uint16(current)}))
	}
	return v
}

func set(t *testing.T, v efivarfs.EFIVar, name string, data []byte) {
	t.Helper()
	if err := v.Set(efivarfs.VariableDescriptor{Name: name, GUID: GlobalGUID}, bootAttrs, data); err != nil {
		t.Fatal(err)
	}
}

var espGUID = [16]byte{0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x00}

func osEntry(name string) *OSEntry {
	return &OSEntry{Description: OSPrefix + name, FilePath: HardDriveFile(1, 2048, 131072, espGUID, "/EFI/BOOT/BOOTX64.EFI")}
}

func order(t *testing.T, v efivarfs.EFIVar) []uint16 {
	t.Helper()
	tab, err := Read(v)
	if err != nil {
		t.Fatal(err)
	}
	return tab.Order
}

func bcdEntries(t *testing.T, v efivarfs.EFIVar) []uint16 {
	t.Helper()
	tab, err := Read(v)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint16
	for _, n := range tab.numbers() {
		if strings.HasPrefix(tab.Entries[n].Option.Description, OSPrefix) {
			out = append(out, n)
		}
	}
	return out
}

func deploy(t *testing.T, v efivarfs.EFIVar, macs []string, os *OSEntry) *Plan {
	t.Helper()
	var hw []net.HardwareAddr
	for _, m := range macs {
		a, _ := net.ParseMAC(m)
		hw = append(hw, a)
	}
	p, err := Prepare(v, hw, os)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(v); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDeployPutsNetworkFirstThenOS(t *testing.T) {
	v := ovmf(t, 3, nil)
	p := deploy(t, v, []string{macA}, osEntry("debian-stock"))
	if want := []uint16{3, 7, 1, 2, 4, 5, 6}; !reflect.DeepEqual(order(t, v), want) {
		t.Fatalf("BootOrder %s, want %s", FormatOrder(order(t, v)), FormatOrder(want))
	}
	tab, _ := Read(v)
	e := tab.Entries[7]
	if e.Err != nil || e.Option.Description != "bcd: debian-stock" || e.Option.Attributes != LoadOptionActive {
		t.Fatalf("Boot0007: %+v", e)
	}
	if k, _ := e.Option.Describe(); k != KindDisk {
		t.Fatalf("Boot0007 kind %s", k)
	}
	if !strings.Contains(p.Summary, `network Boot0003 "UEFI PXEv4 (MAC:525400311802)" first`) {
		t.Fatalf("summary %q", p.Summary)
	}
	rec, raw, err := ParseRecord(p.RecordFile())
	if err != nil || rec.Number != "0003" || !bytes.Equal(raw, tab.Entries[3].Raw) {
		t.Fatalf("record %+v %v", rec, err)
	}
}

func TestRedeployKeepsOneEntry(t *testing.T) {
	v := ovmf(t, 3, nil)
	deploy(t, v, []string{macA}, osEntry("debian-stock"))
	// The second deploy boots through the same network entry, with another image.
	deploy(t, v, []string{macA}, osEntry("ubuntu-24.04"))
	deploy(t, v, []string{macA}, osEntry("ubuntu-24.04"))
	if got := bcdEntries(t, v); !reflect.DeepEqual(got, []uint16{7}) {
		t.Fatalf("bcd entries %v, want only Boot0007", got)
	}
	if want := []uint16{3, 7, 1, 2, 4, 5, 6}; !reflect.DeepEqual(order(t, v), want) {
		t.Fatalf("BootOrder %s", FormatOrder(order(t, v)))
	}
	tab, _ := Read(v)
	if d := tab.Entries[7].Option.Description; d != "bcd: ubuntu-24.04" {
		t.Fatalf("Boot0007 is %q", d)
	}
}

func TestDeployRemovesDuplicates(t *testing.T) {
	// Two bcd entries (an older tree wrote one a deploy) and an operator's copy of
	// the same loader path: one remains, the lowest number.
	dup := *osEntry("old")
	v := ovmf(t, 3, map[uint16]LoadOption{
		0x0009: {Attributes: 1, Description: "bcd: older", FilePath: HardDriveFile(2, 4096, 1000, espGUID, `\EFI\debian\grubx64.efi`)},
		0x000A: {Attributes: 1, Description: "my copy", FilePath: dup.FilePath},
	})
	set(t, v, "BootOrder", marshalOrder([]uint16{0xA, 1, 2, 9, 3, 4, 5, 6}))
	p := deploy(t, v, []string{macA}, osEntry("debian-stock"))
	if got := bcdEntries(t, v); !reflect.DeepEqual(got, []uint16{9}) {
		t.Fatalf("bcd entries %v", got)
	}
	if want := []uint16{3, 9, 1, 2, 4, 5, 6}; !reflect.DeepEqual(order(t, v), want) {
		t.Fatalf("BootOrder %s", FormatOrder(order(t, v)))
	}
	if _, _, err := v.Get(efivarfs.VariableDescriptor{Name: "Boot000A", GUID: GlobalGUID}); !errors.Is(err, efivarfs.ErrVarNotExist) {
		t.Fatalf("Boot000A still there: %v", err)
	}
	if !strings.Contains(p.Summary, "removed 000A") {
		t.Fatalf("summary %q", p.Summary)
	}
}

func TestNetworkLeaderChoice(t *testing.T) {
	otherNIC := map[uint16]LoadOption{
		0x0010: {Attributes: 1, Description: "UEFI PXEv4 (MAC:5254003118FF)", FilePath: path(pciRoot(), pci(4, 0), macNode(macB), ipv4Node())},
		0x0011: {Attributes: 1, Description: "iPXE option ROM", FilePath: path(pciRoot(), pci(2, 0), macNode(macA))},
	}
	for _, tc := range []struct {
		name    string
		current int
		order   []uint16
		macs    []string
		remove  []uint16
		want    uint16
	}{
		{"BootCurrent is the PXE entry", 3, []uint16{1, 2, 3}, []string{macA}, nil, 3},
		{"BootCurrent is another NIC's entry", 0x10, []uint16{1, 3, 0x10}, []string{macA}, nil, 0x10},
		{"BootCurrent is the option ROM's entry", 0x11, []uint16{3, 0x11}, []string{macA}, nil, 0x11},
		{"no BootCurrent: this NIC's IPv4 PXE", -1, []uint16{0x10, 4, 5, 3}, []string{macA}, nil, 3},
		{"BootCurrent a disk entry: this NIC's IPv4 PXE", 2, []uint16{2, 0x10, 3}, []string{macA}, nil, 3},
		{"this NIC's IPv4 PXE outside BootOrder", -1, []uint16{0x10, 0x11, 4}, []string{macA}, nil, 3},
		{"no IPv4 PXE of this NIC: its first entry", -1, []uint16{0x10, 0x11, 4}, []string{macA}, []uint16{3}, 0x11},
		{"no MACs known: the first IPv4 PXE", -1, []uint16{1, 0x10, 3}, nil, nil, 0x10},
		{"NIC not in BootOrder", -1, []uint16{1, 2}, []string{macB}, nil, 0x10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := ovmf(t, tc.current, otherNIC)
			set(t, v, "BootOrder", marshalOrder(tc.order))
			for _, n := range tc.remove {
				v.Remove(efivarfs.VariableDescriptor{Name: BootName(n), GUID: GlobalGUID})
			}
			p := deploy(t, v, tc.macs, nil)
			if p.Order[0] != tc.want {
				t.Fatalf("first %04X, want %04X (%s)", p.Order[0], tc.want, p.Summary)
			}
			if got := order(t, v); got[0] != tc.want || len(got) != len(without(tc.order, tc.want))+1 {
				t.Fatalf("BootOrder %s", FormatOrder(got))
			}
		})
	}
}

func TestNoNetworkEntry(t *testing.T) {
	v := DirVars(t.TempDir())
	set(t, v, BootName(1), LoadOption{Attributes: 1, Description: "disk", FilePath: path(pciRoot(), pci(3, 0))}.Marshal())
	set(t, v, "BootOrder", marshalOrder([]uint16{1}))
	if _, err := Prepare(v, nil, osEntry("x")); !errors.Is(err, ErrNoNetworkEntry) {
		t.Fatalf("err %v", err)
	}
	if got := order(t, v); !reflect.DeepEqual(got, []uint16{1}) {
		t.Fatalf("BootOrder changed: %s", FormatOrder(got))
	}
}

// grubInstall does to the variables what grub-install (through efibootmgr -c)
// does: a new entry, first in BootOrder.
func grubInstall(t *testing.T, v efivarfs.EFIVar, n uint16) {
	t.Helper()
	set(t, v, BootName(n), LoadOption{Attributes: 1, Description: "debian", FilePath: HardDriveFile(1, 2048, 131072, espGUID, `\EFI\debian\shimx64.efi`)}.Marshal())
	set(t, v, "BootOrder", marshalOrder(append([]uint16{n}, order(t, v)...)))
}

func TestKeepAfterGrubInstall(t *testing.T) {
	v := ovmf(t, 3, nil)
	p := deploy(t, v, []string{macA}, osEntry("debian-stock"))
	rec, raw, err := ParseRecord(p.RecordFile())
	if err != nil {
		t.Fatal(err)
	}
	grubInstall(t, v, 8)
	r, err := Keep(v, rec, raw)
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint16{3, 8, 7, 1, 2, 4, 5, 6}; !r.Changed || !reflect.DeepEqual(order(t, v), want) {
		t.Fatalf("%v: BootOrder %s, want %s", r, FormatOrder(order(t, v)), FormatOrder(want))
	}
	// Already first: nothing written.
	bo := filepath.Join(string(v), "BootOrder-"+GlobalGUID.String())
	before, _ := os.Stat(bo)
	os.Chtimes(bo, before.ModTime().Add(-3600e9), before.ModTime().Add(-3600e9))
	before, _ = os.Stat(bo)
	r, err = Keep(v, rec, raw)
	after, _ := os.Stat(bo)
	if err != nil || r.Changed || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("second Keep: %v %v (rewritten: %v)", r, err, !after.ModTime().Equal(before.ModTime()))
	}
}

func TestKeepFindsRenumberedEntry(t *testing.T) {
	v := ovmf(t, 3, nil)
	p := deploy(t, v, []string{macA}, osEntry("debian-stock"))
	rec, raw, _ := ParseRecord(p.RecordFile())
	// Firmware recreated its PXE entry as Boot000C (after a NIC change or a
	// firmware update) and put the disk first.
	v.Remove(efivarfs.VariableDescriptor{Name: "Boot0003", GUID: GlobalGUID})
	set(t, v, "Boot000C", raw)
	set(t, v, "BootOrder", marshalOrder([]uint16{2, 7, 0xC}))
	r, err := Keep(v, rec, raw)
	if err != nil || r.Leader != 0xC || !reflect.DeepEqual(order(t, v), []uint16{0xC, 2, 7}) {
		t.Fatalf("%v %v: %s", r, err, FormatOrder(order(t, v)))
	}
	// Its value changed too (another firmware version): found by its description.
	v.Remove(efivarfs.VariableDescriptor{Name: "Boot000C", GUID: GlobalGUID})
	set(t, v, "Boot000D", LoadOption{Attributes: 1, Description: rec.Description, FilePath: path(pciRoot(), pci(5, 0), macNode(macA), ipv4Node())}.Marshal())
	set(t, v, "BootOrder", marshalOrder([]uint16{2, 0xD}))
	if r, err := Keep(v, rec, raw); err != nil || r.Leader != 0xD {
		t.Fatalf("%v %v", r, err)
	}
	// Gone: an error that says so, BootOrder untouched.
	v.Remove(efivarfs.VariableDescriptor{Name: "Boot000D", GUID: GlobalGUID})
	set(t, v, "BootOrder", marshalOrder([]uint16{2, 7}))
	if _, err := Keep(v, rec, raw); !errors.Is(err, ErrRecordedEntryGone) {
		t.Fatalf("err %v", err)
	}
	if !reflect.DeepEqual(order(t, v), []uint16{2, 7}) {
		t.Fatalf("BootOrder %s", FormatOrder(order(t, v)))
	}
}

func TestParseLoadOptionRefuses(t *testing.T) {
	good := LoadOption{Attributes: 1, Description: "UEFI PXEv4", FilePath: path(pciRoot(), macNode(macA), ipv4Node())}.Marshal()
	long := LoadOption{Attributes: 1, Description: "x", FilePath: path(pciRoot())}.Marshal()
	binary.LittleEndian.PutUint16(long[4:6], 0xff00)
	noEnd := LoadOption{Attributes: 1, Description: "x", FilePath: pciRoot()}.Marshal()
	zeroLen := LoadOption{Attributes: 1, Description: "x", FilePath: []byte{1, 1, 0, 0, 0x7f, 0xff, 4, 0}}.Marshal()
	for name, b := range map[string][]byte{
		"empty":                    nil,
		"header only":              good[:6],
		"description unterminated": good[:12],
		"path longer than the var": long,
		"no End node":              noEnd,
		"node of length 0":         zeroLen,
	} {
		if _, err := ParseLoadOption(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	o, err := ParseLoadOption(append(good, 0xde, 0xad))
	if err != nil || o.Description != "UEFI PXEv4" || !bytes.Equal(o.Optional, []byte{0xde, 0xad}) {
		t.Fatalf("%+v %v", o, err)
	}
	// A description with a character above U+00FF: its low byte is 0.
	o, err = ParseLoadOption(LoadOption{Description: "Ā disk", FilePath: path(pciRoot())}.Marshal())
	if err != nil || o.Description != "Ā disk" {
		t.Fatalf("%q %v", o.Description, err)
	}
}

func TestHardDriveFile(t *testing.T) {
	p := HardDriveFile(1, 2048, 131072, espGUID, "/EFI/BOOT/BOOTX64.EFI")
	nodes, err := parseNodes(p)
	if err != nil || len(nodes) != 2 {
		t.Fatalf("%v %v", nodes, err)
	}
	hd := nodes[0].data
	if binary.LittleEndian.Uint32(hd[0:]) != 1 || binary.LittleEndian.Uint64(hd[4:]) != 2048 || binary.LittleEndian.Uint64(hd[12:]) != 131072 ||
		!bytes.Equal(hd[20:36], espGUID[:]) || hd[36] != 2 || hd[37] != 2 {
		t.Fatalf("HD node % x", hd)
	}
	if want := utf16z(`\EFI\BOOT\BOOTX64.EFI`); !bytes.Equal(nodes[1].data, want) {
		t.Fatalf("file node % x", nodes[1].data)
	}
}

func TestShow(t *testing.T) {
	v := ovmf(t, 3, nil)
	deploy(t, v, []string{macA}, osEntry("debian-stock"))
	out, err := Show(v)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"BootOrder: 0003,0007,0001", "BootCurrent: 0003",
		`Boot0003* "UEFI PXEv4 (MAC:525400311802)" pxe-ipv4 52:54:00:31:18:02`, `Boot0007* "bcd: debian-stock" disk`,
		`Boot0000* "UiApp" other (not in BootOrder)`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

func FuzzParseLoadOption(f *testing.F) {
	f.Add(LoadOption{Attributes: 1, Description: "UEFI PXEv4 (MAC:525400311802)", FilePath: path(pciRoot(), pci(2, 0), macNode(macA), ipv4Node())}.Marshal())
	f.Add(LoadOption{Attributes: 1, Description: "bcd: x", FilePath: HardDriveFile(1, 2048, 1, espGUID, `\EFI\BOOT\BOOTX64.EFI`), Optional: []byte("opt")}.Marshal())
	f.Add([]byte{1, 0, 0, 0, 4, 0, 0, 0, 0x7f, 0xff, 4, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := ParseLoadOption(b)
		if err != nil {
			return
		}
		o.Describe()
		again, err := ParseLoadOption(o.Marshal())
		if err != nil {
			t.Fatalf("re-parse of a parsed option: %v", err)
		}
		if again.Attributes != o.Attributes || again.Description != o.Description || !bytes.Equal(again.FilePath, o.FilePath) || !bytes.Equal(again.Optional, o.Optional) {
			t.Fatalf("round trip: %+v != %+v", again, o)
		}
	})
}

func FuzzParseRecord(f *testing.F) {
	f.Add([]byte(`{"number":"0003","description":"x","load_option":"01000000040000007fff0400"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseRecord(b)
	})
}
