package deploy

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf16"
)

type gptPart struct {
	typ, guid   GUID
	first, last uint64
	name        string
}

// makeGPT builds a disk of sectors*ss bytes with a protective MBR and valid
// primary and backup GPTs, for tests and fuzz seeds.
func makeGPT(ss int, sectors uint64, parts []gptPart) []byte {
	le := binary.LittleEndian
	disk := make([]byte, uint64(ss)*sectors)
	mbr := disk[:512]
	e := mbr[446:]
	e[4] = 0xee
	le.PutUint32(e[8:], 1)
	le.PutUint32(e[12:], uint32(min(sectors-1, 0xffffffff)))
	mbr[510], mbr[511] = 0x55, 0xaa
	const n, esize = 128, 128
	entries := make([]byte, n*esize)
	for i, p := range parts {
		en := entries[i*esize:]
		copy(en[0:], p.typ[:])
		copy(en[16:], p.guid[:])
		le.PutUint64(en[32:], p.first)
		le.PutUint64(en[40:], p.last)
		for j, c := range utf16.Encode([]rune(p.name)) {
			le.PutUint16(en[56+2*j:], c)
		}
	}
	entrySectors := uint64((n*esize + ss - 1) / ss)
	last := sectors - 1
	hdr := func(my, alt, entryLBA uint64) []byte {
		h := make([]byte, ss)
		copy(h, gptSignature)
		le.PutUint32(h[8:], 0x00010000)
		le.PutUint32(h[12:], 92)
		le.PutUint64(h[24:], my)
		le.PutUint64(h[32:], alt)
		le.PutUint64(h[40:], 2+entrySectors)
		le.PutUint64(h[48:], last-entrySectors-1)
		g := MustGUID("11111111-2222-3333-4444-555555555555")
		copy(h[56:72], g[:])
		le.PutUint64(h[72:], entryLBA)
		le.PutUint32(h[80:], n)
		le.PutUint32(h[84:], esize)
		le.PutUint32(h[88:], crc32.ChecksumIEEE(entries))
		le.PutUint32(h[16:], headerCRC(h[:92]))
		return h
	}
	copy(disk[ss:], hdr(1, last, 2))
	copy(disk[2*ss:], entries)
	copy(disk[(last-entrySectors)*uint64(ss):], entries)
	copy(disk[last*uint64(ss):], hdr(last, 1, last-entrySectors))
	return disk
}

func TestGUID(t *testing.T) {
	for _, s := range []string{"c12a7328-f81f-11d2-ba4b-00a0c93ec93b", "4f68bce3-e8cd-4db1-96e7-fbcaf984b709"} {
		g, err := ParseGUID(strings.ToUpper(s))
		if err != nil || g.String() != s {
			t.Errorf("%s: %s %v", s, g, err)
		}
	}
	// On disk the first three fields are little-endian.
	if TypeESP[0] != 0x28 || TypeESP[3] != 0xc1 || TypeESP[8] != 0xba {
		t.Errorf("ESP GUID bytes % x", TypeESP[:])
	}
	for _, bad := range []string{"", "c12a7328f81f11d2ba4b00a0c93ec93b", "z12a7328-f81f-11d2-ba4b-00a0c93ec93b"} {
		if _, err := ParseGUID(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestReadPartitionTableSynthetic(t *testing.T) {
	for _, ss := range []int{512, 4096} {
		sectors := uint64(4 << 20 / ss)
		parts := []gptPart{
			{TypeESP, MustGUID("aaaaaaaa-0000-0000-0000-000000000001"), 40, 99, "EFI System"},
			{TypeRootX86_64, MustGUID("aaaaaaaa-0000-0000-0000-000000000002"), 100, sectors - 40, "root"},
		}
		disk := makeGPT(ss, sectors, parts)
		pt, err := ReadPartitionTable(bytes.NewReader(disk), int64(len(disk)), 0)
		if err != nil {
			t.Fatalf("%d-byte sectors: %v", ss, err)
		}
		if pt.Kind != "gpt" || pt.SectorSize != ss || len(pt.Partitions) != 2 {
			t.Fatalf("%+v", pt)
		}
		root := pt.Partitions[1]
		if root.Number != 2 || root.Type != TypeRootX86_64 || root.Name != "root" || root.Start != 100*int64(ss) ||
			root.Size != int64(sectors-40-100+1)*int64(ss) || root.PartUUID(pt) != "aaaaaaaa-0000-0000-0000-000000000002" {
			t.Errorf("root %+v", root)
		}
		// Every corruption of what locates the partitions is refused.
		for name, off := range map[string]int{"header": ss + 40, "entries": 2*ss + 33} {
			bad := bytes.Clone(disk)
			bad[off] ^= 1
			if _, err := ReadPartitionTable(bytes.NewReader(bad), int64(len(bad)), 0); err == nil || !strings.Contains(err.Error(), "CRC") {
				t.Errorf("%d: corrupt %s: %v", ss, name, err)
			}
		}
		// A disk smaller than the table says is refused.
		if _, err := ReadPartitionTable(bytes.NewReader(disk), int64(len(disk))/2, ss); err == nil {
			t.Errorf("%d: a truncated disk was accepted", ss)
		}
	}
}

func TestReadPartitionTableMBR(t *testing.T) {
	disk := make([]byte, 8<<20)
	disk[440], disk[441], disk[442], disk[443] = 0x78, 0x56, 0x34, 0x12
	e := disk[446+16:]
	e[4] = 0x83
	binary.LittleEndian.PutUint32(e[8:], 2048)
	binary.LittleEndian.PutUint32(e[12:], 4096)
	disk[510], disk[511] = 0x55, 0xaa
	pt, err := ReadPartitionTable(bytes.NewReader(disk), int64(len(disk)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if pt.Kind != "mbr" || len(pt.Partitions) != 1 || pt.Partitions[0].Number != 2 || pt.Partitions[0].Start != 2048*512 ||
		pt.Partitions[0].PartUUID(pt) != "12345678-02" {
		t.Errorf("%+v", pt)
	}
	if _, err := ReadPartitionTable(bytes.NewReader(make([]byte, 1<<20)), 1<<20, 0); err == nil {
		t.Error("a blank disk has a partition table")
	}
}

// TestReadPartitionTableSgdisk reads what sgdisk wrote, and moves the backup GPT
// to the end of a larger disk so that sgdisk -v finds nothing wrong.
func TestReadPartitionTableSgdisk(t *testing.T) {
	img := smallImage(t)
	f, err := os.Open(img.path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pt, err := ReadPartitionTable(f, img.size, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(pt.Partitions) != 3 {
		t.Fatalf("%+v", pt.Partitions)
	}
	for i, want := range []struct {
		typ         GUID
		name        string
		start, size int64
	}{
		{TypeESP, "EFI System", img.espStart, img.espSize},
		{TypeRootX86_64, "linux-root", img.rootStart, img.rootSize},
		{TypeLinuxFS, "data", img.dataStart, img.dataSize},
	} {
		p := pt.Partitions[i]
		if p.Type != want.typ || p.Name != want.name || p.Start != want.start || p.Size != want.size {
			t.Errorf("partition %d: %+v, want %+v", i+1, p, want)
		}
	}
	if pt.Partitions[1].GUID.String() != img.rootGUID {
		t.Errorf("root GUID %s, sgdisk says %s", pt.Partitions[1].GUID, img.rootGUID)
	}

	// Relocate onto a disk 8 MiB larger.
	b, err := os.ReadFile(img.path)
	if err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(t.TempDir(), "big.img")
	diskSize := img.size + 8<<20
	if err := os.WriteFile(big, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, diskSize); err != nil {
		t.Fatal(err)
	}
	out := run(t, "sgdisk", "-v", big)
	if !strings.Contains(out, "Problem") {
		t.Logf("before relocation sgdisk -v says:\n%s", out)
	}
	bf, err := os.OpenFile(big, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer bf.Close()
	if err := relocateBackupGPT(bf, pt, img.size, diskSize); err != nil {
		t.Fatal(err)
	}
	out = run(t, "sgdisk", "-v", big)
	if !strings.Contains(out, "No problems found") {
		t.Errorf("sgdisk -v after relocation:\n%s", out)
	}
	pt2, err := ReadPartitionTable(bf, diskSize, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(pt2.Partitions) != 3 || pt2.Partitions[1] != pt.Partitions[1] {
		t.Errorf("partitions changed: %+v", pt2.Partitions)
	}
}

func FuzzReadPartitionTable(f *testing.F) {
	f.Add(makeGPT(512, 256, []gptPart{{TypeESP, GUID{1}, 34, 99, "EFI"}, {TypeRootX86_64, GUID{2}, 100, 200, "root"}}))
	f.Add(makeGPT(4096, 64, []gptPart{{TypeLinuxFS, GUID{3}, 6, 50, "x"}}))
	mbr := make([]byte, 64<<10)
	mbr[446+4], mbr[446+8], mbr[446+12], mbr[510], mbr[511] = 0x83, 1, 16, 0x55, 0xaa
	f.Add(mbr)
	f.Add([]byte("EFI PART"))
	f.Fuzz(func(t *testing.T, disk []byte) {
		pt, err := ReadPartitionTable(bytes.NewReader(disk), int64(len(disk)), 0)
		if err != nil {
			return
		}
		for _, p := range pt.Partitions {
			if p.Start < 0 || p.Size <= 0 || p.Start+p.Size > int64(len(disk)) || p.Number < 1 {
				t.Fatalf("partition %+v outside a %d-byte disk", p, len(disk))
			}
		}
	})
}
