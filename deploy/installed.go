package deploy

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/better-compute/bcd/protocol"
)

// installed is the written disk's layout: where the root filesystem and the ESP are.
type installed struct {
	t     *target
	table *PartitionTable
	root  *extFS // nil: not found (only an error when something needs it)
	esp   *fatFS
	// rootPart and espPart are the partitions behind root and esp.
	rootPart, espPart Partition
	rootErr, espErr   error
}

// ext superblock fields (offsets within the 1024-byte superblock at byte 1024).
const (
	extMagicOff        = 0x38
	extIncompatOff     = 0x60
	extLabelOff        = 0x78
	extIncompatRecover = 0x4
	extIncompatJDev    = 0x8
)

type extInfo struct {
	label   string
	recover bool
	journal bool // an external journal device, not a filesystem
}

// readExt reads an ext2/3/4 superblock at off, or reports none.
func readExt(t *target, off int64) (extInfo, bool) {
	sb := make([]byte, 1024)
	if _, err := t.ReadAt(sb, off+1024); err != nil {
		return extInfo{}, false
	}
	if binary.LittleEndian.Uint16(sb[extMagicOff:]) != 0xef53 {
		return extInfo{}, false
	}
	inc := binary.LittleEndian.Uint32(sb[extIncompatOff:])
	label := string(bytes.TrimRight(sb[extLabelOff:extLabelOff+16], "\x00"))
	return extInfo{label: label, recover: inc&extIncompatRecover != 0, journal: inc&extIncompatJDev != 0}, true
}

// isFAT tells a FAT boot sector by its signature and filesystem type string.
func isFAT(t *target, off int64) bool {
	bs := make([]byte, 512)
	if _, err := t.ReadAt(bs, off); err != nil {
		return false
	}
	if bs[510] != 0x55 || bs[511] != 0xaa {
		return false
	}
	return bytes.HasPrefix(bs[0x36:], []byte("FAT")) || bytes.HasPrefix(bs[0x52:], []byte("FAT"))
}

// openInstalled re-reads the written disk's partition table (the kernel's, through
// BLKRRPART, and ours from the bytes), moves the backup GPT to the disk's end, and
// finds the root filesystem and the ESP.
//
// The root is, in order: the partition numbered root_partition; the first whose GPT
// type is Linux root (x86-64 or arm64); a Linux filesystem partition named "root"
// or whose ext label is "root"; the ext filesystem holding /etc/os-release. The ESP
// is esp_partition, or the first partition of the ESP type (MBR type 0xef).
// Both are reached at their byte offset in the whole disk, so this works the same on
// an image file and on a kernel without partition support, and shares one page
// cache with the image's write.
func (d *Deployer) openInstalled(ctx context.Context, t *target, imageSize int64, p *Request, tmp string, res *Result) (*installed, error) {
	table, err := ReadPartitionTable(t, imageSize, t.sectorSize)
	if err != nil {
		if len(p.Files) == 0 && p.After.Action != protocol.AfterKexec {
			// Nothing to write into it: an image without a partition table we can
			// read (a bare filesystem, an extended MBR) is the operator's business.
			res.Warnings = append(res.Warnings, fmt.Sprintf("%s: no partition table found in the image: %v", t.path, err))
			return &installed{t: t, rootErr: err, espErr: err}, nil
		}
		return nil, failf(reasonPartitions, "%s: the written image: %v", t.path, err)
	}
	if t.block && t.size > imageSize {
		if err := relocateBackupGPT(t, table, imageSize, t.size); err != nil {
			return nil, failf(reasonPartitions, "%s: %v", t.path, err)
		}
		if err := t.buffered.Sync(); err != nil {
			return nil, failf(reasonWrite, "fsync %s: %v", t.path, err)
		}
	}
	if t.block {
		if err := rereadPartitions(t.direct); err != nil {
			res.Warnings = append(res.Warnings, fmt.Sprintf("%s: re-reading the partition table: %v", t.path, err))
		}
	}
	return findInstalled(ctx, t, table, p.RootPartition, p.ESPPartition, tmp, res)
}

// findInstalled finds the root filesystem and the ESP in a partition table.
func findInstalled(ctx context.Context, t *target, table *PartitionTable, rootPartition, espPartition int, tmp string, res *Result) (*installed, error) {
	in := &installed{t: t, table: table}
	// Root.
	var candidates []Partition
	if rootPartition > 0 {
		part, ok := table.Partition(rootPartition)
		if !ok {
			return nil, failf(reasonPartitions, "root_partition %d: the image has no such partition", rootPartition)
		}
		candidates = []Partition{part}
	} else {
		candidates = rootCandidates(t, table)
	}
	for _, part := range candidates {
		info, ok := readExt(t, part.Start)
		if !ok || info.journal {
			continue
		}
		fs := &extFS{dev: t.path, offset: part.Start}
		if rootPartition == 0 && !isRootType(part.Type) && !isNamedRoot(part, info) {
			// Last resort: an ext filesystem that looks like an OS.
			if ok, _ := fs.exists(ctx, tmp, "/etc/os-release"); !ok {
				continue
			}
		}
		if info.recover {
			in.rootErr = fmt.Errorf("root partition %d needs journal recovery; writing into it without mounting would be undone by the replay", part.Number)
			break
		}
		in.root, in.rootPart = fs, part
		res.Root, res.RootFound, res.PartUUID = part, true, part.PartUUID(table)
		break
	}
	if in.root == nil && in.rootErr == nil {
		if rootPartition > 0 {
			in.rootErr = fmt.Errorf("root_partition %d holds no ext2/3/4 filesystem", rootPartition)
		} else {
			in.rootErr = fmt.Errorf("no root partition: no Linux root type, no Linux filesystem named root, no ext filesystem with /etc/os-release among %s", describeTable(table))
		}
	}
	// ESP.
	var esp *Partition
	if espPartition > 0 {
		part, ok := table.Partition(espPartition)
		if !ok {
			return nil, failf(reasonPartitions, "esp_partition %d: the image has no such partition", espPartition)
		}
		esp = &part
	} else {
		for _, part := range table.Partitions {
			if part.Type == TypeESP || table.Kind == "mbr" && part.MBRType == mbrTypeESP {
				esp = &part
				break
			}
		}
	}
	switch {
	case esp == nil:
		in.espErr = fmt.Errorf("no EFI system partition among %s", describeTable(table))
	case !isFAT(t, esp.Start):
		in.espErr = fmt.Errorf("partition %d holds no FAT filesystem", esp.Number)
	default:
		in.esp, in.espPart = &fatFS{dev: t.path, offset: esp.Start}, *esp
		res.ESP = *esp
	}
	return in, nil
}

func isRootType(g GUID) bool { return g == TypeRootX86_64 || g == TypeRootARM64 }

func isNamedRoot(p Partition, info extInfo) bool {
	return p.Type == TypeLinuxFS && (strings.EqualFold(p.Name, "root") || strings.EqualFold(info.label, "root"))
}

// rootCandidates orders the partitions by how surely each is the root.
func rootCandidates(t *target, table *PartitionTable) []Partition {
	var typed, named, rest []Partition
	for _, p := range table.Partitions {
		info, ok := readExt(t, p.Start)
		switch {
		case isRootType(p.Type):
			typed = append(typed, p)
		case ok && isNamedRoot(p, info):
			named = append(named, p)
		case p.Type == TypeESP || p.Type == TypeBIOSBoot || p.MBRType == mbrTypeESP:
		default:
			rest = append(rest, p)
		}
	}
	return append(append(typed, named...), rest...)
}

func describeTable(t *PartitionTable) string {
	var parts []string
	for _, p := range t.Partitions {
		if t.Kind == "mbr" {
			parts = append(parts, fmt.Sprintf("%d (type %02x)", p.Number, p.MBRType))
		} else {
			parts = append(parts, fmt.Sprintf("%d (type %s, name %q)", p.Number, p.Type, p.Name))
		}
	}
	if len(parts) == 0 {
		return "no partitions"
	}
	return t.Kind + " partitions " + strings.Join(parts, ", ")
}
