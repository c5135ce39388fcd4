package deploy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// oldSignatureSpan is zeroed at the start and at the end of every partition of the
// disk's old partition table: md superblocks 1.1 (at 0) and 1.2 (at 4 KiB), LVM's
// label (sectors 0-3), the primary superblocks of ext2/3/4, XFS, btrfs (64 KiB),
// swap and LUKS at the start; md 0.90 and 1.0 within the last 128 KiB at the end.
const oldSignatureSpan = 1 * mib

const mdMagic = 0xa92b4efc

// probeSignatures names the signatures found in [off, off+size) of r, as the
// deploy's report says them: "lvm2", "md 1.2", "ext4", ... It reads a few sectors.
func probeSignatures(r io.ReaderAt, off, size int64) []string {
	if size <= 0 {
		return nil
	}
	read := func(at, n int64) []byte {
		if at < 0 || at+n > size {
			return nil
		}
		b := make([]byte, n)
		if _, err := r.ReadAt(b, off+at); err != nil && !errors.Is(err, io.EOF) {
			return nil
		}
		return b
	}
	le := binary.LittleEndian
	var found []string
	for s := int64(0); s < 4; s++ { // LVM's label is in one of the first four sectors
		if b := read(s*512, 32); b != nil && string(b[:8]) == "LABELONE" && string(b[24:32]) == "LVM2 001" {
			found = append(found, "lvm2")
			break
		}
	}
	md := func(at int64, version string) {
		if b := read(at, 8); b != nil && le.Uint32(b) == mdMagic {
			found = append(found, "md "+version)
		}
	}
	md(0, "1.1")
	md(4096, "1.2")
	sectors := size / 512
	md((sectors-16)&^7*512, "1.0")
	md(((sectors&^127)-128)*512, "0.90")
	if b := read(1024+56, 2); b != nil && le.Uint16(b) == 0xef53 {
		found = append(found, "ext4")
	}
	if b := read(0, 6); b != nil {
		switch {
		case string(b[:4]) == "XFSB":
			found = append(found, "xfs")
		case bytes.Equal(b, []byte("LUKS\xba\xbe")):
			found = append(found, "luks")
		}
	}
	if b := read(65536+64, 8); b != nil && string(b) == "_BHRfS_M" {
		found = append(found, "btrfs")
	}
	for _, ps := range []int64{4096, 8192, 16384, 65536} {
		if b := read(ps-10, 10); b != nil && (string(b) == "SWAPSPACE2" || string(b) == "SWAP-SPACE") {
			found = append(found, "swap")
			break
		}
	}
	if b := read(0, 512); b != nil && b[510] == 0x55 && b[511] == 0xaa &&
		(string(b[82:87]) == "FAT32" || string(b[54:57]) == "FAT") {
		found = append(found, "vfat")
	}
	return found
}

// diskTableSignatures names the partition tables at the disk's ends: "gpt" for a
// primary or backup GPT header, "dos" for an MBR that is not GPT's protective one.
func diskTableSignatures(r io.ReaderAt, size int64, sectorSize int) []string {
	var found []string
	gpt := false
	for _, ss := range []int64{512, 4096} {
		if sectorSize != 0 && int64(sectorSize) != ss {
			continue
		}
		b := make([]byte, 8)
		if _, err := r.ReadAt(b, ss); err == nil && string(b) == gptSignature {
			gpt = true
		}
		if _, err := r.ReadAt(b, size-ss); err == nil && string(b) == gptSignature {
			gpt = true
		}
	}
	if gpt {
		found = append(found, "gpt")
	}
	mbr := make([]byte, 512)
	if _, err := r.ReadAt(mbr, 0); err == nil && mbr[510] == 0x55 && mbr[511] == 0xaa && !gpt {
		dos := false
		for i := 0; i < 4; i++ {
			if t := mbr[446+16*i+4]; t != 0 && t != mbrTypeProtective {
				dos = true
			}
		}
		if dos {
			found = append(found, "dos")
		}
	}
	return found
}

// wipeOld removes what an earlier system left on the disk that the image may not
// overwrite, before anything of the image is written: the old partition table is
// read first, and every old partition's first and last oldSignatureSpan bytes are
// zeroed, where md and LVM members on partitions (and filesystems) keep their
// superblocks; the disk's own ends follow in wipe. It returns what it found, as
// "gpt", "lvm2 on old partition 2", "md 1.2 on old partition 3". Zeroing is bounded
// to 2 MiB per old partition. The writes are synced by the wipe that follows.
func (t *target) wipeOld() ([]string, error) {
	found := diskTableSignatures(t, t.size, t.sectorSize)
	for _, s := range probeSignatures(t, 0, t.size) {
		found = append(found, s+" on the whole disk")
	}
	table, err := ReadPartitionTable(t, t.size, t.sectorSize)
	if err != nil {
		// A damaged primary GPT: the backup may still say where the partitions were.
		for _, ss := range []int{512, 4096} {
			if t.sectorSize == 0 || t.sectorSize == ss {
				if table, err = readBackupGPT(t, t.size, ss); err == nil {
					break
				}
			}
		}
	}
	if err != nil {
		// No table that verifies: the disk's ends are wiped anyway.
		return found, nil
	}
	parts := table.Partitions
	if table.Kind == "mbr" {
		parts = append(parts, mbrLogicalPartitions(t, t.size, table.SectorSize)...)
	}
	zero := make([]byte, oldSignatureSpan)
	var errs []error
	for _, p := range parts {
		if p.Start >= t.size {
			continue
		}
		size := min(p.Size, t.size-p.Start)
		for _, s := range probeSignatures(t, p.Start, size) {
			found = append(found, fmt.Sprintf("%s on old partition %d", s, p.Number))
		}
		n := min(int64(oldSignatureSpan), size)
		for _, at := range []int64{p.Start, p.Start + size - n} {
			if _, err := t.buffered.WriteAt(zero[:n], at); err != nil {
				errs = append(errs, fmt.Errorf("zero old partition %d of %s at %d: %w", p.Number, t.path, at, err))
			}
		}
	}
	return found, errors.Join(errs...)
}

// mbrLogicalPartitions follows an MBR's extended partition's chain of EBRs to the
// logical partitions, numbered from 5 as Linux numbers them. The chain is bounded
// (at most 128 links, every link inside the extended partition and the disk).
func mbrLogicalPartitions(r io.ReaderAt, size int64, ss int) []Partition {
	mbr := make([]byte, 512)
	if _, err := r.ReadAt(mbr, 0); err != nil {
		return nil
	}
	le := binary.LittleEndian
	var extStart, extSize int64
	for i := 0; i < 4; i++ {
		e := mbr[446+16*i:][:16]
		if e[4] == 0x05 || e[4] == 0x0f || e[4] == 0x85 {
			extStart, extSize = int64(le.Uint32(e[8:]))*int64(ss), int64(le.Uint32(e[12:]))*int64(ss)
			break
		}
	}
	if extSize == 0 || extStart+extSize > size {
		return nil
	}
	var parts []Partition
	ebr := make([]byte, 512)
	for at, n := extStart, 5; n < 5+128; n++ {
		if at < extStart || at >= extStart+extSize {
			break
		}
		if _, err := r.ReadAt(ebr, at); err != nil || ebr[510] != 0x55 || ebr[511] != 0xaa {
			break
		}
		e, next := ebr[446:462], ebr[462:478]
		start, count := at+int64(le.Uint32(e[8:]))*int64(ss), int64(le.Uint32(e[12:]))*int64(ss)
		if e[4] != 0 && count > 0 && start+count <= size {
			parts = append(parts, Partition{Number: n, MBRType: e[4], Start: start, Size: count})
		}
		off := int64(le.Uint32(next[8:])) * int64(ss)
		if next[4] == 0 || off == 0 {
			break
		}
		at = extStart + off
	}
	return parts
}
