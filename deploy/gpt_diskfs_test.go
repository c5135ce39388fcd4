package deploy

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskfs/go-diskfs/partition/gpt"

	"github.com/better-compute/bcd/internal/testenv"
)

// The design names github.com/diskfs/go-diskfs for reading GPTs and moving the
// backup header. These tests hold it against deploy's own gpt.go on the cases a
// deploy meets. Reading agrees everywhere (sgdisk's tables, 4096-byte sectors);
// moving the backup does not: go-diskfs's Write puts the GPT's last LBA into the
// protective MBR's 32-bit size unchecked, so on a disk over 2 TiB (512-byte
// sectors) the size wraps round instead of saturating at 0xffffffff as the UEFI
// specification asks, and firmware and fdisk see a protective partition a
// fraction of the disk's size (TestGoDiskfsRelocateOver2TiB). Deploy therefore
// keeps gpt.go (which also bounds the entry array it allocates, where go-diskfs
// allocates whatever the header's entry count times size says).

// diskfsParts is what go-diskfs reads, in deploy's terms.
func diskfsParts(t *testing.T, path string, ss int) []Partition {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tab, err := gpt.Read(f, ss, ss)
	if err != nil {
		t.Fatalf("go-diskfs gpt.Read %s: %v", path, err)
	}
	var ps []Partition
	for _, p := range tab.Partitions {
		ps = append(ps, Partition{Number: p.Index, Type: MustGUID(strings.ToLower(string(p.Type))), GUID: MustGUID(strings.ToLower(p.GUID)),
			Name: p.Name, Start: int64(p.Start) * int64(ss), Size: int64(p.End-p.Start+1) * int64(ss)})
	}
	return ps
}

func ourParts(t *testing.T, path string, ss int) []Partition {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	pt, err := ReadPartitionTable(f, st.Size(), ss)
	if err != nil {
		t.Fatalf("ReadPartitionTable %s: %v", path, err)
	}
	return pt.Partitions
}

func sameParts(t *testing.T, ours, theirs []Partition) {
	t.Helper()
	if len(ours) != len(theirs) {
		t.Fatalf("%d partitions, go-diskfs reads %d", len(ours), len(theirs))
	}
	for i := range ours {
		if ours[i] != theirs[i] {
			t.Errorf("partition %d: ours %+v, go-diskfs %+v", i, ours[i], theirs[i])
		}
	}
}

// TestGoDiskfsReadsAsWeDo: sgdisk's table with a gap in the numbering, in an image
// shorter than the disk it lands on, and a 4096-byte-sector table.
func TestGoDiskfsReadsAsWeDo(t *testing.T) {
	t.Run("sgdisk", func(t *testing.T) {
		testenv.NeedTool(t, "sgdisk")
		path := filepath.Join(t.TempDir(), "disk.img")
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, 64<<20); err != nil {
			t.Fatal(err)
		}
		run(t, "sgdisk", "-n1:2048:+8M", "-t1:ef00", "-c1:EFI system", "-n3:0:+16M", "-t3:8304", "-c3:root", "-n4:0:0", path)
		sameParts(t, ourParts(t, path, 512), diskfsParts(t, path, 512))
		// The image on a larger disk, its backup GPT not at the disk's end.
		if err := os.Truncate(path, 96<<20); err != nil {
			t.Fatal(err)
		}
		sameParts(t, ourParts(t, path, 512), diskfsParts(t, path, 512))
	})
	t.Run("4Kn", func(t *testing.T) {
		disk := makeGPT(4096, 4096, []gptPart{
			{typ: TypeESP, guid: MustGUID("aaaaaaaa-0000-0000-0000-000000000001"), first: 256, last: 511, name: "esp"},
			{typ: TypeRootX86_64, guid: MustGUID("aaaaaaaa-0000-0000-0000-000000000002"), first: 512, last: 4000, name: "root"},
		})
		path := filepath.Join(t.TempDir(), "4kn.img")
		if err := os.WriteFile(path, disk, 0o600); err != nil {
			t.Fatal(err)
		}
		sameParts(t, ourParts(t, path, 4096), diskfsParts(t, path, 4096))
	})
}

// relocateBoth moves the backup GPT of a copy of image onto a disk of diskSize
// bytes, once with gpt.go and once with go-diskfs (Read, Resize, Write), and
// returns both paths.
func relocateBoth(t *testing.T, image []byte, diskSize int64) (ours, theirs string) {
	t.Helper()
	dir := t.TempDir()
	ours, theirs = filepath.Join(dir, "ours.img"), filepath.Join(dir, "diskfs.img")
	for _, p := range []string{ours, theirs} {
		if err := os.WriteFile(p, image, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, diskSize); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(ours, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	pt, err := ReadPartitionTable(f, int64(len(image)), 512)
	if err == nil {
		err = relocateBackupGPT(f, pt, int64(len(image)), diskSize)
	}
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	g, err := os.OpenFile(theirs, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	tab, err := gpt.Read(g, 512, 512)
	if err != nil {
		t.Fatal(err)
	}
	tab.Resize(uint64(diskSize))
	if err := tab.Write(g, diskSize); err != nil {
		t.Fatal(err)
	}
	return ours, theirs
}

// TestGoDiskfsRelocate: on a disk under 2 TiB both move the backup to the
// disk's end and sgdisk -v finds nothing wrong with either.
func TestGoDiskfsRelocate(t *testing.T) {
	testenv.NeedTool(t, "sgdisk")
	img := makeGPT(512, 32768, []gptPart{{typ: TypeRootX86_64, guid: MustGUID("bbbbbbbb-0000-0000-0000-000000000002"), first: 2048, last: 30000, name: "root"}})
	ours, theirs := relocateBoth(t, img, 64<<20)
	for _, p := range []string{ours, theirs} {
		if out := run(t, "sgdisk", "-v", p); !strings.Contains(out, "No problems found") {
			t.Errorf("sgdisk -v %s:\n%s", filepath.Base(p), out)
		}
	}
	sameParts(t, ourParts(t, ours, 512), diskfsParts(t, theirs, 512))
}

// TestGoDiskfsRelocateOver2TiB is why gpt.go stays: on a 3 TiB disk the
// protective MBR must say 0xffffffff sectors. go-diskfs writes the last LBA
// modulo 2^32; the test asserts that, so it fails (and says so) the day a
// go-diskfs release fixes it and deploy could switch.
func TestGoDiskfsRelocateOver2TiB(t *testing.T) {
	img := makeGPT(512, 32768, []gptPart{{typ: TypeRootX86_64, guid: MustGUID("bbbbbbbb-0000-0000-0000-000000000002"), first: 2048, last: 30000, name: "root"}})
	const disk = 3 << 40 // sparse
	ours, theirs := relocateBoth(t, img, disk)
	lastLBA := uint64(disk/512) - 1
	read := func(path string) uint32 {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b := make([]byte, 512)
		if _, err := f.ReadAt(b, 0); err != nil {
			t.Fatal(err)
		}
		if b[446+4] != 0xee {
			t.Fatalf("%s: first MBR entry type %#x, not protective", path, b[446+4])
		}
		return binary.LittleEndian.Uint32(b[446+12:])
	}
	if got := read(ours); got != 0xffffffff {
		t.Errorf("gpt.go: protective MBR covers %#x sectors, want 0xffffffff", got)
	}
	if got := read(theirs); got != uint32(lastLBA) {
		t.Errorf("go-diskfs: protective MBR covers %#x sectors; it used to write the wrapped %#x: if it now saturates, switch deploy to go-diskfs", got, uint32(lastLBA))
	} else {
		t.Logf("go-diskfs writes %#x sectors into the protective MBR of a %#x-sector disk (wrapped, not 0xffffffff)", got, lastLBA+1)
	}
	if _, err := exec.LookPath("sgdisk"); err == nil {
		out, _ := exec.Command("sgdisk", "-v", theirs).CombinedOutput()
		t.Logf("sgdisk -v on go-diskfs's result:\n%s", out)
	}
	sameParts(t, ourParts(t, ours, 512), diskfsParts(t, theirs, 512))
}
