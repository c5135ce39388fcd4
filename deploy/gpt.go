package deploy

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"unicode/utf16"
)

// GUID is a GPT GUID as stored on disk: the first three fields little-endian.
type GUID [16]byte

// String is the canonical lowercase form, 4f68bce3-e8cd-4db1-96e7-fbcaf984b709.
func (g GUID) String() string {
	var b [16]byte
	b[0], b[1], b[2], b[3] = g[3], g[2], g[1], g[0]
	b[4], b[5] = g[5], g[4]
	b[6], b[7] = g[7], g[6]
	copy(b[8:], g[8:])
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// IsZero reports an unused entry's type.
func (g GUID) IsZero() bool { return g == GUID{} }

// MustGUID parses a canonical GUID string; it is for constants.
func MustGUID(s string) GUID {
	g, err := ParseGUID(s)
	if err != nil {
		panic(err)
	}
	return g
}

// ParseGUID reads the canonical form, in either case.
func ParseGUID(s string) (GUID, error) {
	var g GUID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return g, fmt.Errorf("GUID %q: want xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", s)
	}
	b, err := hex.DecodeString(strings.ReplaceAll(s, "-", ""))
	if err != nil {
		return g, fmt.Errorf("GUID %q: %w", s, err)
	}
	g[0], g[1], g[2], g[3] = b[3], b[2], b[1], b[0]
	g[4], g[5] = b[5], b[4]
	g[6], g[7] = b[7], b[6]
	copy(g[8:], b[8:])
	return g, nil
}

// Partition type GUIDs deploy looks for.
var (
	TypeESP           = MustGUID("c12a7328-f81f-11d2-ba4b-00a0c93ec93b")
	TypeRootX86_64    = MustGUID("4f68bce3-e8cd-4db1-96e7-fbcaf984b709")
	TypeRootARM64     = MustGUID("b921b045-1df0-41c3-af44-4c6f280d3fae")
	TypeLinuxFS       = MustGUID("0fc63daf-8483-4772-8e79-3d69d8477de4")
	TypeBIOSBoot      = MustGUID("21686148-6449-6e6f-744e-656564454649")
	mbrTypeLinux      = byte(0x83)
	mbrTypeESP        = byte(0xef)
	mbrTypeProtective = byte(0xee)
)

// GPTs are read and the backup header moved here rather than through
// github.com/diskfs/go-diskfs (v1.9.4), which the design names: its Write stores
// the last LBA into the protective MBR's 32-bit size without saturating, so on a
// disk over 2 TiB with 512-byte sectors the protective partition covers the
// wrapped remainder, not 0xffffffff sectors as UEFI asks; and its Read allocates
// whatever entry array the header declares. gpt_diskfs_test.go compares both on
// sgdisk's tables, 4096-byte sectors, an image shorter than its disk and a 3 TiB
// disk, and fails when a go-diskfs release no longer wraps.

// PartitionTable is a disk's GPT, or its MBR when it has no GPT.
type PartitionTable struct {
	// Kind is "gpt" or "mbr".
	Kind       string
	SectorSize int
	// DiskGUID is the GPT disk GUID; DiskSignature the MBR's 32-bit signature.
	DiskGUID      GUID
	DiskSignature uint32
	Partitions    []Partition

	hdr     []byte // the primary GPT header sector
	entries []byte // the partition entry array
}

// Partition is one used entry.
type Partition struct {
	// Number is the 1-based index in the table, as in /dev/sda2.
	Number int
	// Type and GUID are GPT's; MBRType the MBR's type byte.
	Type    GUID
	GUID    GUID
	MBRType byte
	Name    string
	// Start and Size are in bytes from the start of the disk.
	Start, Size int64
}

// PartUUID is what root=PARTUUID= names the partition by.
func (p Partition) PartUUID(t *PartitionTable) string {
	if t.Kind == "mbr" {
		return fmt.Sprintf("%08x-%02x", t.DiskSignature, p.Number)
	}
	return p.GUID.String()
}

// Partition returns the partition numbered n.
func (t *PartitionTable) Partition(n int) (Partition, bool) {
	for _, p := range t.Partitions {
		if p.Number == n {
			return p, true
		}
	}
	return Partition{}, false
}

const (
	gptSignature  = "EFI PART"
	gptMinHeader  = 92
	maxGPTEntries = 1 << 20 // bytes of partition entry array read at most
)

var errNoPartitionTable = errors.New("no GPT or MBR partition table")

// ReadPartitionTable reads the primary GPT of a disk of size bytes, or an MBR when
// there is no GPT. sectorSize 0 tries 512 then 4096. Every field that locates
// something is checked against size before it is used, and both GPT CRCs must hold:
// a table that does not verify is not trusted to say where the root is.
func ReadPartitionTable(r io.ReaderAt, size int64, sectorSize int) (*PartitionTable, error) {
	sizes := []int{512, 4096}
	if sectorSize != 0 {
		sizes = []int{sectorSize}
	}
	var gptErr error
	for _, ss := range sizes {
		t, err := readGPT(r, size, ss)
		if err == nil {
			return t, nil
		}
		if !errors.Is(err, errNoPartitionTable) {
			gptErr = err
		}
	}
	if gptErr != nil {
		return nil, gptErr
	}
	return readMBR(r, size, sizes[0])
}

func readGPT(r io.ReaderAt, size int64, ss int) (*PartitionTable, error) {
	return readGPTAt(r, size, ss, 1)
}

// readBackupGPT reads the GPT from its backup header at the disk's last LBA: what
// an old disk whose primary GPT is damaged still says about its partitions.
func readBackupGPT(r io.ReaderAt, size int64, ss int) (*PartitionTable, error) {
	return readGPTAt(r, size, ss, uint64(size/int64(ss))-1)
}

// readGPTAt reads the GPT header at LBA at (1 for the primary) and its entries.
func readGPTAt(r io.ReaderAt, size int64, ss int, at uint64) (*PartitionTable, error) {
	if size < int64(ss)*3 {
		return nil, errNoPartitionTable
	}
	hdr := make([]byte, ss)
	if _, err := r.ReadAt(hdr, int64(at)*int64(ss)); err != nil {
		return nil, fmt.Errorf("read GPT header: %w", err)
	}
	if string(hdr[:8]) != gptSignature {
		return nil, errNoPartitionTable
	}
	le := binary.LittleEndian
	hsize := le.Uint32(hdr[12:])
	if hsize < gptMinHeader || int(hsize) > ss {
		return nil, fmt.Errorf("GPT header size %d is not between %d and the sector size %d", hsize, gptMinHeader, ss)
	}
	if got, want := headerCRC(hdr[:hsize]), le.Uint32(hdr[16:]); got != want {
		return nil, fmt.Errorf("GPT header CRC %08x, the header says %08x", got, want)
	}
	if my := le.Uint64(hdr[24:]); my != at {
		return nil, fmt.Errorf("GPT header says it is at LBA %d, not %d", my, at)
	}
	sectors := uint64(size) / uint64(ss)
	firstUsable, lastUsable := le.Uint64(hdr[40:]), le.Uint64(hdr[48:])
	if firstUsable > lastUsable || lastUsable >= sectors {
		return nil, fmt.Errorf("GPT usable LBAs %d-%d do not fit %d sectors", firstUsable, lastUsable, sectors)
	}
	entryLBA := le.Uint64(hdr[72:])
	n, esize := le.Uint32(hdr[80:]), le.Uint32(hdr[84:])
	if esize < 128 || esize%8 != 0 || esize > 4096 {
		return nil, fmt.Errorf("GPT entry size %d is not a multiple of 8 between 128 and 4096", esize)
	}
	total := uint64(n) * uint64(esize)
	if total == 0 || total > maxGPTEntries {
		return nil, fmt.Errorf("GPT entry array of %d entries of %d bytes is not between 1 byte and 1 MiB", n, esize)
	}
	if entryLBA < 2 || entryLBA >= sectors || (entryLBA <= at && entryLBA*uint64(ss)+total > at*uint64(ss)) || entryLBA*uint64(ss)+total > uint64(size) {
		return nil, fmt.Errorf("GPT entry array at LBA %d does not fit the disk", entryLBA)
	}
	entries := make([]byte, total)
	if _, err := r.ReadAt(entries, int64(entryLBA)*int64(ss)); err != nil {
		return nil, fmt.Errorf("read GPT entries: %w", err)
	}
	if got, want := crc32.ChecksumIEEE(entries), le.Uint32(hdr[88:]); got != want {
		return nil, fmt.Errorf("GPT entry array CRC %08x, the header says %08x", got, want)
	}
	t := &PartitionTable{Kind: "gpt", SectorSize: ss, hdr: hdr, entries: entries}
	copy(t.DiskGUID[:], hdr[56:72])
	for i := uint32(0); i < n; i++ {
		e := entries[uint64(i)*uint64(esize):][:esize]
		var p Partition
		copy(p.Type[:], e[0:16])
		if p.Type.IsZero() {
			continue
		}
		copy(p.GUID[:], e[16:32])
		first, last := le.Uint64(e[32:]), le.Uint64(e[40:])
		if first > last || first < firstUsable || last > lastUsable {
			return nil, fmt.Errorf("GPT partition %d spans LBAs %d-%d, outside the usable %d-%d", i+1, first, last, firstUsable, lastUsable)
		}
		p.Number = int(i) + 1
		p.Start = int64(first) * int64(ss)
		p.Size = int64(last-first+1) * int64(ss)
		p.Name = utf16Name(e[56:128])
		t.Partitions = append(t.Partitions, p)
	}
	return t, nil
}

func headerCRC(h []byte) uint32 {
	c := bytes.Clone(h)
	clear(c[16:20])
	return crc32.ChecksumIEEE(c)
}

func utf16Name(b []byte) string {
	u := make([]uint16, 0, len(b)/2)
	for i := 0; i+1 < len(b); i += 2 {
		v := binary.LittleEndian.Uint16(b[i:])
		if v == 0 {
			break
		}
		u = append(u, v)
	}
	return string(utf16.Decode(u))
}

// readMBR reads the four primary entries; extended partitions are not followed (an
// image's root is a primary partition).
func readMBR(r io.ReaderAt, size int64, ss int) (*PartitionTable, error) {
	if size < 512 {
		return nil, errNoPartitionTable
	}
	s := make([]byte, 512)
	if _, err := r.ReadAt(s, 0); err != nil {
		return nil, fmt.Errorf("read MBR: %w", err)
	}
	if s[510] != 0x55 || s[511] != 0xaa {
		return nil, errNoPartitionTable
	}
	t := &PartitionTable{Kind: "mbr", SectorSize: ss, DiskSignature: binary.LittleEndian.Uint32(s[440:])}
	for i := 0; i < 4; i++ {
		e := s[446+16*i:][:16]
		typ := e[4]
		if typ == 0 {
			continue
		}
		if typ == mbrTypeProtective {
			return nil, errors.New("protective MBR without a valid GPT")
		}
		start, count := int64(binary.LittleEndian.Uint32(e[8:])), int64(binary.LittleEndian.Uint32(e[12:]))
		if count == 0 || (start+count)*int64(ss) > size || start == 0 {
			return nil, fmt.Errorf("MBR partition %d spans sectors %d+%d, outside the disk", i+1, start, count)
		}
		t.Partitions = append(t.Partitions, Partition{Number: i + 1, MBRType: typ, Start: start * int64(ss), Size: count * int64(ss)})
	}
	if len(t.Partitions) == 0 {
		return nil, errNoPartitionTable
	}
	return t, nil
}

// relocateBackupGPT moves the backup GPT from the end of the image to the end of a
// disk that is larger, as sgdisk -e does, so firmware and tools that look for it at
// the disk's last LBA find it there, and widens the last usable LBA to match.
func relocateBackupGPT(f interface {
	io.ReaderAt
	io.WriterAt
}, t *PartitionTable, imageSize, diskSize int64) error {
	if t.Kind != "gpt" {
		return nil
	}
	le := binary.LittleEndian
	ss := int64(t.SectorSize)
	lastLBA := uint64(diskSize/ss) - 1
	oldAlt := le.Uint64(t.hdr[32:])
	entrySectors := (int64(len(t.entries)) + ss - 1) / ss
	backupEntries := lastLBA - uint64(entrySectors)
	if oldAlt == lastLBA {
		return nil
	}
	// Partitions end at or before the old last usable LBA, itself below the new one.
	primary := bytes.Clone(t.hdr)
	hsize := le.Uint32(primary[12:])
	le.PutUint64(primary[32:], lastLBA)
	le.PutUint64(primary[48:], backupEntries-1)
	le.PutUint32(primary[16:], headerCRC(primary[:hsize]))

	backup := bytes.Clone(primary)
	le.PutUint64(backup[24:], lastLBA)
	le.PutUint64(backup[32:], 1)
	le.PutUint64(backup[72:], backupEntries)
	le.PutUint32(backup[16:], headerCRC(backup[:hsize]))

	padded := make([]byte, entrySectors*ss)
	copy(padded, t.entries)
	if _, err := f.WriteAt(padded, int64(backupEntries)*ss); err != nil {
		return fmt.Errorf("write backup GPT entries: %w", err)
	}
	if _, err := f.WriteAt(backup, int64(lastLBA)*ss); err != nil {
		return fmt.Errorf("write backup GPT header: %w", err)
	}
	if _, err := f.WriteAt(primary, ss); err != nil {
		return fmt.Errorf("write primary GPT header: %w", err)
	}
	// The image's own backup header is now stale; a stale GPT header in free space
	// is what recovery tools find and offer to restore.
	if oldAlt > 1 && int64(oldAlt+1)*ss <= imageSize {
		if _, err := f.WriteAt(make([]byte, ss), int64(oldAlt)*ss); err != nil {
			return fmt.Errorf("clear the image's backup GPT header: %w", err)
		}
	}
	// The protective MBR should cover the whole disk (capped at 32 bits).
	mbr := make([]byte, 512)
	if _, err := f.ReadAt(mbr, 0); err == nil && mbr[510] == 0x55 && mbr[511] == 0xaa {
		for i := 0; i < 4; i++ {
			e := mbr[446+16*i:][:16]
			if e[4] == mbrTypeProtective {
				n := min(uint64(lastLBA), 0xffffffff)
				le.PutUint32(e[12:], uint32(n))
				if _, err := f.WriteAt(mbr, 0); err != nil {
					return fmt.Errorf("write protective MBR: %w", err)
				}
				break
			}
		}
	}
	t.hdr = primary
	return nil
}
